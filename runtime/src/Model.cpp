//===- Model.cpp - the multi-task transformer, one entry per unit ---------===//
//
// Functional ATen ops over plain parameter tensors. Choices that fix what is
// saved for backward (docs/runtime.md lists the bytes):
//  - dropout is at::native_dropout on every device, so the saved mask is one
//    byte per element (the CPU composite `dropout` would save a float noise
//    tensor instead);
//  - attention is one scaled_dot_product_attention kernel where a fused
//    kernel takes the dropout (it keeps q, k, v, its output and the
//    log-sum-exp); the math path, for dropout on the CPU, scales q before
//    the score matmul, so the unscaled scores are never a second S×S tensor;
//  - classify pools the first token before its norm, so nothing of size
//    B×S×H is saved by that head;
//  - with fused pointwise kernels a linear after a norm or a GELU keeps
//    nothing: the norm keeps its input and statistics, the GELU its input,
//    and backward recomputes their outputs (mtprt/torch/Fused.h).
//
//===----------------------------------------------------------------------===//

#include "mtprt/torch/Model.h"
#include "mtprt/DataFormat.h"
#include "mtprt/torch/Pretrained.h"

#include "mtprt/torch/Fused.h"
#include "mtprt/torch/Regions.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>

#include <cmath>
#include <set>
#include <optional>
#include <stdexcept>

namespace mtprt {

const char *toString(GradScope scope) {
  switch (scope) {
  case GradScope::Sum:
    return "sum";
  case GradScope::Features:
    return "features";
  case GradScope::Params:
    return "params";
  }
  return "?";
}

Batch Batch::slice(int64_t begin, int64_t end) const {
  Batch b;
  auto rows = [&](const at::Tensor &t) {
    return t.defined() ? t.narrow(0, begin, end - begin) : t;
  };
  b.tokens = rows(tokens);
  b.lengths = rows(lengths);
  b.types = rows(types);
  for (const at::Tensor &l : labels)
    b.labels.push_back(rows(l));
  b.partial = partial;
  return b;
}

Batch Batch::to(const at::Device &device) const {
  Batch b;
  auto moved = [&](const at::Tensor &t) {
    return t.defined() ? t.to(device) : t;
  };
  b.tokens = tokens.to(device);
  b.lengths = moved(lengths);
  b.types = moved(types);
  for (const at::Tensor &l : labels)
    b.labels.push_back(moved(l));
  b.partial = partial;
  return b;
}

namespace {

[[noreturn]] void bad(const std::string &field, const std::string &why) {
  throw std::invalid_argument("mtprt: " + field + ": " + why);
}

void requirePositive(const std::string &field, int64_t v) {
  if (v <= 0)
    bad(field, "must be positive, got " + std::to_string(v));
}

at::Device parseDevice(const std::string &s) {
  if (s == "cpu")
    return at::Device(at::kCPU);
  if (s.rfind("cuda", 0) == 0) {
    try {
      return at::Device(s);
    } catch (const std::exception &) {
    }
  }
  bad("ModelConfig.device",
      "expected \"cpu\" or \"cuda[:N]\", got \"" + s + "\"");
}

/// Deterministic parameter factory: every tensor is drawn from one private
/// generator, in construction order.
struct Init {
  at::Generator gen;
  at::Device device;
  std::vector<std::pair<std::string, at::Tensor>> *group = nullptr;

