//===- Pretrained.cpp - a Hugging Face model directory, checked -----------===//

#include "frontend/Pretrained.h"

#include "mtprt/HfNames.h"
#include "mtprt/Limits.h"
#include "mtprt/Safetensors.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <map>

using namespace mtp;
using llvm::StringRef;

namespace {

llvm::Error fail(const llvm::Twine &what) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), what);
}

std::string join(StringRef dir, StringRef file) {
  llvm::SmallString<256> p(dir);
  llvm::sys::path::append(p, file);
  return std::string(p);
}

/// Whether `text` nests JSON at most `limit` deep: llvm::json::parse
/// recurses once per level, so hostile nesting is refused before it.
bool nestsAtMost(StringRef text, int limit) {
  return mtprt::safetensors::nestingPast(std::string_view(text.data(),
                                                          text.size()),
                                         limit) == std::string_view::npos;
}

llvm::Expected<llvm::json::Value> readJson(const std::string &path,
                                           uint64_t limit, int depth) {
  uint64_t size = 0;
  if (std::error_code ec = llvm::sys::fs::file_size(path, size))
    return fail(path + ": " + ec.message());
  if (size > limit)
    return fail(llvm::formatv("{0}: {1} bytes; not a config of a model "
                              "directory",
                              path, size));
  auto buf = llvm::MemoryBuffer::getFile(path);
  if (!buf)
    return fail(path + ": " + buf.getError().message());
  if (!nestsAtMost((*buf)->getBuffer(), depth))
    return fail(llvm::formatv("{0}: nests deeper than {1} levels; not what a "
                              "model directory holds",
                              path, depth));
  auto json = llvm::json::parse((*buf)->getBuffer());
  if (!json)
    return fail(path + ": not valid JSON: " + llvm::toString(json.takeError()));
  return std::move(*json);
}

/// The integer field `key` of `obj`, in `range`.
llvm::Expected<int64_t> integer(const llvm::json::Object &obj, StringRef key,
                                mtprt::limits::Range range,
                                const std::string &path) {
  const llvm::json::Value *v = obj.get(key);
  if (!v)
    return fail(path + ": no field '" + key + "'");
  std::optional<int64_t> i = v->getAsInteger();
  if (!i || !range.contains(*i))
    return fail(llvm::formatv("{0}: '{1}' must be an integer in [{2}, {3}]",
                              path, key, range.lo, range.hi));
  return *i;
}

/// The dimensions BERT's and Llama's configs name alike.
llvm::Error readDimensions(const llvm::json::Object &obj,
                           const std::string &path, mtprt::ModelConfig &m) {
  namespace limits = mtprt::limits;
  for (auto [key, range, into] :
       {std::tuple<StringRef, limits::Range, int64_t *>{
            "num_hidden_layers", limits::kLayers, &m.layers},
        {"hidden_size", limits::kHidden, &m.hidden},
        {"num_attention_heads", limits::kHeads, &m.heads},
        {"intermediate_size", limits::kFfn, &m.ffn},
        {"vocab_size", limits::kVocab, &m.vocab},
        {"max_position_embeddings", limits::kSeq, &m.positions}}) {
    auto v = integer(obj, key, range, path);
    if (!v)
      return v.takeError();
    *into = *v;
  }
  return llvm::Error::success();
}

/// The norms' epsilon, the dropout and the activation, under the family's
/// keys and defaults.
llvm::Error readNormDropoutAct(const llvm::json::Object &obj,
                               const std::string &path, StringRef epsKey,
                               double eps, StringRef dropoutKey,
                               double dropout, StringRef act, StringRef family,
                               PretrainedConfig &out) {
  namespace limits = mtprt::limits;
  out.model.normEps = obj.getNumber(epsKey).value_or(eps);
  if (!limits::kNormEps.contains(out.model.normEps))
    return fail(path + ": '" + epsKey + "' must be in (0, 0.5]");
  out.dropout = obj.getNumber(dropoutKey).value_or(dropout);
  if (!limits::kDropout.contains(out.dropout))
    return fail(path + ": '" + dropoutKey + "' must be in [0, 1)");
  if (std::optional<StringRef> a = obj.getString("hidden_act"))
    if (*a != act)
      return fail(path + ": hidden_act '" + *a + "' is not supported (" +
                  family + " runs " + act + ")");
  return llvm::Error::success();
}

