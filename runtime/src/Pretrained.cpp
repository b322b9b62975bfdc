//===- Pretrained.cpp - Hugging Face weights in, trained weights out ------===//
//
// The header is checked by mtprt/Safetensors.h before anything is mapped;
// the data is memory-mapped read-only and each tensor converted into its
// parameter in place (no copy of the whole file).
//
//===----------------------------------------------------------------------===//

#include "mtprt/torch/Pretrained.h"

#include "mtprt/Errors.h"
#include "mtprt/HfNames.h"
#include "mtprt/Safetensors.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <optional>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace mtprt {

namespace st = safetensors;

namespace {

[[noreturn]] void fail(const std::string &path, const std::string &what) {
  throw PretrainedError("mtprt: pretrained " + path + ": " + what);
}

bool exists(const std::string &path) {
  struct stat s{};
  return ::stat(path.c_str(), &s) == 0 && S_ISREG(s.st_mode);
}

std::string shapeText(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

at::ScalarType scalarType(st::Dtype d) {
  switch (d) {
  case st::Dtype::F64: return at::kDouble;
  case st::Dtype::F32: return at::kFloat;
  case st::Dtype::F16: return at::kHalf;
  case st::Dtype::BF16: return at::kBFloat16;
  case st::Dtype::I64: return at::kLong;
  case st::Dtype::I32: return at::kInt;
  case st::Dtype::I16: return at::kShort;
  case st::Dtype::I8: return at::kChar;
  case st::Dtype::U8: return at::kByte;
  case st::Dtype::Bool: return at::kBool;
  }
  return at::kFloat;
}

std::optional<st::Dtype> dtypeOf(at::ScalarType t) {
  switch (t) {
  case at::kDouble: return st::Dtype::F64;
  case at::kFloat: return st::Dtype::F32;
  case at::kHalf: return st::Dtype::F16;
  case at::kBFloat16: return st::Dtype::BF16;
  case at::kLong: return st::Dtype::I64;
  case at::kInt: return st::Dtype::I32;
  case at::kShort: return st::Dtype::I16;
  case at::kChar: return st::Dtype::I8;
  case at::kByte: return st::Dtype::U8;
  case at::kBool: return st::Dtype::Bool;
  default: return std::nullopt;
  }
}

/// Reads mapped bytes as a stream, without a copy.
struct MemoryBuffer : std::streambuf {
  MemoryBuffer(const char *p, size_t n) {
    char *b = const_cast<char *>(p);
    setg(b, b, b + n);
  }
};

/// One safetensors file, mapped, its header read from the mapping (so the
/// header and the data are the same file's) and checked.
class Mapped {
public:
  explicit Mapped(const std::string &path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      fail(path, "cannot open (" + std::string(std::strerror(errno)) + ")");
    try {
      struct stat s{};
      if (::fstat(fd_, &s) != 0 || !S_ISREG(s.st_mode))
        fail(path, "not a regular file");
      size_ = static_cast<uint64_t>(s.st_size);
      if (size_ > 0) {
        void *p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
        if (p == MAP_FAILED)
          fail(path, "cannot map (" + std::string(std::strerror(errno)) + ")");
        data_ = static_cast<const char *>(p);
      }
      MemoryBuffer buffer(data_ ? data_ : "", size_);
      std::istream in(&buffer);
      header_ = st::readHeader(in, size_, path);
    } catch (...) {
      release();
      throw;
    }
  }
  ~Mapped() { release(); }
  Mapped(const Mapped &) = delete;
  Mapped &operator=(const Mapped &) = delete;

  const st::Header &header() const { return header_; }
  const std::string &path() const { return path_; }

  /// The entry's data as a CPU tensor of its stored dtype (a copy where the
  /// data is not aligned to its element size; otherwise a view of the map,
  /// valid while this lives).
  at::Tensor view(const st::Entry &e) const {
    const char *p = data_ + header_.dataStart + e.begin;
    const at::ScalarType t = scalarType(e.dtype);
    auto options = at::TensorOptions().dtype(t);
    if (reinterpret_cast<uintptr_t>(p) % st::elementBytes(e.dtype) == 0)
      return at::from_blob(const_cast<char *>(p), e.shape, options);
    at::Tensor out = at::empty(e.shape, options);
    std::memcpy(out.data_ptr(), p, e.end - e.begin);
    return out;
  }

private:
  void release() {
    if (data_)
      ::munmap(const_cast<char *>(data_), size_);
    data_ = nullptr;
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = -1;
  }

  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  const char *data_ = nullptr;
  st::Header header_;
};

/// The safetensors files of a model directory.
std::vector<std::string> modelFiles(const std::string &dir) {
  const std::string single = dir + "/model.safetensors";
  if (exists(single))
    return {single};
  const std::string index = dir + "/model.safetensors.index.json";
  if (!exists(index)) {
    if (exists(dir + "/pytorch_model.bin") ||
        exists(dir + "/pytorch_model.bin.index.json"))
      fail(dir, "holds a PyTorch pickle checkpoint (pytorch_model.bin), not "
                "safetensors; re-save it with "
                "model.save_pretrained(dir, safe_serialization=True)");
    fail(dir, "has no model.safetensors or model.safetensors.index.json; "
              "point the backbone at a Hugging Face model directory");
  }
  std::ifstream in(index, std::ios::binary);
  if (!in)
    fail(index, "cannot open");
  std::vector<std::string> files;
  for (const auto &[tensor, file] : st::readIndex(in, index)) {
    const std::string path = dir + "/" + file;
    if (std::find(files.begin(), files.end(), path) == files.end()) {
      if (!exists(path))
        fail(index, "names shard \"" + file + "\" for tensor \"" + tensor +
                        "\", which is not in " + dir);
      files.push_back(path);
    }
  }
  if (files.empty())
    fail(index, "the weight_map names no tensors");
  return files;
}

std::string list(const std::vector<std::string> &names, size_t most = 8) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < most; ++i)
    s += (i ? ", " : "") + names[i];
  if (names.size() > most)
    s += ", ... (" + std::to_string(names.size()) + " in all)";
  return s;
}

