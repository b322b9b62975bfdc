//===- Data.cpp - synthetic and JSON Lines multi-task data ----------------===//

#include "mtprt/torch/Data.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <stdexcept>
#include <variant>

namespace mtprt {

namespace {

int64_t targetVocab(const HeadConfig &c, const ModelConfig &m) {
  return c.targetVocab > 0 ? c.targetVocab : m.vocab;
}

//===----------------------------------------------------------------------===//
// Synthetic
//===----------------------------------------------------------------------===//

class Synthetic : public DataSource {
public:
  Synthetic(ModelConfig m, std::vector<HeadConfig> h, uint64_t seed, double r)
      : m_(std::move(m)), h_(std::move(h)), seed_(seed), related_(r) {}

  Batch batch(int64_t pos, int64_t b) override {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
        seed_ * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(pos));
    const int64_t s = m_.seq;
    Batch out;
    out.tokens = at::randint(m_.vocab, {b, s}, gen, at::kLong);
    at::Tensor shared = out.tokens.select(1, 0);
    for (size_t t = 0; t < h_.size(); ++t) {
      const HeadConfig &c = h_[t];
      // Per record: the shared feature with probability `relatedness`.
      at::Tensor useShared = at::rand({b}, gen) < related_;
      at::Tensor own = out.tokens.select(1, (1 + t) % s);
      at::Tensor key = at::where(useShared, shared, own);
      // Token maps: identity when shared, a task-specific permutation-like
      // map (x·(2t+3) + t + 1) otherwise.
      at::Tensor mapped = at::where(useShared.unsqueeze(1), out.tokens,
                                    out.tokens * (2 * int64_t(t) + 3) + t + 1);
      switch (c.kind) {
      case HeadKind::Classify:
        if (c.loss == LossKind::Mse)
          out.labels.push_back(
              at::one_hot(key % c.classes, c.classes).to(at::kFloat));
        else
          out.labels.push_back(key % c.classes);
        break;
      case HeadKind::Tag: {
        // A tag depends on the token and on its left neighbour (context):
        // whether that is in the vocabulary's upper half shifts the tag by
        // one. (A full sum of two tokens mod the tags is learnable too, but
        // not in the few hundred steps a small run takes.)
        at::Tensor left = at::zeros_like(out.tokens);
        left.narrow(1, 1, s - 1)
            .copy_(out.tokens.narrow(1, 0, s - 1) >= (m_.vocab + 1) / 2);
        out.labels.push_back((mapped + left) % c.classes);
        break;
      }
      case HeadKind::Span: {
        at::Tensor start = key % s;
        at::Tensor end =
            at::clamp_max(start + out.tokens.select(1, 1) % 3, s - 1);
        out.labels.push_back(at::stack({start, end}, 1));
        break;
      }
      case HeadKind::Decoder:
        out.labels.push_back(mapped.narrow(1, 0, std::min(c.targetSeq, s)) %
                             targetVocab(c, m_));
        if (c.targetSeq > s)
          throw std::invalid_argument(
              "mtprt: synthetic data: decoder targetSeq exceeds seq");
        break;
      }
    }
    return out;
  }
  int64_t size() const override { return -1; }
  std::string describe() const override {
    return "synthetic (seed " + std::to_string(seed_) + ", relatedness " +
           std::to_string(related_) + ")";
  }

private:
  ModelConfig m_;
  std::vector<HeadConfig> h_;
  uint64_t seed_;
  double related_;
};

//===----------------------------------------------------------------------===//
// A small JSON reader: what JSON Lines records need (objects, arrays,
// numbers, strings without unicode escapes, null, booleans).
//===----------------------------------------------------------------------===//

struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  double num = 0;
  std::string str;
  std::vector<Json> arr;
  std::vector<std::pair<std::string, Json>> obj;
};

