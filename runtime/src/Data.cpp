//===- Data.cpp - synthetic and JSON Lines multi-task data ----------------===//

#include "mtprt/torch/Data.h"

#include "mtprt/DataFormat.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <filesystem>
#include <fstream>
#include <stdexcept>

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

  /// Drawn from `first`'s stream (records have no identity here).
  Batch records(int64_t first, int64_t b) override { return batch(first, b); }
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
// Records from a file (JSON Lines or a shard), as tensors
//===----------------------------------------------------------------------===//

/// The records DataFormat.cpp read and checked. They stay in host vectors
/// (outside LibTorch's allocator, so a CPU run's tracked peak — which the
/// plan budgets — is the step's, not the data set's); each batch copies its
/// rows into tensors of its own.
class FileData : public DataSource {
public:
  FileData(const std::string &path, const ModelConfig &m,
           const std::vector<HeadConfig> &h, Records records)
      : path_(path), h_(h), seq_(m.seq), r_(std::move(records)) {
    for (const HeadConfig &c : h)
      widths_.push_back(labelWidth(c, m));
  }

  Batch batch(int64_t pos, int64_t b) override { return records(pos * b, b); }
  Batch records(int64_t first, int64_t b) override {
    std::vector<int64_t> rows(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i)
      rows[i] = (first + i) % r_.count;
    return gather(rows);
  }

  Batch range(int64_t first, int64_t count) override {
    if (first < 0 || count < 1 || first + count > r_.count)
      throw std::out_of_range("mtprt: " + path_ + ": records [" +
                              std::to_string(first) + ", " +
                              std::to_string(first + count) +
                              ") are not in the file's " +
                              std::to_string(r_.count));
    std::vector<int64_t> rows(static_cast<size_t>(count));
    std::iota(rows.begin(), rows.end(), first);
    return gather(rows);
  }

  /// The records `rows`, in that order.
  Batch gather(const std::vector<int64_t> &rows) {
    const int64_t b = static_cast<int64_t>(rows.size()), seq = seq_;
    Batch out;
    out.tokens = at::empty({b, seq}, at::kLong);
    int64_t *tok = out.tokens.data_ptr<int64_t>();
    for (int64_t i = 0; i < b; ++i)
      std::copy_n(r_.tokens.data() + rows[i] * seq, seq, tok + i * seq);
    // Lengths only where a record of this batch is padded: a full batch
    // runs attention without a mask (and its kernels' fastest path).
    bool padded = false;
    for (int64_t i = 0; i < b && !r_.lengths.empty(); ++i)
      padded |= r_.lengths[rows[i]] < seq;
    if (padded) {
      out.lengths = at::empty({b}, at::kLong);
      for (int64_t i = 0; i < b; ++i)
        out.lengths.data_ptr<int64_t>()[i] = r_.lengths[rows[i]];
    }
    if (!r_.types.empty()) {
      out.types = at::empty({b, seq}, at::kLong);
      int64_t *ty = out.types.data_ptr<int64_t>();
      for (int64_t i = 0; i < b; ++i)
        std::copy_n(r_.types.data() + rows[i] * seq, seq, ty + i * seq);
    }
    for (size_t t = 0; t < h_.size(); ++t) {
      // Present when a record of the batch has the task's labels; the
      // others' are not scored (docs/contracts.md#missing-labels).
      bool any = false, all = true;
      for (int64_t i = 0; i < b; ++i) {
        const bool has = r_.present[t][rows[i]] != 0;
        any |= has;
        all &= has;
      }
      out.partial.push_back(any && !all);
      if (!any) {
        out.labels.emplace_back();
        continue;
      }
      const HeadConfig &c = h_[t];
      const bool mse = c.kind == HeadKind::Classify && c.loss == LossKind::Mse;
      const int64_t w = widths_[t];
      const float missing = mse ? std::nanf("") : float(kIgnoreLabel);
      at::Tensor l = at::empty({b, w}, at::kFloat);
      float *dst = l.data_ptr<float>();
      for (int64_t i = 0; i < b; ++i) {
        if (r_.present[t][rows[i]])
          std::copy_n(r_.labels[t].data() + rows[i] * w, w, dst + i * w);
        else
          std::fill_n(dst + i * w, w, missing);
      }
      if (mse)
        out.labels.push_back(l);
      else if (c.kind == HeadKind::Classify)
        out.labels.push_back(l.select(1, 0).to(at::kLong));
      else
        out.labels.push_back(l.to(at::kLong));
    }
    return out;
  }
  int64_t size() const override { return r_.count; }
  std::string describe() const override {
    return path_ + " (" + std::to_string(r_.count) + " records)";
  }
  std::vector<std::vector<std::string>> labelNames() const override {
    return r_.labelNames;
  }
  std::vector<int64_t> labelledRecords() const override {
    std::vector<int64_t> n;
    for (const std::vector<uint8_t> &p : r_.present)
      n.push_back(std::count_if(p.begin(), p.end(),
                                [](uint8_t f) { return f != 0; }));
    return n;
  }

private:
  std::string path_;
  std::vector<HeadConfig> h_;
  int64_t seq_ = 0;
  Records r_;
  std::vector<int64_t> widths_;
};

Records readJsonLinesFile(const std::string &path, const ModelConfig &model,
                          const std::vector<HeadConfig> &heads) {
  // A directory opens as a stream and fails at its first read with the
  // library's wordless "underflow": named here.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw DataError("mtprt: data file " + path +
                    ": is a directory; name a JSON Lines file or a shard "
                    "(mtpc prepare writes one)");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw DataError("mtprt: data file " + path + ": cannot be opened");
  return readJsonLines(in, path, model, heads);
}

} // namespace