  at::Tensor leaf(const std::string &name, at::Tensor t) {
    t = t.to(device).detach().set_requires_grad(true);
    group->emplace_back(name, t);
    return t;
  }
  at::Tensor normal(const std::string &name, at::IntArrayRef shape) {
    at::Tensor t = at::empty(shape, at::kFloat);
    t.normal_(0.0, 0.02, gen);
    return leaf(name, t);
  }
  LinearParams linear(const std::string &name, int64_t in, int64_t out,
                      bool bias = true) {
    LinearParams p{normal(name + ".weight", {out, in}), {}};
    if (bias)
      p.bias = leaf(name + ".bias", at::zeros({out}, at::kFloat));
    return p;
  }
  /// The epsilon of the norms made next.
  double eps = 1e-5;
  NormParams norm(const std::string &name, int64_t n, bool rms = false) {
    NormParams p{leaf(name + ".weight", at::ones({n}, at::kFloat)), {}, rms,
                 eps};
    if (!rms)
      p.bias = leaf(name + ".bias", at::zeros({n}, at::kFloat));
    return p;
  }
  AttentionParams attention(const std::string &name, int64_t h) {
    return {norm(name + ".norm", h), linear(name + ".qkv", h, 3 * h),
            linear(name + ".out", h, h)};
  }
  MlpParams mlp(const std::string &name, int64_t h, int64_t f) {
    return {norm(name + ".norm", h), linear(name + ".up", h, f),
            linear(name + ".down", f, h)};
  }
};

at::Tensor layerNorm(const NormParams &p, const at::Tensor &x, double eps) {
  return at::layer_norm(x, {x.size(-1)}, p.weight, p.bias, eps);
}

at::Tensor linear(const LinearParams &p, const at::Tensor &x) {
  return at::linear(x, p.weight, p.bias);
}

/// [B, S, H] -> [B, heads, S, d]: a strided view for the fused kernel (which
/// reads any layout, and whose output is then laid out [B, S, heads, d]),
/// a contiguous copy for the math path's batched matmuls.
at::Tensor splitHeads(const at::Tensor &x, int64_t heads, bool fused) {
  at::Tensor split = x.view({x.size(0), x.size(1), heads, x.size(2) / heads})
                         .transpose(1, 2);
  return fused ? split : split.contiguous();
}

/// A fused projection [B, S, n·H] as n heads-first tensors: views whose
/// backward fills one gradient buffer (Fused.h) — for the fused kernel as
/// they are, for the math path's batched matmuls contiguous copies of them.
/// (Slicing each out instead made n zero-filled [B, S, n·H] gradients and
/// their sum in the backward: 5% over the plan on a small model.)
std::vector<at::Tensor> splitProjection(const at::Tensor &x, int64_t n,
                                        int64_t heads, bool fused) {
  std::vector<at::Tensor> out = fused::splitHeads(x, n, heads);
  if (!fused)
    for (at::Tensor &t : out)
      t = t.contiguous();
  return out;
}

/// [B, heads, S, d] -> [B, S, H]: a view of the fused kernel's output, a
/// contiguous copy of the math path's.
at::Tensor mergeHeads(const at::Tensor &x) {
  return x.transpose(1, 2).reshape({x.size(0), x.size(2), -1});
}

/// The mean over the scored labels (kIgnoreLabel: a record without the
/// task's label, a word's later sub-token); 0, not NaN, where a micro-batch
/// has none of them.
at::Tensor crossEntropy(const at::Tensor &logits, const at::Tensor &labels,
                        bool partial) {
  if (!partial)
    return at::cross_entropy_loss(logits.to(at::kFloat), labels, {},
                                  at::Reduction::Mean, kIgnoreLabel);
  const at::Tensor sum = at::cross_entropy_loss(
      logits.to(at::kFloat), labels, {}, at::Reduction::Sum, kIgnoreLabel);
  return sum / labels.ne(kIgnoreLabel).sum().clamp_min(1).to(at::kFloat);
}

/// Mean squared error over the targets present (NaN: a record without the
/// task's label).
at::Tensor meanSquared(const at::Tensor &out, const at::Tensor &target,
                       bool partial) {
  if (!partial)
    return at::mse_loss(out.to(at::kFloat), target.to(at::kFloat));
  const at::Tensor y = target.to(at::kFloat), known = y.isnan().logical_not();
  const at::Tensor d = (out.to(at::kFloat) - y.nan_to_num(0.0)) * known;
  return (d * d).sum() / known.sum().clamp_min(1).to(at::kFloat);
}

} // namespace

Model::Model(ModelConfig config, std::vector<HeadConfig> heads)
    : config_(std::move(config)), headConfigs_(std::move(heads)),
      device_(parseDevice(config_.device)) {
  const ModelConfig &c = config_;
  requirePositive("ModelConfig.vocab", c.vocab);
  requirePositive("ModelConfig.seq", c.seq);
  requirePositive("ModelConfig.layers", c.layers);
  requirePositive("ModelConfig.hidden", c.hidden);
  requirePositive("ModelConfig.heads", c.heads);
  requirePositive("ModelConfig.ffn", c.ffn);
  if (c.hidden % c.heads)
    bad("ModelConfig.heads", "must divide hidden (" + std::to_string(c.hidden) +
                                 "), got " + std::to_string(c.heads));
  if (c.positions != 0 && c.positions < c.seq)
    bad("ModelConfig.positions",
        "the position table's " + std::to_string(c.positions) +
            " rows are fewer than seq = " + std::to_string(c.seq));
  if (!(c.normEps > 0.0 && c.normEps < 1.0))
    bad("ModelConfig.normEps",
        "must be in (0, 1), got " + std::to_string(c.normEps));
  if (c.llama()) {
    if (c.pointwise == PointwiseKind::Fused)
      bad("ModelConfig.pointwise",
          "llama's RMSNorm and SwiGLU run on ATen's pointwise ops; use Aten");
    if (c.attention != AttentionKind::Fused ||
        (c.dropout > 0.0 && parseDevice(c.device).is_cpu()))
      bad("ModelConfig.attention",
          "llama runs the fused attention kernel only (grouped queries, "
          "rotary positions): Fused, and dropout 0 on the CPU");
    if (c.kvHeads < 0 || c.heads % c.kvHeadCount() != 0)
      bad("ModelConfig.kvHeads",
          std::to_string(c.kvHeads) + " key/value heads do not divide " +
              std::to_string(c.heads) + " attention heads");
    if ((c.hidden / c.heads) % 2)
      bad("ModelConfig.heads", "rotary positions need an even head size");
    if (!(c.ropeTheta > 0.0))
      bad("ModelConfig.ropeTheta", "must be positive");
    const RopeScaling &r = c.ropeScaling;
    if (r.factor != 0.0 &&
        !(r.factor > 0.0 && r.lowFreqFactor > 0.0 &&
          r.highFreqFactor > r.lowFreqFactor && r.originalPositions > 0))
      bad("ModelConfig.ropeScaling",
          "needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
          "original positions > 0");
  }
  if (c.postNorm() && c.pointwise == PointwiseKind::Fused)
    bad("ModelConfig.pointwise",
        "a post-norm (BERT) backbone runs ATen's pointwise ops (the fused "
        "kernels norm before a linear); use Aten");
  if (c.freezeFirst < -1 || c.freezeLast > c.layers ||
      (c.freezeFirst < 0) != (c.freezeLast < 0) ||
      c.freezeFirst > c.freezeLast)
    bad("ModelConfig.freezeFirst",
        "freezeFirst " + std::to_string(c.freezeFirst) + " .. freezeLast " +
            std::to_string(c.freezeLast) +
            " is no range of layers in [0, " + std::to_string(c.layers) +
            "] (-1 .. -1: none)");
  if (c.tokenPad < -1 || c.tokenPad >= c.vocab)
    bad("ModelConfig.tokenPad", "must be -1 or a token id, got " +
                                    std::to_string(c.tokenPad));
  if (c.positionPad >= 0 && c.positionPad + 1 + c.seq > c.positionRows())
    bad("ModelConfig.positions",
        "RoBERTa's positions run to padding id + 1 + seq = " +
            std::to_string(c.positionPad + 1 + c.seq) + ", past the table's " +
            std::to_string(c.positionRows()) + " rows");
  if (c.geluTanh() && c.pointwise == PointwiseKind::Fused)
    bad("ModelConfig.pointwise",
        "this backbone's GELU is the tanh form, which only ATen's pointwise "
        "ops compute (the fused kernels compute erf's); use Aten");
  if (!(c.dropout >= 0.0 && c.dropout < 1.0))
    bad("ModelConfig.dropout",
        "must be in [0, 1), got " + std::to_string(c.dropout));
  if (headConfigs_.empty())
    bad("heads", "a multi-task model needs at least one head");
  std::set<std::string> names;
  for (size_t i = 0; i < headConfigs_.size(); ++i) {
    HeadConfig &h = headConfigs_[i];
    const std::string f = "HeadConfig[" + std::to_string(i) + "]";
    if (h.name.empty())
      bad(f + ".name", "must not be empty");
    if (!names.insert(h.name).second)
      bad(f + ".name", "duplicate head name \"" + h.name + "\"");
    if (h.tap < 0 || h.tap > c.layers)
      bad(f + ".tap", "must be in [0, " + std::to_string(c.layers) + "], got " +
                          std::to_string(h.tap));
    if (h.loss == LossKind::Mse && h.kind != HeadKind::Classify)
      bad(f + ".loss", "mse is only defined for classify heads");
    if (h.kind == HeadKind::Classify || h.kind == HeadKind::Tag)
      requirePositive(f + ".classes", h.classes);
    if (h.kind == HeadKind::Decoder) {
      requirePositive(f + ".decoderLayers", h.decoderLayers);
      requirePositive(f + ".targetSeq", h.targetSeq);
      if (h.targetSeq > c.seq)
        bad(f + ".targetSeq", "must not exceed ModelConfig.seq");
      if (h.targetVocab == 0)
        h.targetVocab = c.vocab;
      requirePositive(f + ".targetVocab", h.targetVocab);
    }
  }

  const int64_t hdim = c.hidden;
  Init init{at::make_generator<at::CPUGeneratorImpl>(c.seed), device_};
  groups_.resize(1 + headConfigs_.size());
  init.group = &groups_[0];
  init.eps = c.normEps; // the backbone's norms
  tokEmb_ = init.normal("embed.tok", {c.vocab, hdim});
  if (!c.llama())
    posEmb_ = init.normal("embed.pos", {c.positionRows(), hdim});
  if (c.postNorm()) {
    typeEmb_ = init.normal("embed.type", {std::max<int64_t>(1, c.typeVocab), hdim});
    embedNorm_ = init.norm("embed.norm", hdim);
  }
  for (int64_t l = 1; l <= c.layers; ++l) {
    const std::string n = "layer" + std::to_string(l);
    if (!c.llama()) {
      attn_.push_back(init.attention(n + ".attn", hdim));
      mlp_.push_back(init.mlp(n + ".mlp", hdim, c.ffn));
      attn_.back().postNorm = mlp_.back().postNorm = c.postNorm();
      continue;
    }
    // Llama: RMSNorms, the grouped QKV rows, the gate's and up's rows.
    const int64_t d = hdim / c.heads, kv = c.kvHeadCount();
    AttentionParams a;
    a.norm = init.norm(n + ".attn.norm", hdim, /*rms=*/true);
    a.qkv = init.linear(n + ".attn.qkv", hdim, (c.heads + 2 * kv) * d,
                        c.attentionBias);
    a.out = init.linear(n + ".attn.out", hdim, hdim, c.attentionBias);
    a.kvHeads = kv;
    a.rotary = true;
    attn_.push_back(std::move(a));
    MlpParams m;
    m.norm = init.norm(n + ".mlp.norm", hdim, /*rms=*/true);
    m.up = init.linear(n + ".mlp.up", hdim, 2 * c.ffn, c.mlpBias);
    m.down = init.linear(n + ".mlp.down", c.ffn, hdim, c.mlpBias);
    m.gated = true;
    mlp_.push_back(std::move(m));
  }
  if (c.finalNorm())
    finalNorm_ = init.norm("final.norm", hdim, /*rms=*/c.llama());
  if (c.llama()) {
    // Hugging Face's rotary tables, op for op in fp32 (its
    // _compute_default_rope_parameters / _compute_llama3_parameters).
    const int64_t d = hdim / c.heads;
    at::Tensor invFreq =
        1.0 / at::pow(c.ropeTheta,
                      at::arange(0, d, 2, at::kLong).to(at::kFloat) /
                          static_cast<double>(d));
    if (c.ropeScaling.factor > 0) {
      const RopeScaling &r = c.ropeScaling;
      const double lowWavelen = double(r.originalPositions) / r.lowFreqFactor;
      const double highWavelen = double(r.originalPositions) / r.highFreqFactor;
      at::Tensor wavelen = 2 * M_PI / invFreq;
      at::Tensor scaled =
          at::where(wavelen > lowWavelen, invFreq / r.factor, invFreq);
      at::Tensor smooth =
          (double(r.originalPositions) / wavelen - r.lowFreqFactor) /
          (r.highFreqFactor - r.lowFreqFactor);
      at::Tensor smoothed =
          (1 - smooth) * scaled / r.factor + smooth * scaled;
      at::Tensor medium = (wavelen >= highWavelen).logical_and(
          wavelen <= lowWavelen);
      invFreq = at::where(medium, smoothed, scaled);
    }
    at::Tensor positions = at::arange(c.seq, at::kLong).to(at::kFloat);
    at::Tensor freqs = at::outer(positions, invFreq);
    at::Tensor emb = at::cat({freqs, freqs}, -1);
    cos_ = emb.cos().to(device_);
    sin_ = emb.sin().to(device_);
  }
  init.eps = 1e-5; // the heads' norms: mtpc's own, whatever the backbone
  for (size_t i = 0; i < headConfigs_.size(); ++i) {
    const HeadConfig &hc = headConfigs_[i];
    const std::string n = "head." + hc.name;
    init.group = &groups_[1 + i];
    Head h;
    switch (hc.kind) {
    case HeadKind::Classify:
      h.norm = init.norm(n + ".norm", hdim);
      h.pool = init.linear(n + ".pool", hdim, hdim);
      h.out = init.linear(n + ".out", hdim, hc.classes);
      break;
    case HeadKind::Tag:
      h.norm = init.norm(n + ".norm", hdim);
      h.out = init.linear(n + ".out", hdim, hc.classes);
      break;
    case HeadKind::Span:
      h.norm = init.norm(n + ".norm", hdim);
      h.out = init.linear(n + ".out", hdim, 2);
      break;
    case HeadKind::Decoder:
      h.tokEmb = init.normal(n + ".tok", {hc.targetVocab, hdim});
      h.posEmb = init.normal(n + ".pos", {hc.targetSeq, hdim});
      for (int64_t l = 1; l <= hc.decoderLayers; ++l) {
        const std::string d = n + ".layer" + std::to_string(l);
        DecoderLayer dl;
        dl.self = init.attention(d + ".self", hdim);
        dl.crossNorm = init.norm(d + ".cross.norm", hdim);
        dl.memNorm = init.norm(d + ".cross.memnorm", hdim);
        dl.crossQ = init.linear(d + ".cross.q", hdim, hdim);
        dl.crossKv = init.linear(d + ".cross.kv", hdim, 2 * hdim);
        dl.crossOut = init.linear(d + ".cross.out", hdim, hdim);
        dl.mlp = init.mlp(d + ".mlp", hdim, c.ffn);
        h.layers.push_back(std::move(dl));
      }
      h.norm = init.norm(n + ".norm", hdim);
      h.out = init.linear(n + ".out", hdim, hc.targetVocab);
      break;
    }
    heads_.push_back(std::move(h));
  }
  // Made after every head's own parameters, so a model without adapters
  // draws the same initialization. up starts at zero: a fresh adapter is
  // the identity. The gate's bias is spread (N(0, 1)) so that tasks' gates
  // differ from the start: identical gates are a stationary point of the
  // separation loss.
  if (const std::optional<AdapterConfig> &ad = c.adapters)
    for (size_t i = 0; i < headConfigs_.size(); ++i) {
      const std::string n = "head." + headConfigs_[i].name;
      init.group = &groups_[1 + i];
      Head &h = heads_[i];
      const int64_t r = ad->bottleneck;
      if (r < 1 || r > hdim)
        bad("ModelConfig.adapters.bottleneck",
            "must lie in [1, hidden = " + std::to_string(hdim) + "], got " +
                std::to_string(r));
      if (std::string why = ad->ownerProblem(headConfigs_.size());
          !why.empty())
        bad("ModelConfig.adapters.owner", why);
      const int64_t owner = ad->ownerOf(int64_t(i));
      if (owner != int64_t(i)) {
        // The group's adapter: the same leaves, so every member's backward
        // adds to one gradient; only the owner's head group lists them.
        h.adapter.down = heads_[size_t(owner)].adapter.down;
        h.adapter.up = heads_[size_t(owner)].adapter.up;
      } else {
        h.adapter.down = init.linear(n + ".adapter.down", hdim, r);
        h.adapter.up = {init.leaf(n + ".adapter.up.weight",
                                  at::zeros({hdim, r}, at::kFloat)),
                        init.leaf(n + ".adapter.up.bias",
                                  at::zeros({hdim}, at::kFloat))};
      }
      at::Tensor a = at::empty({hdim}, at::kFloat);
      a.normal_(0.0, 1.0, init.gen);
      h.adapter.gateBias = init.leaf(n + ".adapter.gate.bias", a);
      h.adapter.gateWeight = init.normal(n + ".adapter.gate.weight", {hdim});
    }
  if (!c.weights.empty()) {
    PretrainedLoad load = loadPretrained(*this, c.weights);
    pretrained_ = "loaded " + std::to_string(load.tensors) +
                  " backbone tensors from " + c.weights;
    if (!load.unexpected.empty()) {
      pretrained_ += "; skipped " + std::to_string(load.unexpected.size()) +
                     " it has no parameter for:";
      for (size_t i = 0; i < load.unexpected.size() && i < 8; ++i)
        pretrained_ += (i ? ", " : " ") + load.unexpected[i];
      if (load.unexpected.size() > 8)
        pretrained_ += ", ...";
    }
  }
  // Frozen layers: leaves without gradients (autograd then saves nothing
  // their weights' gradients would read, and the optimizer skips them).
  for (int64_t l = 0; l <= c.layers; ++l)
    if (c.frozen(l))
      for (const at::Tensor &p : layerParameters(l))
        const_cast<at::Tensor &>(p).set_requires_grad(false);
}

at::Tensor Model::dropout(const at::Tensor &x) const {
  if (!training_ || config_.dropout == 0.0)
    return x;
  return std::get<0>(at::native_dropout(x, config_.dropout, true));
}

void Model::setInputs(const at::Tensor &lengths, const at::Tensor &types) {
  keyMask_ = types_ = at::Tensor();
  if (lengths.defined()) {
    const at::Tensor l = lengths.to(device_, at::kLong);
    keyMask_ = (at::arange(config_.seq, l.options()).unsqueeze(0) <
                l.unsqueeze(1))
                   .view({l.size(0), 1, 1, config_.seq});
  }
  if (types.defined())
    types_ = types.to(device_, at::kLong);
}

at::Tensor Model::embed(const at::Tensor &tokens) const {
  if (tokens.dim() != 2 || tokens.size(1) > config_.seq)
    throw std::invalid_argument(
        "mtprt: embed: tokens must be [B, S] with S <= ModelConfig.seq");
  beforeRead(0);
  if (config_.llama())
    return dropout(at::embedding(tokEmb_, tokens, config_.tokenPad));
  if (config_.postNorm()) {
    // BERT: word + position + token type 0, LayerNorm, dropout. RoBERTa's
    // positions count the non-padding tokens from its padding id + 1
    // (Hugging Face's create_position_ids_from_input_ids).
    at::Tensor positions;
    if (config_.positionPad >= 0) {
      at::Tensor mask = tokens.ne(config_.positionPad).to(at::kLong);
      positions = at::cumsum(mask, 1) * mask + config_.positionPad;
    }
    at::Tensor pos = positions.defined()
                         ? at::embedding(posEmb_, positions, config_.positionPad)
                         : posEmb_.narrow(0, 0, tokens.size(1));
    if (types_.defined() && types_.sizes() == tokens.sizes()) {
      // Each token's type (a sentence pair's second segment: 1); one
      // temporary at a time beside the sum.
      at::Tensor x = at::embedding(tokEmb_, tokens, config_.tokenPad);
      x = x + at::embedding(typeEmb_, types_);
      x = x + pos;
      return dropout(norm(embedNorm_, x));
    }
    at::Tensor x = at::embedding(tokEmb_, tokens, config_.tokenPad) +
                   typeEmb_.narrow(0, 0, 1) + pos;
    return dropout(norm(embedNorm_, x));
  }
  at::Tensor x =
      at::embedding(tokEmb_, tokens) + posEmb_.narrow(0, 0, tokens.size(1));
  return dropout(x);
}

bool Model::fusedAttention() const {
  return config_.attention == AttentionKind::Fused &&
         (device_.is_cuda() || !training_ || config_.dropout == 0.0);
}

at::Tensor Model::causalMask(int64_t t) const {
  if (fusedAttention())
    return {};
  return at::ones({t, t}, at::TensorOptions().dtype(at::kBool).device(device_))
      .triu(1);
}

at::Tensor Model::attentionCore(const at::Tensor &q, const at::Tensor &k,
                                const at::Tensor &v, bool causal,
                                const at::Tensor &mask) const {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  // Padding keys, where the batch has them, for bidirectional attention
  // (causal attention never reaches right padding from a real token).
  const at::Tensor keys =
      !causal && keyMask_.defined() && keyMask_.size(0) == k.size(0) &&
              keyMask_.size(-1) == k.size(-2)
          ? keyMask_
          : at::Tensor();
  if (fusedAttention()) {
    // One kernel (flash / memory-efficient on CUDA, flash on the CPU) that
    // keeps q, k, v, its output and the log-sum-exp; its output's layout
    // is [B, S, a, d], so merging the heads afterwards is a view. A key
    // mask adds its [B, 1, 1, S] float copy.
    return at::scaled_dot_product_attention(
        q, k, v,
        keys.defined() ? std::optional<at::Tensor>(keys) : std::nullopt,
        training_ ? config_.dropout : 0.0, causal, scale,
        /*enable_gqa=*/k.size(1) != q.size(1));
  }
  at::Tensor scores = at::matmul(q * scale, k.transpose(-2, -1));
  if (keys.defined())
    scores = scores.masked_fill(keys.logical_not(),
                                -std::numeric_limits<float>::infinity());
  if (causal)
    scores = scores.masked_fill(mask.defined() ? mask : causalMask(q.size(-2)),
                                -std::numeric_limits<float>::infinity());
  at::Tensor probs = dropout(at::softmax(scores, -1));
  return at::matmul(probs, v);
}

at::Tensor Model::normLinear(const NormParams &n, const LinearParams &l,
                             const at::Tensor &x) const {
  if (config_.pointwise == PointwiseKind::Fused)
    return fused::normLinear(x, n.weight, n.bias, l.weight, l.bias,
                             n.eps);
  return linear(l, norm(n, x));
}

at::Tensor Model::norm(const NormParams &n, const at::Tensor &x) const {
  if (n.rms)
    return at::rms_norm(x, {x.size(-1)}, n.weight, n.eps);
  return layerNorm(n, x, n.eps);
}

at::Tensor Model::rotate(const at::Tensor &x) const {
  // Hugging Face's apply_rotary_pos_emb: x·cos + rotate_half(x)·sin, with
  // rotate_half(x) = cat(-x2, x1) of x's two halves.
  const int64_t s = x.size(-2), half = x.size(-1) / 2;
  at::Tensor rotated =
      at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos_.narrow(0, 0, s) + rotated * sin_.narrow(0, 0, s);
}

at::Tensor Model::geluLinear(const at::Tensor &u, const LinearParams &l) const {
  if (config_.pointwise == PointwiseKind::Fused)
    return fused::geluLinear(u, l.weight, l.bias);
  return linear(l, gelu(u));
}

at::Tensor Model::sinkable(at::Tensor normed, const Sink *sink) const {
  if (!sink)
    return normed;
  // Under autocast the next linear keeps the 16-bit copy it casts, which
  // the sink must see (its storage is what a saved-tensor hook matches):
  // cast here, the same rounding autocast does; the linear casts nothing.
  const c10::DeviceType type = normed.device().type();
  if (at::autocast::is_autocast_enabled(type) &&
      normed.scalar_type() == at::kFloat)
    normed = normed.to(at::autocast::get_autocast_dtype(type));
  (*sink)(normed);
  return normed;
}

at::Tensor Model::attentionProjections(const AttentionParams &p,
                                       const at::Tensor &x,
                                       const Sink *sink) const {
  if (config_.pointwise == PointwiseKind::Fused) {
    at::Tensor qkv = normLinear(p.norm, p.qkv, x);
    if (sink)
      (*sink)(qkv);
    return qkv;
  }
  at::Tensor normed = sinkable(layerNorm(p.norm, x, p.norm.eps), sink);
  at::Tensor qkv = linear(p.qkv, normed);
  if (sink)
    (*sink)(qkv);
  return qkv;
}

at::Tensor Model::mlpProjections(const MlpParams &p, const at::Tensor &x,
                                 const Sink *sink) const {
  if (config_.pointwise == PointwiseKind::Fused) {
    at::Tensor up = normLinear(p.norm, p.up, x);
    if (sink)
      (*sink)(up);
    return up; // the fused GELU-linear reads it
  }
  at::Tensor normed = sinkable(layerNorm(p.norm, x, p.norm.eps), sink);
  at::Tensor up = linear(p.up, normed);
  normed.reset();
  if (sink)
    (*sink)(up);
  at::Tensor act = gelu(up);
  if (sink)
    (*sink)(act);
  return act;
}

at::Tensor Model::attentionBlock(const AttentionParams &p, const at::Tensor &x,
                                 bool causal, const at::Tensor &mask,
                                 const Sink *sink) const {
  const bool fused = fusedAttention();
  if (p.rotary) {
    // The queries' and keys' rows in one linear, the values' in another:
    // q and k die after the rotation (which keeps only the tables), so
    // nothing holds the projection's whole output for the values' sake.
    const int64_t a = config_.heads, kv = p.kvHeads,
                  d = config_.hidden / config_.heads;
    const int64_t b = x.size(0), s = x.size(1);
    at::Tensor h = norm(p.norm, x);
    auto rows = [](const at::Tensor &t, int64_t from, int64_t n) {
      return t.defined() ? t.narrow(0, from, n) : at::Tensor();
    };
    at::Tensor qk = at::linear(h, p.qkv.weight.narrow(0, 0, (a + kv) * d),
                               rows(p.qkv.bias, 0, (a + kv) * d));
    at::Tensor v = at::linear(h, p.qkv.weight.narrow(0, (a + kv) * d, kv * d),
                              rows(p.qkv.bias, (a + kv) * d, kv * d));
    at::Tensor q =
        rotate(qk.narrow(-1, 0, a * d).view({b, s, a, d}).transpose(1, 2));
    at::Tensor k = rotate(
        qk.narrow(-1, a * d, kv * d).view({b, s, kv, d}).transpose(1, 2));
    qk.reset();
    h.reset();
    at::Tensor ctx = mergeHeads(attentionCore(
        q, k, v.view({b, s, kv, d}).transpose(1, 2), causal, mask));
    q.reset();
    k.reset();
    v.reset();
    at::Tensor out = dropout(linear(p.out, ctx));
    ctx.reset();
    return x + out;
  }
  at::Tensor qkv = p.postNorm ? linear(p.qkv, x)
                             : attentionProjections(p, x, sink);
  const int64_t a = config_.heads;
  std::vector<at::Tensor> qkvHeads = splitProjection(qkv, 3, a, fused);
  at::Tensor q = qkvHeads[0], k = qkvHeads[1], v = qkvHeads[2];
  qkvHeads.clear();
  qkv.reset();
  at::Tensor ctx = mergeHeads(attentionCore(q, k, v, causal, mask));
  q.reset(); // the projection's storage dies here unless autograd keeps it
  k.reset();
  v.reset();
  at::Tensor out = dropout(linear(p.out, ctx));
  ctx.reset();
  if (!p.postNorm)
    return x + out;
  at::Tensor sum = x + out;
  out.reset();
  return norm(p.norm, sum);
}

at::Tensor Model::mlpBlock(const MlpParams &p, const at::Tensor &x,
                           const Sink *sink) const {
  if (p.gated) {
    at::Tensor gu = linear(p.up, norm(p.norm, x));
    const int64_t f = gu.size(-1) / 2;
    at::Tensor act = at::silu(gu.narrow(-1, 0, f)) * gu.narrow(-1, f, f);
    gu.reset();
    at::Tensor down = dropout(linear(p.down, act));
    act.reset();
    return x + down;
  }
  if (p.postNorm) {
    at::Tensor up = linear(p.up, x);
    at::Tensor act = gelu(up);
    up.reset();
    at::Tensor down = dropout(linear(p.down, act));
    act.reset();
    at::Tensor sum = x + down;
    down.reset();
    return norm(p.norm, sum);
  }
  at::Tensor h = mlpProjections(p, x, sink);
  at::Tensor down = dropout(config_.pointwise == PointwiseKind::Fused
                                ? geluLinear(h, p.down)
                                : linear(p.down, h));
  h.reset();
  return x + down;
}

at::Tensor Model::attention(int64_t layer, const at::Tensor &x) const {
  if (layer < 1 || layer > config_.layers)
    throw std::out_of_range("mtprt: attention: layer " + std::to_string(layer) +
                            " is not in [1, " + std::to_string(config_.layers) +
                            "]");
  beforeRead(2 * layer - 1);
  return attentionBlock(attn_[layer - 1], x, config_.causal());
}

at::Tensor Model::mlp(int64_t layer, const at::Tensor &x) const {
  if (layer < 1 || layer > config_.layers)
    throw std::out_of_range("mtprt: mlp: layer " + std::to_string(layer) +
                            " is not in [1, " + std::to_string(config_.layers) +
                            "]");
  beforeRead(2 * layer);
  return mlpBlock(mlp_[layer - 1], x);
}

at::Tensor Model::unit(int64_t u, const at::Tensor &x, int64_t next) const {
  if (u < 0 || u >= numUnits())
    throw std::out_of_range("mtprt: unit " + std::to_string(u) +
                            " is not in [0, " + std::to_string(numUnits() - 1) +
                            "]");
  if (u < firstUnit() || u > lastUnit())
    throw std::logic_error("mtprt: unit " + std::to_string(u) +
                           " is on another pipeline stage (this one holds " +
                           std::to_string(firstUnit()) + ".." +
                           std::to_string(lastUnit()) + ")");
  if (aroundUnit_ && !at::GradMode::is_enabled()) {
    aroundUnit_(u, true, next);
    at::Tensor y = runUnit(u, x);
    aroundUnit_(u, false, -1);
    return y;
  }
  return runUnit(u, x);
}

at::Tensor Model::runUnit(int64_t u, const at::Tensor &x) const {
  // The frozen run from the embeddings up: nothing below needs a gradient,
  // so nothing is recorded or kept for one.
  std::optional<at::NoGradGuard> noGrad;
  if ((u + 1) / 2 <= config_.noGradTop())
    noGrad.emplace();
  if (u == 0)
    return embed(x);
  return u % 2 ? attention((u + 1) / 2, x) : finish(u, mlp(u / 2, x));
}

at::Tensor Model::finish(int64_t u, const at::Tensor &y) const {
  if (!config_.finalNorm() || u != numUnits() - 1)
    return y;
  return norm(finalNorm_, y);
}

at::Tensor Model::gelu(const at::Tensor &u) const {
  return at::gelu(u, config_.geluTanh() ? "tanh" : "none");
}

/// Why unit u >= 1 cannot run at tensor grain now ("" when it can).
std::string Model::partialRefusal(int64_t u) const {
  if (config_.postNorm())
    return "not for post-norm (BERT) blocks";
  if (config_.llama())
    return "not for llama's blocks (rotary positions, grouped queries)";
  if (at::autocast::is_autocast_enabled(device_.type()) &&
      config_.pointwise == PointwiseKind::Fused)
    return "not with the fused pointwise kernels under autocast (they serve "
           "fp32 only)";
  if (u % 2 == 1 && !fusedAttention())
    return "needs the fused attention kernel (the math path, for dropout on "
           "the CPU, keeps its own copies of q, k and v)";
  return "";
}

at::Tensor Model::unitPartial(int64_t u, const at::Tensor &x) const {
  if (u < 1 || u >= numUnits())
    throw std::out_of_range("mtprt: unit " + std::to_string(u) +
                            " at tensor grain is not a layer's block in [1, " +
                            std::to_string(numUnits() - 1) + "]");
  if (std::string why = partialRefusal(u); !why.empty())
    throw std::invalid_argument("mtprt: unit " + std::to_string(u) +
                                " at tensor grain: " + why);
  beforeRead(u);
  const Model *self = this;
  const at::Tensor input = x.detach();
  Recomputed recomputed([self, u, input] { return self->projections(u, input); },
                        device_);
  const Sink add = [&recomputed](const at::Tensor &t) { recomputed.add(t); };
  Recomputed::Scope scope(recomputed);
  const int64_t l = (u + 1) / 2;
  return u % 2 == 1
             ? attentionBlock(attn_[l - 1], x, config_.causal(), {}, &add)
             : finish(u, mlpBlock(mlp_[l - 1], x, &add));
}

bool Model::partialServes(int64_t u) const {
  return u >= 1 && u < numUnits() && partialRefusal(u).empty();
}

std::vector<at::Tensor> Model::projections(int64_t u,
                                           const at::Tensor &x) const {
  if (u < 1 || u >= numUnits())
    throw std::out_of_range("mtprt: projections of unit " + std::to_string(u) +
                            ": not a layer's block");
  beforeRead(u);
  at::NoGradGuard noGrad;
  std::vector<at::Tensor> outs;
  const Sink collect = [&outs](const at::Tensor &t) { outs.push_back(t); };
  const int64_t l = (u + 1) / 2;
  if (u % 2 == 1)
    attentionProjections(attn_[l - 1], x, &collect);
  else
    mlpProjections(mlp_[l - 1], x, &collect);
  return outs;
}

at::Tensor Model::runUnits(int64_t first, int64_t last, at::Tensor x) const {
  for (int64_t u = first; u <= last; ++u)
    x = unit(u, x);
  return x;
}

std::string Model::unitName(int64_t u) const {
  if (u == 0)
    return "embed";
  return "layer" + std::to_string((u + 1) / 2) + (u % 2 ? ".attn" : ".mlp");
}

at::Tensor Model::decoderHead(const Head &p, const HeadConfig &c,
                              const at::Tensor &memory,
                              const at::Tensor &targets) const {
  if (!targets.defined())
    throw std::invalid_argument("mtprt: head \"" + c.name +
                                "\": a decoder head needs its target tokens");
  const int64_t b = targets.size(0), t = targets.size(1);
  // Teacher forcing: BOS (token 0), then the targets shifted right.
  at::Tensor inputs = at::cat(
      {at::zeros({b, 1}, targets.options()), targets.narrow(1, 0, t - 1)}, 1);
  at::Tensor h =
      dropout(at::embedding(p.tokEmb, inputs) + p.posEmb.narrow(0, 0, t));
  // The math path's mask, made once and shared by every layer.
  const at::Tensor causal = causalMask(t);
  const bool fused = fusedAttention();
  const int64_t a = config_.heads;
  for (const DecoderLayer &l : p.layers) {
    h = attentionBlock(l.self, h, /*causal=*/true, causal);
    at::Tensor kv = normLinear(l.memNorm, l.crossKv, memory);
    at::Tensor q = splitHeads(normLinear(l.crossNorm, l.crossQ, h), a, fused);
    std::vector<at::Tensor> kvHeads = splitProjection(kv, 2, a, fused);
    at::Tensor k = kvHeads[0], v = kvHeads[1];
    kvHeads.clear();
    kv.reset();
    h = h + dropout(linear(l.crossOut,
                           mergeHeads(attentionCore(q, k, v, false))));
    h = mlpBlock(l.mlp, h);
  }
  return normLinear(p.norm, p.out, h);
}

at::Tensor Model::headInput(const HeadConfig &c, const at::Tensor &tap) {
  return c.kind == HeadKind::Classify ? tap.select(1, 0) : tap;
}

at::Tensor Model::adapt(const Head &p, const at::Tensor &x) const {
  const Adapter &ad = p.adapter;
  if (!ad.down.weight.defined())
    return x;
  // mean over the sequence for [B, S, H]; a classify head's [B, H] is its own.
  at::Tensor g = at::sigmoid(ad.gateBias +
                             ad.gateWeight * (x.dim() == 3 ? x.mean(1) : x));
  at::Tensor u = linear(ad.up, at::relu(linear(ad.down, x)));
  if (x.dim() == 3)
    g = g.unsqueeze(1);
  return x + (1 - g) * u;
}

at::Tensor Model::gateMean(int64_t h, const at::Tensor &tap) const {
  const Adapter &ad = heads_.at(h).adapter;
  if (!ad.down.weight.defined())
    return {};
  beforeRead(numUnits() + h);
  at::Tensor x = headInput(headConfigs_[h], tap);
  at::Tensor m = (x.dim() == 3 ? x.mean(1) : x).detach();
  return at::sigmoid(ad.gateBias + ad.gateWeight * m).mean(0);
}

at::Tensor Model::gateSeparation(const std::vector<at::Tensor> &gates) {
  const int64_t n = static_cast<int64_t>(gates.size());
  if (n < 2)
    throw std::invalid_argument(
        "mtprt: the gate-separation loss needs two tasks' gates or more");
  at::Tensor g = at::stack(gates); // [T, H]
  at::Tensor unit = g / g.norm(2, -1, true).clamp_min(1e-12);
  at::Tensor cos = at::matmul(unit, unit.t());
  return at::triu(cos, 1).sum() / static_cast<double>(n * (n - 1) / 2);
}

std::vector<at::Tensor> Model::sharedAdapterParameters(int64_t h) const {
  const std::optional<AdapterConfig> &c = config_.adapters;
  if (!c || c->ownerOf(h) == h)
    return {};
  const Adapter &ad = heads_.at(size_t(h)).adapter;
  return {ad.down.weight, ad.down.bias, ad.up.weight, ad.up.bias};
}

std::vector<at::Tensor> Model::adapterParameters(int64_t h) const {
  const Adapter &ad = heads_.at(size_t(h)).adapter;
  if (!ad.down.weight.defined())
    return {};
  return {ad.down.weight, ad.down.bias, ad.up.weight, ad.up.bias};
}

std::vector<std::pair<at::Tensor, at::Tensor>>
Model::splitAdapters(const std::vector<int64_t> &owner) {
  std::optional<AdapterConfig> &c = config_.adapters;
  if (!c)
    bad("splitAdapters", "the model has no adapters");
  const int64_t n = numHeads();
  if (std::string why = c->splitProblem(owner, size_t(n)); !why.empty())
    bad("splitAdapters", why);
  AdapterConfig next = *c;
  next.owner = owner;
  at::NoGradGuard noGrad;
  std::vector<std::pair<at::Tensor, at::Tensor>> made;
  for (int64_t h = 0; h < n; ++h) {
    if (next.ownerOf(h) != h || c->ownerOf(h) == h)
      continue;
    Adapter &mine = heads_[size_t(h)].adapter;
    const std::string name = "head." + headConfigs_[size_t(h)].name;
    auto copy = [&](at::Tensor &slot, const std::string &suffix) {
      at::Tensor t = slot.detach().clone().set_requires_grad(true);
      made.emplace_back(t, slot);
      slot = t;
      return std::make_pair(name + ".adapter." + suffix, t);
    };
    std::vector<std::pair<std::string, at::Tensor>> own = {
        copy(mine.down.weight, "down.weight"), copy(mine.down.bias, "down.bias"),
        copy(mine.up.weight, "up.weight"), copy(mine.up.bias, "up.bias")};
    auto &group = groups_[size_t(1 + h)];
    auto gate = std::find_if(group.begin(), group.end(), [&](const auto &np) {
      return np.second.unsafeGetTensorImpl() ==
             mine.gateBias.unsafeGetTensorImpl();
    });
    group.insert(gate, own.begin(), own.end());
  }
  for (int64_t h = 0; h < n; ++h)
    if (int64_t o = next.ownerOf(h); o != h) {
      heads_[size_t(h)].adapter.down = heads_[size_t(o)].adapter.down;
      heads_[size_t(h)].adapter.up = heads_[size_t(o)].adapter.up;
    }
  c->owner = std::move(next.owner);
  return made;
}

std::vector<at::Tensor> Model::gateParameters(int64_t h) const {
  const Adapter &ad = heads_.at(h).adapter;
  if (!ad.down.weight.defined())
    return {};
  return {ad.gateBias, ad.gateWeight};
}

std::vector<at::Tensor> Model::head(int64_t h, const at::Tensor &tap,
                                    const at::Tensor &labels) const {
  if (h < 0 || h >= numHeads())
    throw std::out_of_range("mtprt: head index " + std::to_string(h) +
                            " out of range");
  if (!holdsHead(h))
    throw std::logic_error("mtprt: head \"" + headConfigs_[h].name +
                           "\" is on another pipeline stage");
  beforeRead(numUnits() + h);
  const Head &p = heads_[h];
  const HeadConfig &c = headConfigs_[h];
  switch (c.kind) {
  case HeadKind::Classify: {
    at::Tensor pooled =
        at::tanh(normLinear(p.norm, p.pool, adapt(p, headInput(c, tap))));
    return {linear(p.out, pooled)};
  }
  case HeadKind::Tag:
    return {normLinear(p.norm, p.out, adapt(p, tap))};
  case HeadKind::Span: {
    at::Tensor logits = normLinear(p.norm, p.out, adapt(p, tap));
    return {logits.select(-1, 0), logits.select(-1, 1)};
  }
  case HeadKind::Decoder:
    return {decoderHead(p, c, adapt(p, tap), labels)};
  }
  return {};
}

at::Tensor Model::loss(int64_t h, const std::vector<at::Tensor> &out,
                       const at::Tensor &labels, bool partial) const {
  const HeadConfig &c = headConfigs_.at(h);
  if (!labels.defined())
    throw std::invalid_argument("mtprt: loss \"" + c.name + "\": no labels");
  switch (c.kind) {
  case HeadKind::Classify:
    if (c.loss == LossKind::Mse)
      return meanSquared(out[0], labels, partial);
    return crossEntropy(out[0], labels, partial);
  case HeadKind::Tag:
  case HeadKind::Decoder:
    return crossEntropy(out[0].reshape({-1, out[0].size(-1)}),
                        labels.reshape({-1}), partial);
  case HeadKind::Span:
    return 0.5 * (crossEntropy(out[0], labels.select(1, 0), partial) +
                  crossEntropy(out[1], labels.select(1, 1), partial));
  }
  return {};
}

void Model::keepStage(int64_t first, int64_t last,
                      const std::vector<bool> &tasks) {
  if (first < 0 || last >= numUnits() || first > last)
    throw std::invalid_argument(
        "mtprt: pipeline stage units [" + std::to_string(first) + ", " +
        std::to_string(last) + "] are not within [0, " +
        std::to_string(numUnits() - 1) + "]");
  if (static_cast<int64_t>(tasks.size()) != numHeads())
    throw std::invalid_argument("mtprt: keepStage needs one flag per head");
  // What stays: the stage's units' tensors and its heads'.
  std::set<const void *> kept;
  auto keep = [&](const std::vector<at::Tensor> &ts) {
    for (const at::Tensor &t : ts)
      kept.insert(t.unsafeGetTensorImpl());
  };
  if (first == 0)
    keep(layerParameters(0));
  for (int64_t u = std::max<int64_t>(first, 1); u <= last; ++u) {
    const AttentionParams &a = attn_.at((u + 1) / 2 - 1);
    const MlpParams &m = mlp_.at((u + 1) / 2 - 1);
    if (u % 2)
      keep({a.norm.weight, a.norm.bias, a.qkv.weight, a.qkv.bias,
            a.out.weight, a.out.bias});
    else
      keep({m.norm.weight, m.norm.bias, m.up.weight, m.up.bias,
            m.down.weight, m.down.bias});
  }
  if (last == numUnits() - 1 && config_.finalNorm())
    keep({finalNorm_.weight, finalNorm_.bias});
  for (int64_t h = 0; h < numHeads(); ++h)
    if (tasks[h])
      keep(headParameters(h));
  auto drop = [&](at::Tensor &t) {
    if (t.defined() && !kept.count(t.unsafeGetTensorImpl()))
      t = at::Tensor();
  };
  for (auto &g : groups_) {
    std::vector<std::pair<std::string, at::Tensor>> stay;
    for (auto &np : g)
      if (kept.count(np.second.unsafeGetTensorImpl()))
        stay.push_back(std::move(np));
    g = std::move(stay);
  }
  for (at::Tensor *t : {&tokEmb_, &posEmb_, &typeEmb_, &embedNorm_.weight,
                        &embedNorm_.bias, &finalNorm_.weight, &finalNorm_.bias})
    drop(*t);
  for (AttentionParams &a : attn_)
    for (at::Tensor *t : {&a.norm.weight, &a.norm.bias, &a.qkv.weight,
                          &a.qkv.bias, &a.out.weight, &a.out.bias})
      drop(*t);
  for (MlpParams &m : mlp_)
    for (at::Tensor *t : {&m.norm.weight, &m.norm.bias, &m.up.weight,
                          &m.up.bias, &m.down.weight, &m.down.bias})
      drop(*t);
  for (int64_t h = 0; h < numHeads(); ++h)
    if (!tasks[h])
      heads_[h] = Head();
  firstUnit_ = first;
  lastUnit_ = last;
  heldHeads_ = tasks;
}

std::vector<at::Tensor> Model::layerParameters(int64_t layer) const {
  if (layer == 0) {
    std::vector<at::Tensor> out;
    for (const at::Tensor &t :
         {tokEmb_, posEmb_, typeEmb_, embedNorm_.weight, embedNorm_.bias})
      if (t.defined())
        out.push_back(t);
    return out;
  }
  const AttentionParams &a = attn_.at(layer - 1);
  const MlpParams &m = mlp_.at(layer - 1);
  std::vector<at::Tensor> out;
  for (const at::Tensor &t :
       {a.norm.weight, a.norm.bias, a.qkv.weight, a.qkv.bias, a.out.weight,
        a.out.bias, m.norm.weight, m.norm.bias, m.up.weight, m.up.bias,
        m.down.weight, m.down.bias})
    if (t.defined())
      out.push_back(t);
  if (config_.finalNorm() && layer == config_.layers) {
    out.push_back(finalNorm_.weight);
    if (finalNorm_.bias.defined())
      out.push_back(finalNorm_.bias);
  }
  return out;
}

std::vector<at::Tensor> Model::unitParameters(int64_t u) const {
  if (u == 0)
    return layerParameters(0);
  std::vector<at::Tensor> layer = layerParameters((u + 1) / 2);
  // layerParameters lists the attention's, then the MLP's and final norm's.
  const AttentionParams &a = attn_.at((u + 1) / 2 - 1);
  const int64_t n = a.norm.weight.defined() + a.norm.bias.defined() +
                    a.qkv.weight.defined() + a.qkv.bias.defined() +
                    a.out.weight.defined() + a.out.bias.defined();
  if (u % 2)
    layer.resize(size_t(n));
  else
    layer.erase(layer.begin(), layer.begin() + n);
  return layer;
}

std::vector<at::Tensor> Model::projectionParameters() const {
  std::vector<at::Tensor> out;
  for (size_t l = 0; l < attn_.size(); ++l)
    for (const at::Tensor &t :
         {attn_[l].qkv.weight, attn_[l].qkv.bias, attn_[l].out.weight,
          attn_[l].out.bias, mlp_[l].up.weight, mlp_[l].up.bias,
          mlp_[l].down.weight, mlp_[l].down.bias})
      if (t.defined())
        out.push_back(t);
  return out;
}

std::vector<at::Tensor> Model::backboneParameters() const {
  std::vector<at::Tensor> out;
  for (const auto &np : groups_[0])
    out.push_back(np.second);
  return out;
}

std::vector<at::Tensor> Model::trainableParameters() const {
  std::vector<at::Tensor> out;
  for (const at::Tensor &p : parameters())
    if (p.requires_grad())
      out.push_back(p);
  return out;
}

std::vector<at::Tensor> Model::headParameters(int64_t h) const {
  std::vector<at::Tensor> out;
  for (const auto &np : groups_.at(1 + h))
    out.push_back(np.second);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Model::namedParameters() const {
  beforeRead(-1);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto &g : groups_)
    out.insert(out.end(), g.begin(), g.end());
  return out;
}

std::vector<at::Tensor> Model::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto &g : groups_)
    for (const auto &np : g)
      out.push_back(np.second);
  return out;
}