class JsonReader {
public:
  explicit JsonReader(const std::string &s) : s_(s) {}
  Json parse() {
    Json v = value();
    ws();
    if (i_ != s_.size())
      error("trailing characters");
    return v;
  }

private:
  [[noreturn]] void error(const std::string &what) {
    throw std::invalid_argument("malformed JSON at column " +
                                std::to_string(i_ + 1) + ": " + what);
  }
  void ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_])))
      ++i_;
  }
  bool eat(char c) {
    ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  std::string string() {
    if (!eat('"'))
      error("expected a string");
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') {
        if (++i_ >= s_.size())
          break;
        const char e = s_[i_];
        out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
      } else {
        out += s_[i_];
      }
      ++i_;
    }
    if (i_ >= s_.size())
      error("unterminated string");
    ++i_;
    return out;
  }
  Json value() {
    ws();
    if (i_ >= s_.size())
      error("unexpected end of line");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Json::Object;
      if (eat('}'))
        return v;
      do {
        std::string k = string();
        if (!eat(':'))
          error("expected ':'");
        v.obj.emplace_back(std::move(k), value());
      } while (eat(','));
      if (!eat('}'))
        error("expected ',' or '}'");
    } else if (c == '[') {
      ++i_;
      v.kind = Json::Array;
      if (eat(']'))
        return v;
      do
        v.arr.push_back(value());
      while (eat(','));
      if (!eat(']'))
        error("expected ',' or ']'");
    } else if (c == '"') {
      v.kind = Json::String;
      v.str = string();
    } else if (s_.compare(i_, 4, "null") == 0) {
      i_ += 4;
    } else if (s_.compare(i_, 4, "true") == 0 ||
               s_.compare(i_, 5, "false") == 0) {
      v.kind = Json::Bool;
      v.num = s_[i_] == 't';
      i_ += s_[i_] == 't' ? 4 : 5;
    } else {
      const char *begin = s_.c_str() + i_;
      char *end = nullptr;
      v.num = std::strtod(begin, &end);
      if (end == begin)
        error("unexpected character '" + std::string(1, c) + "'");
      v.kind = Json::Number;
      i_ += static_cast<size_t>(end - begin);
    }
    return v;
  }
  const std::string &s_;
  size_t i_ = 0;
};

//===----------------------------------------------------------------------===//
// JSON Lines
//===----------------------------------------------------------------------===//

class JsonLines : public DataSource {
public:
  JsonLines(const std::string &path, const ModelConfig &m,
            const std::vector<HeadConfig> &h, bool binary = false)
      : path_(path), m_(m), h_(h) {
    if (binary) {
      readShard();
      return;
    }
    std::ifstream in(path);
    if (!in)
      throw std::runtime_error("mtprt: data file " + path +
                               ": cannot be opened");
    std::string line;
    int64_t lineNo = 0;
    std::vector<int64_t> tokens;
    std::vector<std::vector<float>> labels(h.size());
    present_.assign(h.size(), {});
    while (std::getline(in, line)) {
      ++lineNo;
      if (line.find_first_not_of(" \t\r") == std::string::npos)
        continue; // blank lines are allowed
      record(line, lineNo, tokens, labels);
      ++records_;
    }
    if (records_ == 0)
      throw std::runtime_error("mtprt: data file " + path + ": no records");
    tokens_ = at::tensor(tokens, at::kLong).view({records_, m.seq});
    for (size_t t = 0; t < h.size(); ++t)
      labels_.push_back(at::tensor(labels[t], at::kFloat).view({records_, -1}));
  }

  Batch batch(int64_t pos, int64_t b) override {
    at::Tensor idx = (at::arange(b, at::kLong) + pos * b) % records_;
    Batch out;
    out.tokens = tokens_.index_select(0, idx);
    for (size_t t = 0; t < h_.size(); ++t) {
      bool all = true;
      for (int64_t i = 0; i < b && all; ++i)
        all = present_[t][(pos * b + i) % records_];
      if (!all) {
        out.labels.emplace_back();
        continue;
      }
      at::Tensor l = labels_[t].index_select(0, idx);
      const HeadConfig &c = h_[t];
      if (c.kind == HeadKind::Classify && c.loss == LossKind::Mse)
        out.labels.push_back(l);
      else if (c.kind == HeadKind::Classify)
        out.labels.push_back(l.select(1, 0).to(at::kLong));
      else
        out.labels.push_back(l.to(at::kLong));
    }
    return out;
  }
  int64_t size() const override { return records_; }
  std::string describe() const override {
    return path_ + " (" + std::to_string(records_) + " records)";
  }