/// pad_token_id, the token embedding's padding_idx (`none`: -1).
llvm::Error readTokenPad(const llvm::json::Object &obj, const std::string &path,
                         int64_t none, mtprt::ModelConfig &m) {
  m.tokenPad = none;
  if (std::optional<int64_t> pad = obj.getInteger("pad_token_id")) {
    if (*pad < 0 || *pad >= m.vocab)
      return fail(path + ": 'pad_token_id' is not a token id");
    m.tokenPad = *pad;
  }
  return llvm::Error::success();
}

/// BERT's and RoBERTa's config.json.
llvm::Expected<PretrainedConfig> readBert(const llvm::json::Object &obj,
                                          const std::string &path, bool roberta,
                                          PretrainedConfig &out) {
  namespace limits = mtprt::limits;
  mtprt::ModelConfig &m = out.model;
  m.kind = mtprt::BackboneKind::Bert;
  m.pointwise = mtprt::PointwiseKind::Aten;
  if (llvm::Error e = readDimensions(obj, path, m))
    return std::move(e);
  if (m.hidden % m.heads)
    return fail(llvm::formatv("{0}: num_attention_heads = {1} does not "
                              "divide hidden_size = {2}",
                              path, m.heads, m.hidden));
  m.typeVocab = obj.getInteger("type_vocab_size").value_or(2);
  if (m.typeVocab < 1 || m.typeVocab > (1 << 20))
    return fail(path + ": 'type_vocab_size' must be in [1, 1048576]");
  if (llvm::Error e = readNormDropoutAct(obj, path, "layer_norm_eps", 1e-12,
                                         "hidden_dropout_prob", 0.1, "gelu",
                                         "bert", out))
    return std::move(e);
  if (std::optional<StringRef> p = obj.getString("position_embedding_type"))
    if (*p != "absolute")
      return fail(path + ": position_embedding_type '" + *p +
                  "' is not supported (absolute)");
  if (obj.getBoolean("is_decoder").value_or(false))
    return fail(path + ": a decoder BERT (is_decoder) is not supported");
  // BERT's and RoBERTa's word embeddings have padding_idx = pad_token_id
  // (BertConfig's default 0); RoBERTa's positions count from it + 1.
  if (llvm::Error e = readTokenPad(obj, path, roberta ? -1 : 0, m))
    return std::move(e);
  if (roberta) {
    if (m.tokenPad < 0 || m.tokenPad + 1 >= m.positions)
      return fail(path + ": RoBERTa's 'pad_token_id' must be a token id "
                         "below max_position_embeddings - 1");
    m.positionPad = m.tokenPad;
  }
  return std::move(out);
}