int64_t Model::numParameters() const {
  int64_t n = 0;
  for (const at::Tensor &p : parameters())
    n += p.numel();
  return n;
}

Batch Model::syntheticBatch(int64_t batchSize, uint64_t seed) const {
  // Learnable labels: each is a simple function of the tokens, so a small
  // model can fit them (the loss-decrease tests and demos rely on it).
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t s = config_.seq;
  Batch b;
  b.tokens = at::randint(config_.vocab, {batchSize, s}, gen, at::kLong);
  for (const HeadConfig &c : headConfigs_) {
    switch (c.kind) {
    case HeadKind::Classify:
      if (c.loss == LossKind::Mse)
        b.labels.push_back(
            at::one_hot(b.tokens.select(1, 0) % c.classes, c.classes)
                .to(at::kFloat));
      else
        b.labels.push_back(b.tokens.select(1, 0) % c.classes);
      break;
    case HeadKind::Tag:
      b.labels.push_back(b.tokens % c.classes);
      break;
    case HeadKind::Span: {
      at::Tensor start = b.tokens.select(1, 0) % s;
      at::Tensor end = at::clamp_max(start + b.tokens.select(1, 1) % 3, s - 1);
      b.labels.push_back(at::stack({start, end}, 1));
      break;
    }
    case HeadKind::Decoder:
      b.labels.push_back(b.tokens.narrow(1, 0, c.targetSeq) % c.targetVocab);
      break;
    }
  }
  return b.to(device_);
}

} // namespace mtprt