  /// The binary shard (docs/runtime-services.md §4): header, then tokens as
  /// int32, then per task a presence byte per record and fp32 labels.
  void writeShard(const std::string &out) const {
    std::ofstream f(out, std::ios::binary | std::ios::trunc);
    if (!f)
      throw std::runtime_error("mtprt: shard " + out + ": cannot be created");
    auto put = [&](const void *p, size_t n) {
      f.write(static_cast<const char *>(p), static_cast<std::streamsize>(n));
    };
    const uint32_t version = 1, tasks = static_cast<uint32_t>(h_.size());
    put(kShardMagic, 8);
    put(&version, 4);
    put(&tasks, 4);
    put(&records_, 8);
    put(&m_.seq, 8);
    for (size_t t = 0; t < h_.size(); ++t) {
      const uint32_t len = static_cast<uint32_t>(h_[t].name.size());
      const int64_t width = labels_[t].size(1);
      put(&len, 4);
      put(h_[t].name.data(), len);
      put(&width, 8);
    }
    at::Tensor tok = tokens_.to(at::kInt).contiguous();
    put(tok.data_ptr(), tok.nbytes());
    for (size_t t = 0; t < h_.size(); ++t) {
      std::vector<uint8_t> present(present_[t].begin(), present_[t].end());
      put(present.data(), present.size());
      at::Tensor l = labels_[t].contiguous();
      put(l.data_ptr(), l.nbytes());
    }
    f.flush();
    if (!f)
      throw std::runtime_error("mtprt: shard " + out + ": write failed");
  }

  static constexpr char kShardMagic[9] = "MTPRTSHD";

private:
  void readShard() {
    std::ifstream f(path_, std::ios::binary);
    if (!f)
      throw std::runtime_error("mtprt: data file " + path_ +
                               ": cannot be opened");
    auto badShard = [&](const std::string &what) {
      throw std::runtime_error("mtprt: data file " + path_ + ": " + what);
    };
    auto get = [&](void *p, size_t n, const std::string &section) {
      f.read(static_cast<char *>(p), static_cast<std::streamsize>(n));
      if (static_cast<size_t>(f.gcount()) != n)
        badShard("truncated in " + section);
    };
    char magic[8];
    uint32_t version = 0, tasks = 0;
    int64_t seq = 0;
    get(magic, 8, "the header");
    if (std::string(magic, 8) != kShardMagic)
      badShard("not an mtprt shard (bad magic)");
    get(&version, 4, "the header");
    if (version != 1)
      badShard("shard version " + std::to_string(version) + " (expected 1)");
    get(&tasks, 4, "the header");
    get(&records_, 8, "the header");
    get(&seq, 8, "the header");
    if (seq != m_.seq)
      badShard("field seq: " + std::to_string(seq) + ", the model has " +
               std::to_string(m_.seq));
    if (records_ <= 0 || records_ > (int64_t(1) << 40))
      badShard("field records: " + std::to_string(records_));
    std::vector<int64_t> order(tasks), widths(tasks);
    for (uint32_t i = 0; i < tasks; ++i) {
      uint32_t len = 0;
      get(&len, 4, "the task table");
      if (len > 4096)
        badShard("task table entry " + std::to_string(i) + ": bad name length");
      std::string name(len, '\0');
      get(name.data(), len, "the task table");
      get(&widths[i], 8, "the task table");
      size_t t = 0;
      while (t < h_.size() && h_[t].name != name)
        ++t;
      if (t == h_.size())
        badShard("task '" + name + "': no task of that name in the program");
      order[i] = static_cast<int64_t>(t);
    }
    at::Tensor tok = at::empty({records_, seq}, at::kInt);
    get(tok.data_ptr(), tok.nbytes(), "the tokens");
    tokens_ = tok.to(at::kLong);
    if (tokens_.lt(0).any().item<bool>() ||
        tokens_.ge(m_.vocab).any().item<bool>()) {
      const int64_t r = (tokens_.lt(0) | tokens_.ge(m_.vocab))
                            .any(1)
                            .nonzero()[0][0]
                            .item<int64_t>();
      throw std::runtime_error(
          "mtprt: data file " + path_ + ", record " + std::to_string(r) +
          ", field tokens: id out of [0, " + std::to_string(m_.vocab) + ")");
    }
    labels_.assign(h_.size(), at::Tensor());
    present_.assign(h_.size(), std::vector<bool>(records_, false));
    for (uint32_t i = 0; i < tasks; ++i) {
      const int64_t t = order[i];
      std::vector<uint8_t> present(records_);
      get(present.data(), present.size(), "task " + h_[t].name);
      at::Tensor l = at::empty({records_, widths[i]}, at::kFloat);
      get(l.data_ptr(), l.nbytes(), "task " + h_[t].name);
      for (int64_t r = 0; r < records_; ++r)
        present_[t][r] = present[r] != 0;
      labels_[t] = l;
    }
    if (f.peek() != std::char_traits<char>::eof())
      badShard("trailing bytes after the last task");
    for (size_t t = 0; t < h_.size(); ++t) {
      const HeadConfig &c = h_[t];
      const int64_t width = c.kind == HeadKind::Classify
                                ? (c.loss == LossKind::Mse ? c.classes : 1)
                            : c.kind == HeadKind::Tag  ? m_.seq
                            : c.kind == HeadKind::Span ? 2
                                                       : c.targetSeq;
      if (!labels_[t].defined()) { // the shard has no labels for this task
        labels_[t] = at::zeros({records_, width}, at::kFloat);
        continue;
      }
      if (labels_[t].size(1) != width)
        badShard("task " + c.name + ": label width " +
                 std::to_string(labels_[t].size(1)) + ", expected " +
                 std::to_string(width));
      if (c.kind == HeadKind::Classify && c.loss == LossKind::Mse)
        continue;
      const int64_t hi = c.kind == HeadKind::Classify || c.kind == HeadKind::Tag
                             ? c.classes
                         : c.kind == HeadKind::Span ? m_.seq
                                                    : targetVocab(c, m_);
      at::Tensor l = labels_[t];
      at::Tensor badRows = (l.lt(0) | l.ge(hi) | l.ne(l.floor())).any(1);
      for (int64_t r = 0; r < records_; ++r)
        if (present_[t][r] && badRows[r].item<bool>())
          throw std::runtime_error("mtprt: data file " + path_ + ", record " +
                                   std::to_string(r) + ", field labels." +
                                   c.name + ": expected integers in [0, " +
                                   std::to_string(hi) + ")");
    }
  }