/// Llama's config.json (transformers 5's rope_parameters, or 4.x's
/// rope_theta and rope_scaling).
llvm::Expected<PretrainedConfig> readLlama(const llvm::json::Object &obj,
                                           const std::string &path,
                                           PretrainedConfig &out) {
  namespace limits = mtprt::limits;
  mtprt::ModelConfig &m = out.model;
  m.kind = mtprt::BackboneKind::Llama;
  m.pointwise = mtprt::PointwiseKind::Aten;
  m.attention = mtprt::AttentionKind::Fused;
  if (llvm::Error e = readDimensions(obj, path, m))
    return std::move(e);
  m.kvHeads = m.heads;
  if (const llvm::json::Value *v = obj.get("num_key_value_heads");
      v && !v->getAsNull()) {
    auto kv = integer(obj, "num_key_value_heads", limits::kHeads, path);
    if (!kv)
      return kv.takeError();
    m.kvHeads = *kv;
  }
  if (m.hidden % m.heads || m.heads % m.kvHeads)
    return fail(llvm::formatv("{0}: num_attention_heads = {1} must divide "
                              "hidden_size = {2} and be a multiple of "
                              "num_key_value_heads = {3}",
                              path, m.heads, m.hidden, m.kvHeads));
  if (const llvm::json::Value *v = obj.get("head_dim"); v && !v->getAsNull())
    if (v->getAsInteger() != m.hidden / m.heads)
      return fail(path + ": head_dim other than hidden_size / "
                         "num_attention_heads is not supported");
  if ((m.hidden / m.heads) % 2)
    return fail(path + ": rotary positions need an even head size");
  if (llvm::Error e = readNormDropoutAct(obj, path, "rms_norm_eps", 1e-6,
                                         "attention_dropout", 0.0, "silu",
                                         "llama", out))
    return std::move(e);
  m.attentionBias = obj.getBoolean("attention_bias").value_or(false);
  // LlamaModel's embed_tokens has padding_idx = pad_token_id.
  if (llvm::Error e = readTokenPad(obj, path, -1, m))
    return std::move(e);
  m.mlpBias = obj.getBoolean("mlp_bias").value_or(false);
  if (obj.getInteger("pretraining_tp").value_or(1) != 1)
    return fail(path + ": pretraining_tp other than 1 is not supported");

  // Rotary positions: the base and an optional llama3 scaling.
  const llvm::json::Object *rope = obj.getObject("rope_parameters");
  if (!rope)
    rope = obj.getObject("rope_scaling");
  m.ropeTheta = obj.getNumber("rope_theta").value_or(10000.0);
  if (rope)
    m.ropeTheta = rope->getNumber("rope_theta").value_or(m.ropeTheta);
  if (!(m.ropeTheta > 0))
    return fail(path + ": 'rope_theta' must be positive");
  if (rope) {
    std::optional<StringRef> kind = rope->getString("rope_type");
    if (!kind)
      kind = rope->getString("type");
    if (kind && *kind == "llama3") {
      mtprt::RopeScaling &r = m.ropeScaling;
      std::optional<double> factor = rope->getNumber("factor"),
                            low = rope->getNumber("low_freq_factor"),
                            high = rope->getNumber("high_freq_factor");
      std::optional<int64_t> original =
          rope->getInteger("original_max_position_embeddings");
      if (!factor || !low || !high || !original || !(*factor > 0) ||
          !(*low > 0) || !(*high > *low) || *original < 1)
        return fail(path + ": the llama3 rope scaling needs factor > 0, 0 < "
                           "low_freq_factor < high_freq_factor and "
                           "original_max_position_embeddings >= 1");
      r.factor = *factor;
      r.lowFreqFactor = *low;
      r.highFreqFactor = *high;
      r.originalPositions = *original;
    } else if (kind && *kind != "default") {
      return fail(path + ": rope_type '" + *kind +
                  "' is not supported (default, llama3)");
    }
  }
  return std::move(out);
}

} // namespace