std::unique_ptr<DataSource> syntheticData(const ModelConfig &model,
                                          const std::vector<HeadConfig> &heads,
                                          uint64_t seed, double relatedness) {
  if (!(relatedness >= 0 && relatedness <= 1))
    throw std::invalid_argument("mtprt: data relatedness must be in [0, 1]");
  return std::make_unique<Synthetic>(model, heads, seed, relatedness);
}

namespace {
class SyntheticHeldOut : public DataSource {
public:
  SyntheticHeldOut(std::unique_ptr<DataSource> draws, int64_t n)
      : draws_(std::move(draws)), n_(n) {}
  Batch batch(int64_t pos, int64_t b) override { return draws_->batch(pos, b); }
  Batch records(int64_t first, int64_t b) override {
    return draws_->records(first, b);
  }
  /// The same records whatever the evaluation's batch: drawn in fixed
  /// chunks (record r is row r mod kChunk of chunk r / kChunk).
  Batch range(int64_t first, int64_t count) override {
    if (first < 0 || count < 1 || first + count > n_)
      throw std::invalid_argument("mtprt: " + describe() + ": records [" +
                                  std::to_string(first) + ", " +
                                  std::to_string(first + count) +
                                  ") are out of range");
    std::vector<Batch> parts;
    for (int64_t r = first; r < first + count;) {
      const int64_t chunk = r / kChunk, from = r - chunk * kChunk;
      const int64_t to = std::min(kChunk, first + count - chunk * kChunk);
      parts.push_back(draws_->batch(chunk, kChunk).slice(from, to));
      r = chunk * kChunk + to;
    }
    if (parts.size() == 1)
      return parts.front();
    Batch out;
    auto cat = [&](auto field) {
      std::vector<at::Tensor> ts;
      for (const Batch &b : parts)
        ts.push_back(field(b));
      return ts.front().defined() ? at::cat(ts) : at::Tensor();
    };
    out.tokens = cat([](const Batch &b) { return b.tokens; });
    out.lengths = cat([](const Batch &b) { return b.lengths; });
    out.types = cat([](const Batch &b) { return b.types; });
    for (size_t t = 0; t < parts.front().labels.size(); ++t)
      out.labels.push_back(cat([t](const Batch &b) { return b.labels[t]; }));
    out.partial = parts.front().partial;
    return out;
  }
  int64_t size() const override { return n_; }
  std::string describe() const override {
    return "synthetic:" + std::to_string(n_) + " (held out)";
  }

private:
  static constexpr int64_t kChunk = 64;
  std::unique_ptr<DataSource> draws_;
  int64_t n_;
};
} // namespace

std::unique_ptr<DataSource> syntheticHeldOut(const ModelConfig &model,
                                             const std::vector<HeadConfig> &heads,
                                             uint64_t seed, double relatedness,
                                             int64_t records) {
  if (records < 1)
    throw std::invalid_argument("mtprt: synthetic:N needs N >= 1 records");
  // Another stream than training's (whose seeds are seed·φ + position).
  return std::make_unique<SyntheticHeldOut>(
      syntheticData(model, heads, ~seed ^ 0x5EEDE7A1ULL, relatedness), records);
}

std::unique_ptr<DataSource>
loadJsonLines(const std::string &path, const ModelConfig &model,
              const std::vector<HeadConfig> &heads) {
  return std::make_unique<FileData>(path, model, heads,
                                    readJsonLinesFile(path, model, heads));
}

std::unique_ptr<DataSource> loadShard(const std::string &path,
                                      const ModelConfig &model,
                                      const std::vector<HeadConfig> &heads) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in)
    throw DataError("mtprt: data file " + path + ": cannot be opened");
  const std::streamoff size = in.tellg();
  in.seekg(0);
  if (size < 0 || !in)
    throw DataError("mtprt: data file " + path + ": cannot be read");
  return std::make_unique<FileData>(
      path, model, heads,
      readShard(in, static_cast<uint64_t>(size), path, model, heads));
}

std::unique_ptr<DataSource> loadData(const std::string &path,
                                     const ModelConfig &model,
                                     const std::vector<HeadConfig> &heads) {
  std::ifstream f(path, std::ios::binary);
  char magic[8] = {0};
  f.read(magic, 8);
  return f.gcount() == 8 && std::string(magic, 8) == kShardMagic
             ? loadShard(path, model, heads)
             : loadJsonLines(path, model, heads);
}

void writeShard(const std::string &jsonLines, const std::string &out,
                const ModelConfig &model,
                const std::vector<HeadConfig> &heads) {
  {
    // Already a shard: say so, not that its first byte is bad JSON.
    std::ifstream f(jsonLines, std::ios::binary);
    char magic[8] = {0};
    f.read(magic, 8);
    if (f.gcount() == 8 && std::string(magic, 8) == kShardMagic)
      throw DataError("mtprt: --write-shard: " + jsonLines +
                      " is a shard already; --data takes it as it is");
  }
  const Records records = readJsonLinesFile(jsonLines, model, heads);
  std::ofstream f(out, std::ios::binary | std::ios::trunc);
  if (!f)
    throw DataError("mtprt: shard " + out + ": cannot be created");
  writeShard(f, records, out, model, heads);
}

} // namespace mtprt