  [[noreturn]] void bad(int64_t line, const std::string &field,
                        const std::string &what) {
    throw std::runtime_error("mtprt: data file " + path_ + ", record on line " +
                             std::to_string(line) +
                             (field.empty() ? "" : ", field " + field) + ": " +
                             what);
  }

  /// Integers in [0, hi) into `out`, exactly `n` of them.
  void ints(const Json &v, int64_t n, int64_t hi, int64_t line,
            const std::string &field, std::vector<float> *out,
            std::vector<int64_t> *outInt = nullptr) {
    if (v.kind != Json::Array)
      bad(line, field,
          "expected an array of " + std::to_string(n) + " integers");
    if (static_cast<int64_t>(v.arr.size()) != n)
      bad(line, field,
          "has " + std::to_string(v.arr.size()) + " values, expected " +
              std::to_string(n));
    for (size_t i = 0; i < v.arr.size(); ++i) {
      const Json &x = v.arr[i];
      if (x.kind != Json::Number || x.num != std::floor(x.num) || x.num < 0 ||
          x.num >= static_cast<double>(hi))
        bad(line, field + "[" + std::to_string(i) + "]",
            "expected an integer in [0, " + std::to_string(hi) + ")");
      if (out)
        out->push_back(static_cast<float>(x.num));
      if (outInt)
        outInt->push_back(static_cast<int64_t>(x.num));
    }
  }