llvm::Expected<PretrainedConfig> mtp::readPretrainedConfig(StringRef dir) {
  namespace limits = mtprt::limits;
  if (!llvm::sys::fs::is_directory(dir))
    return fail(dir + ": no such directory (a Hugging Face model directory "
                      "holds config.json and model.safetensors)");
  const std::string path = join(dir, "config.json");
  if (!llvm::sys::fs::exists(path))
    return fail(dir + ": has no config.json; is it a Hugging Face model "
                      "directory (save_pretrained)?");
  auto json = readJson(path, uint64_t(16) << 20, /*depth=*/32);
  if (!json)
    return json.takeError();
  const llvm::json::Object *obj = json->getAsObject();
  if (!obj)
    return fail(path + ": not a JSON object");
  std::optional<StringRef> type = obj->getString("model_type");
  if (!type)
    return fail(path + ": no string field 'model_type'");

  PretrainedConfig out;
  out.modelType = type->str();
  mtprt::ModelConfig &m = out.model;
  if (*type == "llama")
    return readLlama(*obj, path, out);
  if (*type == "bert" || *type == "roberta")
    return readBert(*obj, path, *type == "roberta", out);
  if (*type != "gpt2")
    return fail(path + ": model_type '" + *type +
                "' is not supported yet (supported: gpt2, llama, bert, "
                "roberta)");
  m.kind = mtprt::BackboneKind::Gpt2;
  m.pointwise = mtprt::PointwiseKind::Aten;
  auto take = [&](StringRef key, limits::Range range,
                  int64_t &into) -> llvm::Error {
    auto v = integer(*obj, key, range, path);
    if (!v)
      return v.takeError();
    into = *v;
    return llvm::Error::success();
  };
  if (auto e = take("n_layer", limits::kLayers, m.layers))
    return std::move(e);
  if (auto e = take("n_embd", limits::kHidden, m.hidden))
    return std::move(e);
  if (auto e = take("n_head", limits::kHeads, m.heads))
    return std::move(e);
  if (auto e = take("vocab_size", limits::kVocab, m.vocab))
    return std::move(e);
  if (auto e = take("n_positions", limits::kSeq, m.positions))
    return std::move(e);
  m.ffn = 4 * m.hidden;
  if (const llvm::json::Value *v = obj->get("n_inner"); v && !v->getAsNull())
    if (auto e = take("n_inner", limits::kFfn, m.ffn))
      return std::move(e);
  if (m.hidden % m.heads)
    return fail(llvm::formatv("{0}: n_head = {1} does not divide n_embd = {2}",
                              path, m.heads, m.hidden));
  if (std::optional<double> eps = obj->getNumber("layer_norm_epsilon")) {
    if (!limits::kNormEps.contains(*eps))
      return fail(path + ": 'layer_norm_epsilon' must be in (0, 0.5)");
    m.normEps = *eps;
  }
  if (std::optional<double> p = obj->getNumber("resid_pdrop")) {
    if (!limits::kDropout.contains(*p))
      return fail(path + ": 'resid_pdrop' must be in [0, 1)");
    out.dropout = *p;
  }
  if (std::optional<StringRef> act = obj->getString("activation_function"))
    if (*act != "gelu_new" && *act != "gelu_pytorch_tanh")
      return fail(path + ": activation_function '" + *act +
                  "' is not supported (gpt2 runs gelu_new)");
  for (StringRef flag :
       {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"})
    if (obj->getBoolean(flag).value_or(false))
      return fail(path + ": '" + flag + "' = true is not supported");
  if (!obj->getBoolean("scale_attn_weights").value_or(true))
    return fail(path + ": 'scale_attn_weights' = false is not supported");
  return out;
}

llvm::Error mtp::checkPretrainedWeights(StringRef dir,
                                        const mtprt::ModelConfig &model) {
  // The files: one, or the shards an index names.
  std::vector<std::string> files;
  const std::string single = join(dir, "model.safetensors");
  const std::string index = join(dir, "model.safetensors.index.json");
  if (llvm::sys::fs::exists(single)) {
    files.push_back(single);
  } else if (llvm::sys::fs::exists(index)) {
    auto json = readJson(index, uint64_t(100) << 20, /*depth=*/2);
    if (!json)
      return json.takeError();
    const llvm::json::Object *obj = json->getAsObject();
    const llvm::json::Object *map = obj ? obj->getObject("weight_map") : nullptr;
    if (!map)
      return fail(index + ": no object 'weight_map' (tensor name -> shard)");
    llvm::StringSet<> seen;
    for (const auto &[name, file] : *map) {
      std::optional<StringRef> f = file.getAsString();
      if (!f || f->empty() || f->contains('/') || *f == "." || *f == "..")
        return fail(index + ": weight_map \"" + name.str() +
                    "\" must name a shard file in the directory");
      if (seen.insert(*f).second)
        files.push_back(join(dir, *f));
    }
  } else if (llvm::sys::fs::exists(join(dir, "pytorch_model.bin"))) {
    return fail(dir + ": holds a PyTorch pickle checkpoint "
                      "(pytorch_model.bin), not safetensors; re-save it with "
                      "save_pretrained(dir, safe_serialization=True)");
  } else {
    return fail(dir + ": has no model.safetensors or "
                      "model.safetensors.index.json");
  }

  struct Stored {
    std::vector<int64_t> shape;
    std::string dtype, file;
  };
  std::map<std::string, Stored> stored;
  const std::vector<std::string> prefixes = mtprt::hf::prefixes(model.kind);
  for (const std::string &file : files) {
    uint64_t size = 0;
    if (std::error_code ec = llvm::sys::fs::file_size(file, size))
      return fail(file + ": " + ec.message());
    auto buf = llvm::MemoryBuffer::getFileSlice(
        file, std::min<uint64_t>(size, 8 + (uint64_t(100) << 20)), 0);
    if (!buf)
      return fail(file + ": " + buf.getError().message());
    StringRef bytes = (*buf)->getBuffer();
    if (bytes.size() < 8)
      return fail(file + ": shorter than the 8-byte header length; not a "
                         "safetensors file");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i)
      n = (n << 8) | uint8_t(bytes[i]);
    if (n > (uint64_t(100) << 20) || n > bytes.size() - 8)
      return fail(llvm::formatv("{0}: header length {1} runs past the file's "
                                "{2} bytes; truncated or not safetensors",
                                file, n, size));
    if (!nestsAtMost(bytes.substr(8, n), 3))
      return fail(file + ": the header nests deeper than 3 levels; not a "
                         "safetensors header");
    auto json = llvm::json::parse(bytes.substr(8, n));
    if (!json)
      return fail(file + ": the header is not valid JSON: " +
                  llvm::toString(json.takeError()));
    const llvm::json::Object *obj = json->getAsObject();
    if (!obj)
      return fail(file + ": the header is not a JSON object");
    for (const auto &[key, value] : *obj) {
      if (key == "__metadata__")
        continue;
      const llvm::json::Object *t = value.getAsObject();
      const llvm::json::Array *shape = t ? t->getArray("shape") : nullptr;
      std::optional<StringRef> dtype = t ? t->getString("dtype") : std::nullopt;
      if (!shape || !dtype)
        return fail(file + ": tensor \"" + key.str() +
                    "\" has no 'shape' or 'dtype'");
      if (shape->size() > 8)
        return fail(file + ": tensor \"" + key.str() + "\" has " +
                    std::to_string(shape->size()) +
                    " dimensions (at most 8)");
      Stored s{{}, dtype->str(), file};
      for (const llvm::json::Value &d : *shape) {
        std::optional<int64_t> v = d.getAsInteger();
        if (!v || *v < 0)
          return fail(file + ": tensor \"" + key.str() +
                      "\" has a shape that is not non-negative integers");
        s.shape.push_back(*v);
      }
      // Old BERT checkpoints' LayerNorm gamma / beta, as the runtime reads
      // them.
      std::string name = mtprt::hf::canonical(model.kind, key.str());
      for (const std::string &p : prefixes)
        if (StringRef(name).starts_with(p)) {
          name = name.substr(p.size());
          break;
        }
      stored[name] = std::move(s);
    }
  }

  auto shapeText = [](const std::vector<int64_t> &s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i)
      t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
  };
  std::vector<std::string> missing;
  const std::vector<mtprt::hf::Tensor> wanted = mtprt::hf::tensors(model);
  for (const mtprt::hf::Tensor &t : wanted) {
    auto it = stored.find(t.name);
    if (it == stored.end()) {
      missing.push_back(t.name);
      continue;
    }
    if (it->second.shape != t.shape)
      return fail(it->second.file + ": tensor \"" + t.name + "\" is " +
                  shapeText(it->second.shape) + ", the backbone's is " +
                  shapeText(t.shape));
    StringRef d = it->second.dtype;
    if (d != "F32" && d != "F16" && d != "BF16" && d != "F64")
      return fail(it->second.file + ": tensor \"" + t.name + "\" is " + d +
                  "; a weight must be F32, F16, BF16 or F64");
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 6; ++i)
      list += (i ? ", " : "") + missing[i];
    if (missing.size() > 6)
      list += ", ...";
    return fail(llvm::formatv("{0}: {1} of the backbone's {2} tensors are "
                              "missing: {3}",
                              dir, missing.size(), wanted.size(), list));
  }
  return llvm::Error::success();
}