void renameInto(const std::string &tmp, const std::string &path) {
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error("mtprt: cannot write " + path + " (" +
                             std::strerror(errno) + ")");
  }
}

} // namespace

PretrainedLoad loadPretrained(Model &model, const std::string &dir) {
  const ModelConfig &c = model.config();
  if (c.kind == BackboneKind::Transformer)
    fail(dir, "mtpc's own transformer has no Hugging Face names; declare the "
              "backbone as the checkpoint's family (backbone pretrained(\"" +
                  dir + "\"))");
  std::map<std::string, at::Tensor> params;
  for (const auto &[name, t] : model.namedParameters())
    params.emplace(name, t);
  std::map<std::string, const hf::Tensor *> expected;
  const std::vector<hf::Tensor> wanted = hf::tensors(c);
  for (const hf::Tensor &t : wanted)
    expected.emplace(t.name, &t);
  const std::vector<std::string> prefixes = hf::prefixes(c.kind);

  PretrainedLoad out;
  out.files = modelFiles(dir);
  std::map<std::string, std::string> filled; // HF name -> file
  at::NoGradGuard noGrad;
  for (const std::string &file : out.files) {
    Mapped m(file);
    for (const st::Entry &e : m.header().tensors) {
      std::string name = hf::canonical(c.kind, e.name);
      for (const std::string &p : prefixes)
        if (name.rfind(p, 0) == 0) {
          name = name.substr(p.size());
          break;
        }
      auto it = expected.find(name);
      if (it == expected.end()) {
        if (!hf::ignored(c.kind, name))
          out.unexpected.push_back(e.name);
        continue;
      }
      const hf::Tensor &want = *it->second;
      if (!filled.emplace(name, file).second)
        fail(file, "tensor \"" + e.name + "\" is also in " + filled[name]);
      if (at::IntArrayRef(e.shape) != at::IntArrayRef(want.shape))
        fail(file, "tensor \"" + e.name + "\" is " + shapeText(e.shape) +
                       ", the backbone's is " + shapeText(want.shape) +
                       " (does the spec override a dimension the checkpoint "
                       "fixes?)");
      if (e.dtype != st::Dtype::F32 && e.dtype != st::Dtype::F16 &&
          e.dtype != st::Dtype::BF16 && e.dtype != st::Dtype::F64)
        fail(file, "tensor \"" + e.name + "\" is " + st::name(e.dtype) +
                       "; a weight must be F32, F16, BF16 or F64");
      at::Tensor src = m.view(e).to(at::kFloat);
      if (want.transposed)
        src = src.t();
      at::Tensor dst = params.at(want.param);
      if (want.rowOffset >= 0)
        dst = dst.narrow(0, want.rowOffset, want.shape[0]);
      dst.copy_(src);
      ++out.tensors;
    }
  }
  std::vector<std::string> missing;
  for (const hf::Tensor &t : wanted)
    if (!filled.count(t.name))
      missing.push_back(t.name);
  if (!missing.empty())
    fail(dir, std::to_string(missing.size()) + " of the backbone's " +
                  std::to_string(wanted.size()) + " tensors are missing: " +
                  list(missing) + " (is it a " + hf::modelType(c.kind) +
                  " checkpoint with " + std::to_string(c.layers) +
                  " layers?)");
  return out;
}