  void record(const std::string &text, int64_t line,
              std::vector<int64_t> &tokens,
              std::vector<std::vector<float>> &labels) {
    Json r;
    try {
      r = JsonReader(text).parse();
    } catch (const std::invalid_argument &e) {
      bad(line, "", e.what());
    }
    if (r.kind != Json::Object)
      bad(line, "", "a record must be a JSON object");
    const Json *tok = nullptr, *lab = nullptr;
    for (const auto &[k, v] : r.obj) {
      if (k == "tokens")
        tok = &v;
      else if (k == "labels")
        lab = &v;
      else
        bad(line, k, "unknown field (expected tokens, labels)");
    }
    if (!tok)
      bad(line, "tokens", "missing");
    ints(*tok, m_.seq, m_.vocab, line, "tokens", nullptr, &tokens);
    std::vector<const Json *> byTask(h_.size(), nullptr);
    if (lab) {
      if (lab->kind != Json::Object)
        bad(line, "labels", "expected an object (task name -> label)");
      for (const auto &[k, v] : lab->obj) {
        size_t t = 0;
        while (t < h_.size() && h_[t].name != k)
          ++t;
        if (t == h_.size())
          bad(line, "labels." + k, "no task of that name");
        byTask[t] = &v;
      }
    }
    for (size_t t = 0; t < h_.size(); ++t) {
      const HeadConfig &c = h_[t];
      const std::string field = "labels." + c.name;
      const Json *v = byTask[t];
      const bool has = v && v->kind != Json::Null;
      present_[t].push_back(has);
      std::vector<float> &out = labels[t];
      const int64_t width = c.kind == HeadKind::Classify
                                ? (c.loss == LossKind::Mse ? c.classes : 1)
                            : c.kind == HeadKind::Tag  ? m_.seq
                            : c.kind == HeadKind::Span ? 2
                                                       : c.targetSeq;
      if (!has) {
        out.insert(out.end(), width, 0.f);
        continue;
      }
      switch (c.kind) {
      case HeadKind::Classify:
        if (c.loss == LossKind::Mse) {
          if (v->kind != Json::Array ||
              static_cast<int64_t>(v->arr.size()) != c.classes)
            bad(line, field,
                "expected an array of " + std::to_string(c.classes) +
                    " numbers");
          for (const Json &x : v->arr) {
            if (x.kind != Json::Number)
              bad(line, field, "expected numbers");
            out.push_back(static_cast<float>(x.num));
          }
        } else {
          if (v->kind != Json::Number || v->num != std::floor(v->num) ||
              v->num < 0 || v->num >= c.classes)
            bad(line, field,
                "expected a class in [0, " + std::to_string(c.classes) + ")");
          out.push_back(static_cast<float>(v->num));
        }
        break;
      case HeadKind::Tag:
        ints(*v, m_.seq, c.classes, line, field, &out);
        break;
      case HeadKind::Span:
        ints(*v, 2, m_.seq, line, field, &out);
        if (out[out.size() - 2] > out.back())
          bad(line, field, "start is after end");
        break;
      case HeadKind::Decoder:
        ints(*v, c.targetSeq, targetVocab(c, m_), line, field, &out);
        break;
      }
    }
  }

  std::string path_;
  ModelConfig m_;
  std::vector<HeadConfig> h_;
  int64_t records_ = 0;
  at::Tensor tokens_;
  std::vector<at::Tensor> labels_;
  std::vector<std::vector<bool>> present_;
};

} // namespace

std::unique_ptr<DataSource> syntheticData(const ModelConfig &model,
                                          const std::vector<HeadConfig> &heads,
                                          uint64_t seed, double relatedness) {
  if (!(relatedness >= 0 && relatedness <= 1))
    throw std::invalid_argument("mtprt: data relatedness must be in [0, 1]");
  return std::make_unique<Synthetic>(model, heads, seed, relatedness);
}

std::unique_ptr<DataSource>
loadJsonLines(const std::string &path, const ModelConfig &model,
              const std::vector<HeadConfig> &heads) {
  return std::make_unique<JsonLines>(path, model, heads);
}

std::unique_ptr<DataSource> loadShard(const std::string &path,
                                      const ModelConfig &model,
                                      const std::vector<HeadConfig> &heads) {
  return std::make_unique<JsonLines>(path, model, heads, /*binary=*/true);
}

std::unique_ptr<DataSource> loadData(const std::string &path,
                                     const ModelConfig &model,
                                     const std::vector<HeadConfig> &heads) {
  std::ifstream f(path, std::ios::binary);
  char magic[8] = {0};
  f.read(magic, 8);
  return f.gcount() == 8 && std::string(magic, 8) == JsonLines::kShardMagic
             ? loadShard(path, model, heads)
             : loadJsonLines(path, model, heads);
}

void writeShard(const std::string &jsonLines, const std::string &out,
                const ModelConfig &model,
                const std::vector<HeadConfig> &heads) {
  JsonLines(jsonLines, model, heads).writeShard(out);
}

} // namespace mtprt