std::vector<std::pair<std::string, at::Tensor>>
readSafetensors(const std::string &path) {
  Mapped m(path);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const st::Entry &e : m.header().tensors)
    out.emplace_back(e.name, m.view(e).clone());
  return out;
}

void writeSafetensors(
    const std::string &path,
    const std::vector<std::pair<std::string, at::Tensor>> &tensors,
    const std::vector<std::pair<std::string, std::string>> &metadata) {
  std::vector<st::Entry> entries;
  std::vector<at::Tensor> data;
  std::set<std::string> names;
  for (const auto &[name, t] : tensors) {
    // A name twice would make a header of one entry over two tensors' data.
    if (!names.insert(name).second)
      throw std::invalid_argument("mtprt: safetensors " + path + ": tensor \"" +
                                  name + "\" is given twice");
    const std::optional<st::Dtype> d = dtypeOf(t.scalar_type());
    if (!d)
      throw std::invalid_argument("mtprt: safetensors " + path + ": tensor \"" +
                                  name + "\" has an unsupported dtype");
    st::Entry e;
    e.name = name;
    e.dtype = *d;
    e.shape = t.sizes().vec();
    entries.push_back(std::move(e));
    data.push_back(t.detach().cpu().contiguous());
  }
  const std::string header = st::writeHeader(entries, metadata);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const at::Tensor &t : data)
      f.write(static_cast<const char *>(t.data_ptr()),
              static_cast<std::streamsize>(t.nbytes()));
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      throw std::runtime_error("mtprt: cannot write " + path);
    }
  }
  renameInto(tmp, path);
}

void writeHiddenStates(Model &model, const Batch &batch,
                       const std::string &path) {
  const at::Tensor &tokens = batch.tokens;
  const bool training = model.training();
  model.setTraining(false);
  model.setInputs(batch.lengths, batch.types);
  std::vector<at::Tensor> hidden;
  at::Tensor x = tokens.to(model.device());
  for (int64_t u = 0; u < model.numUnits(); ++u) {
    x = model.unit(u, x);
    if (u % 2 == 0)
      hidden.push_back(x);
  }
  model.setTraining(training);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.emplace_back("tokens", tokens.to(at::kCPU, at::kLong));
  // Hugging Face's attention_mask and token_type_ids, where the batch has
  // them.
  if (batch.lengths.defined())
    out.emplace_back("attention_mask",
                     (at::arange(tokens.size(1), at::kLong).unsqueeze(0) <
                      batch.lengths.to(at::kCPU, at::kLong).unsqueeze(1))
                         .to(at::kLong));
  if (batch.types.defined())
    out.emplace_back("token_type_ids", batch.types.to(at::kCPU, at::kLong));
  at::Tensor objective = at::zeros({}, hidden[0].options());
  for (size_t l = 0; l < hidden.size(); ++l) {
    at::Tensor probe = at::empty(hidden[l].sizes(), at::kFloat);
    probe.normal_(0.0, 1.0, gen);
    objective = objective + (hidden[l] * probe.to(hidden[l].device())).sum();
    out.emplace_back("hidden." + std::to_string(l),
                     hidden[l].detach().to(at::kCPU, at::kFloat));
    out.emplace_back("probe." + std::to_string(l), probe);
  }
  const std::vector<at::Tensor> params = model.backboneParameters();
  const std::vector<at::Tensor> grads =
      torch::autograd::grad({objective}, params);
  std::map<std::string, at::Tensor> byParam;
  size_t i = 0;
  for (const auto &[name, t] : model.namedParameters())
    if (i < params.size() && t.is_same(params[i]))
      byParam.emplace(name, grads[i++].to(at::kCPU, at::kFloat));
  const std::vector<hf::Tensor> names = hf::tensors(model.config());
  if (names.empty())
    for (const auto &[name, g] : byParam)
      out.emplace_back("grad." + name, g);
  for (const hf::Tensor &t : names) {
    at::Tensor g = byParam.at(t.param);
    if (t.rowOffset >= 0)
      g = g.narrow(0, t.rowOffset, t.shape[0]).contiguous();
    out.emplace_back("grad." + t.name, t.transposed ? g.t().contiguous() : g);
  }
  model.setInputs({}, {});
  writeSafetensors(path, out);
}

void exportPretrained(const Model &model, const std::string &dir,
                      const std::string &source,
                      const std::map<std::string, at::Tensor> *values) {
  const ModelConfig &c = model.config();
  if (c.kind == BackboneKind::Transformer)
    throw std::invalid_argument(
        "mtprt: --export: mtpc's own transformer has no Hugging Face "
        "architecture to export to; declare a gpt2, llama or bert backbone "
        "(or a "
        "pretrained one) to export");
  if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
    throw std::runtime_error("mtprt: --export: cannot create " + dir + " (" +
                             std::strerror(errno) + ")");
  std::map<std::string, at::Tensor> params;
  for (const auto &[name, t] : model.namedParameters())
    params.emplace(name, values ? values->at(name) : t);

  std::vector<std::pair<std::string, at::Tensor>> backbone;
  const std::vector<hf::Tensor> names = hf::tensors(c);
  for (const hf::Tensor &t : names) {
    at::Tensor p = params.at(t.param).detach().to(at::kCPU, at::kFloat);
    if (t.rowOffset >= 0)
      p = p.narrow(0, t.rowOffset, t.shape[0]).contiguous();
    backbone.emplace_back(t.name, t.transposed ? p.t().contiguous() : p);
  }
  // The source's own tensors of the base model that mtprt has no parameter
  // for (BERT's pooler) go out as they came in: nothing is lost.
  // Best effort: the source may have moved during a long run, and the
  // trained weights must be written whatever happened to it.
  if (!source.empty()) try {
    std::set<std::string> ours;
    for (const hf::Tensor &t : names)
      ours.insert(t.name);
    const std::vector<std::string> prefixes = hf::prefixes(c.kind);
    std::vector<std::unique_ptr<Mapped>> files;
    for (const std::string &file : modelFiles(source))
      files.push_back(std::make_unique<Mapped>(file));
    // A task model's checkpoint prefixes its base model's names; what has
    // no prefix there (cls.*, lm_head.*) is not the base model's.
    bool prefixed = false;
    for (const auto &m : files)
      for (const st::Entry &e : m->header().tensors)
        for (const std::string &p : prefixes)
          prefixed |= e.name.rfind(p, 0) == 0;
    std::set<std::string> carried;
    for (const auto &mp : files) {
      const Mapped &m = *mp;
      for (const st::Entry &e : m.header().tensors) {
        std::string name = hf::canonical(c.kind, e.name);
        bool base = !prefixed;
        for (const std::string &p : prefixes)
          if (name.rfind(p, 0) == 0) {
            name = name.substr(p.size());
            base = true;
            break;
          }
        if (base && !ours.count(name) && !hf::ignored(c.kind, name) &&
            carried.insert(name).second)
          backbone.emplace_back(name, m.view(e).clone());
      }
    }
  } catch (const PretrainedError &e) {
    std::fprintf(stderr,
                 "mtprt: --export: the source's other tensors are not carried "
                 "through (%s); the trained backbone is written\n",
                 e.what());
  }
  writeSafetensors(dir + "/model.safetensors", backbone, {{"format", "pt"}});

  nlohmann::ordered_json heads = nlohmann::ordered_json::array();
  for (int64_t i = 0; i < model.numHeads(); ++i) {
    const HeadConfig &h = model.heads()[size_t(i)];
    heads.push_back({{"name", h.name},
                     {"kind", static_cast<int>(h.kind)},
                     {"tap", h.tap},
                     {"classes", h.classes}});
    // D13: whose adapter the head reads (npd(share): a member's tensors
    // are its group's first head's, written once under that head's name).
    if (const std::optional<AdapterConfig> &ad = model.config().adapters)
      heads.back()["adapter"] = model.heads()[size_t(ad->ownerOf(i))].name;
  }
  std::vector<std::pair<std::string, at::Tensor>> headTensors;
  for (int64_t h = 0; h < model.numHeads(); ++h)
    for (const auto &[name, t] : model.namedParameters())
      if (name.rfind("head." + model.heads()[h].name + ".", 0) == 0)
        headTensors.emplace_back(
            name, params.at(name).detach().to(at::kCPU, at::kFloat));
  writeSafetensors(dir + "/heads.safetensors", headTensors,
                   {{"format", "mtprt-heads"}, {"heads", heads.dump()}});

  // The family's config: the source's (tokenizer ids and the like kept),
  // this model's dimensions over it.
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (!source.empty() && exists(source + "/config.json")) {
    std::ifstream in(source + "/config.json");
    config = nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/
                                           false);
    if (!config.is_object()) {
      std::fprintf(stderr,
                   "mtprt: --export: %s/config.json is not a JSON object "
                   "any more; writing the family's config without its "
                   "other fields\n",
                   source.c_str());
      config = nlohmann::ordered_json::object();
    }
  }
  config["model_type"] = hf::modelType(c.kind);
  if (c.kind == BackboneKind::Gpt2) {
    config["architectures"] = {"GPT2Model"};
    config["vocab_size"] = c.vocab;
    config["n_positions"] = c.positionRows();
    config["n_embd"] = c.hidden;
    config["n_layer"] = c.layers;
    config["n_head"] = c.heads;
    config["n_inner"] = c.ffn;
    config["activation_function"] = "gelu_new";
    config["layer_norm_epsilon"] = c.normEps;
    if (!config.contains("resid_pdrop")) {
      config["resid_pdrop"] = c.dropout;
      config["embd_pdrop"] = c.dropout;
      config["attn_pdrop"] = c.dropout;
    }
  }
  if (c.kind == BackboneKind::Bert) {
    const bool roberta = c.positionPad >= 0;
    config["model_type"] = roberta ? "roberta" : "bert";
    config["architectures"] = {roberta ? "RobertaModel" : "BertModel"};
    config["vocab_size"] = c.vocab;
    config["hidden_size"] = c.hidden;
    config["num_hidden_layers"] = c.layers;
    config["num_attention_heads"] = c.heads;
    config["intermediate_size"] = c.ffn;
    config["hidden_act"] = "gelu";
    config["max_position_embeddings"] = c.positionRows();
    config["type_vocab_size"] = std::max<int64_t>(1, c.typeVocab);
    config["layer_norm_eps"] = c.normEps;
    if (roberta)
      config["pad_token_id"] = c.positionPad;
    if (!config.contains("hidden_dropout_prob")) {
      config["hidden_dropout_prob"] = c.dropout;
      config["attention_probs_dropout_prob"] = c.dropout;
    }
  }
  if (c.kind == BackboneKind::Llama) {
    config["architectures"] = {"LlamaModel"};
    config["vocab_size"] = c.vocab;
    config["hidden_size"] = c.hidden;
    config["intermediate_size"] = c.ffn;
    config["num_hidden_layers"] = c.layers;
    config["num_attention_heads"] = c.heads;
    config["num_key_value_heads"] = c.kvHeadCount();
    config["head_dim"] = c.hidden / c.heads;
    config["max_position_embeddings"] = c.positionRows();
    config["rms_norm_eps"] = c.normEps;
    config["hidden_act"] = "silu";
    config["attention_bias"] = c.attentionBias;
    config["mlp_bias"] = c.mlpBias;
    nlohmann::ordered_json rope = {{"rope_theta", c.ropeTheta},
                                   {"rope_type", "default"}};
    if (c.ropeScaling.factor > 0)
      rope = {{"rope_theta", c.ropeTheta},
              {"rope_type", "llama3"},
              {"factor", c.ropeScaling.factor},
              {"low_freq_factor", c.ropeScaling.lowFreqFactor},
              {"high_freq_factor", c.ropeScaling.highFreqFactor},
              {"original_max_position_embeddings",
               c.ropeScaling.originalPositions}};
    // transformers 5 reads rope_parameters; 4.x read rope_theta and
    // rope_scaling.
    config["rope_parameters"] = rope;
    config["rope_theta"] = c.ropeTheta;
    config.erase("rope_scaling");
    if (c.ropeScaling.factor > 0)
      config["rope_scaling"] = rope;
  }
  const std::string path = dir + "/config.json";
  {
    std::ofstream f(path + ".tmp", std::ios::trunc);
    f << config.dump(2) << "\n";
    if (!f) {
      std::remove((path + ".tmp").c_str());
      throw std::runtime_error("mtprt: --export: cannot write " + path);
    }
  }
  renameInto(path + ".tmp", path);
}

} // namespace mtprt
