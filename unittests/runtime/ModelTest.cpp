//===- ModelTest.cpp - units, checkpoint regions, offload -----------------===//

#include "mtprt/torch/Model.h"
#include "mtprt/Memory.h"
#include "mtprt/torch/Regions.h"

#include "Fixtures.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>
#include <stdexcept>

using namespace mtprt;
using namespace fixtures;

namespace {

ModelConfig tinyConfig(double dropout) {
  ModelConfig c = tinyModel();
  c.vocab = 50;
  c.seq = 12;
  c.layers = 3;
  c.dropout = dropout;
  c.seed = 7;
  return c;
}

std::vector<HeadConfig> allHeads() {
  return {classifyHead("cls", 1, 3), tagHead("tag", 3, 5), spanHead("span", 2),
          decoderHead("gen", 3, 20, 6)};
}

/// Sum of every head's loss, with the backbone run as `regions` (each a
/// checkpoint) and the heads optionally under an offload scope.
at::Tensor totalLoss(const Model &m, const Batch &b,
                     const std::vector<std::pair<int64_t, int64_t>> &regions,
                     Offloader *offloader = nullptr) {
  std::vector<at::Tensor> taps(m.config().layers + 1);
  at::Tensor x = b.tokens;
  int64_t u = 0;
  auto recordTap = [&](int64_t unit, const at::Tensor &v) {
    if (unit % 2 == 0)
      taps[unit / 2] = v;
  };
  while (u < m.numUnits()) {
    int64_t last = u;
    for (const auto &r : regions)
      if (r.first == u)
        last = r.second;
    if (last > u) {
      // The layers the region touches (0 = the embedding tables).
      std::vector<at::Tensor> params;
      for (int64_t l = (u + 1) / 2; l <= (last + 1) / 2; ++l)
        for (const at::Tensor &p : m.layerParameters(l))
          params.push_back(p);
      x = checkpoint(
          [&m, u, last](const at::Tensor &in) {
            return m.runUnits(u, last, in);
          },
          x, params);
    } else {
      x = m.unit(u, x);
    }
    recordTap(last, x);
    u = last + 1;
  }
  at::Tensor total = at::zeros({}, at::kFloat);
  for (int64_t h = 0; h < m.numHeads(); ++h) {
    std::unique_ptr<Offloader::Scope> scope;
    if (offloader)
      scope = std::make_unique<Offloader::Scope>(*offloader,
                                                 "head" + std::to_string(h));
    const at::Tensor &tap = taps[m.heads()[h].tap];
    total = total + m.loss(h, m.head(h, tap, b.labels[h]), b.labels[h]);
  }
  return total;
}

std::vector<at::Tensor> gradsOf(const Model &m, const at::Tensor &loss) {
  return torch::autograd::grad({loss}, m.parameters(), {}, false, false, true);
}

/// Bytes still allocated after `run`, beyond what it returns (the CPU
/// tracking allocator must be installed).
int64_t savedBy(const std::function<std::vector<at::Tensor>()> &run) {
  const int64_t before = cpuMemoryStats().currentBytes;
  std::vector<at::Tensor> out = run();
  int64_t outBytes = 0;
  for (const at::Tensor &o : out)
    outBytes += o.nbytes();
  return cpuMemoryStats().currentBytes - before - outBytes;
}

void expectSameGrads(const std::vector<at::Tensor> &a,
                     const std::vector<at::Tensor> &b, const Model &m) {
  ASSERT_EQ(a.size(), b.size());
  auto named = m.namedParameters();
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].defined(), b[i].defined()) << named[i].first;
    if (!a[i].defined())
      continue;
    EXPECT_TRUE(at::allclose(a[i], b[i], 1e-5, 1e-7))
        << named[i].first << " max diff "
        << (a[i] - b[i]).abs().max().item<float>();
  }
}

TEST(Model, UnitsShapesAndNames) {
  Model m(tinyConfig(0.1), allHeads());
  EXPECT_EQ(m.numUnits(), 7);
  EXPECT_EQ(m.unitName(0), "embed");
  EXPECT_EQ(m.unitName(3), "layer2.attn");
  EXPECT_EQ(m.unitName(6), "layer3.mlp");
  Batch b = m.syntheticBatch(4, 1);
  at::Tensor x = m.embed(b.tokens);
  EXPECT_EQ(x.sizes(), (at::IntArrayRef{4, 12, 16}));
  x = m.attention(1, x);
  x = m.mlp(1, x);
  EXPECT_EQ(x.sizes(), (at::IntArrayRef{4, 12, 16}));
  EXPECT_EQ(m.head(0, x)[0].sizes(), (at::IntArrayRef{4, 3}));
  EXPECT_EQ(m.head(1, x)[0].sizes(), (at::IntArrayRef{4, 12, 5}));
  EXPECT_EQ(m.head(2, x).size(), 2u);
  EXPECT_EQ(m.head(3, x, b.labels[3])[0].sizes(), (at::IntArrayRef{4, 6, 20}));
  for (int64_t h = 0; h < 4; ++h) {
    at::Tensor l = m.loss(h, m.head(h, x, b.labels[h]), b.labels[h]);
    EXPECT_EQ(l.dim(), 0);
    EXPECT_TRUE(std::isfinite(l.item<double>()));
  }
}

TEST(Model, DeterministicInitAndParameterGroups) {
  Model a(tinyConfig(0.0), allHeads()), b(tinyConfig(0.0), allHeads());
  auto pa = a.namedParameters(), pb = b.namedParameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_TRUE(at::equal(pa[i].second, pb[i].second)) << pa[i].first;
  }
  ModelConfig other = tinyConfig(0.0);
  other.seed = 8;
  Model c(other, allHeads());
  EXPECT_FALSE(at::equal(a.parameters()[0], c.parameters()[0]));
  int64_t total = 0;
  for (const at::Tensor &p : a.backboneParameters())
    total += p.numel();
  for (int64_t h = 0; h < a.numHeads(); ++h)
    for (const at::Tensor &p : a.headParameters(h))
      total += p.numel();
  EXPECT_EQ(total, a.numParameters());
  EXPECT_EQ(a.layerParameters(2).size(), 12u);
}

TEST(Model, ConfigErrorsNameTheField) {
  auto expectError = [](ModelConfig c, std::vector<HeadConfig> h,
                        const std::string &field) {
    try {
      Model m(c, h);
      ADD_FAILURE() << "no error for " << field;
    } catch (const std::invalid_argument &e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos)
          << e.what();
    }
  };
  ModelConfig c = tinyConfig(0.0);
  c.heads = 3;
  expectError(c, allHeads(), "ModelConfig.heads");
  c = tinyConfig(0.0);
  c.dropout = 1.0;
  expectError(c, allHeads(), "ModelConfig.dropout");
  c = tinyConfig(0.0);
  c.device = "tpu";
  expectError(c, allHeads(), "ModelConfig.device");
  auto h = allHeads();
  h[1].tap = 9;
  expectError(tinyConfig(0.0), h, "HeadConfig[1].tap");
  h = allHeads();
  h[2].name = "cls";
  expectError(tinyConfig(0.0), h, "HeadConfig[2].name");
  h = allHeads();
  h[1].loss = LossKind::Mse;
  expectError(tinyConfig(0.0), h, "HeadConfig[1].loss");
}

/// The saved-bytes contract of docs/runtime.md, unit by unit: bytes still
/// allocated after a unit's forward, minus its outputs, with its input
/// already alive. fp32, dropout on, ATen's pointwise ops.
TEST(Model, SavedBytesPerUnitMatchTheContract) {
  installCpuMemoryTracking();
  ModelConfig c = tinyConfig(0.1);
  c.pointwise = PointwiseKind::Aten;
  auto heads = allHeads();
  for (HeadConfig &h : heads)
    h.tap = 1;
  Model m(c, heads);
  const int64_t B = 4, S = c.seq, H = c.hidden, nh = c.heads, F = c.ffn, f = 4;
  const int64_t T = heads[3].targetSeq, V = heads[3].targetVocab;
  Batch b = m.syntheticBatch(B, 1);
  at::Tensor x = m.embed(b.tokens).detach().requires_grad_(true);
  auto attention = [&](int64_t s, int64_t kv) { // kv = key/value length
    return 2 * B * s * f + B * s * H * f + B * s * H * f + 2 * B * kv * H * f +
           B * nh * s * kv * (f + 1 + f) + B * s * H * f + B * s * H;
  };
  auto mlp = [&](int64_t s) {
    return 2 * B * s * f + B * s * H * f + 2 * B * s * F * f + B * s * H;
  };
  EXPECT_EQ(savedBy([&] { return std::vector<at::Tensor>{m.embed(b.tokens)}; }),
            B * S * H);
  EXPECT_EQ(savedBy([&] { return std::vector<at::Tensor>{m.attention(1, x)}; }),
            attention(S, S));
  EXPECT_EQ(savedBy([&] { return std::vector<at::Tensor>{m.mlp(1, x)}; }),
            mlp(S));
  auto headAndLoss = [&](int64_t h) {
    return [&, h] {
      return std::vector<at::Tensor>{
          m.loss(h, m.head(h, x, b.labels[h]), b.labels[h])};
    };
  };
  const int64_t lossScalar = f; // nll's total_weight (the loss is the output)
  const int64_t cls = heads[0].classes, tags = heads[1].classes;
  EXPECT_EQ(savedBy(headAndLoss(0)),
            2 * B * f + 2 * B * H * f + B * cls * f + lossScalar);
  EXPECT_EQ(savedBy(headAndLoss(1)),
            2 * B * S * f + B * S * H * f + B * S * tags * f + lossScalar);
  // span: start and end log-probabilities, two nll weights, the two losses
  // summed before the 0.5 (kept: the sum is an intermediate, not saved; the
  // per-loss scalars are inputs of the add).
  const int64_t span = savedBy(headAndLoss(2));
  EXPECT_EQ(span,
            2 * B * S * f + B * S * H * f + 2 * B * S * f + 2 * lossScalar);
  // decoder (1 layer): its input ids and embedding mask, the embedded input,
  // the causal mask, self-attention, the self-attention output (cross norm
  // input), cross-attention (norms of both sides, q over T, k/v over S), the
  // cross output (MLP input), the MLP, the MLP output (final norm input), the
  // final norm, the log-probabilities.
  const int64_t decoder =
      B * T * 8 + B * T * H + B * T * H * f + T * T + attention(T, T) +
      B * T * H * f + (attention(T, S) + 2 * B * S * f + B * S * H * f) +
      B * T * H * f + mlp(T) + B * T * H * f + 2 * B * T * f + B * T * H * f +
      B * T * V * f + lossScalar;
  EXPECT_EQ(savedBy(headAndLoss(3)), decoder);
}

/// The bf16 (CPU autocast) rows: norms keep fp32 statistics and cast their
/// output to bf16 for the next linear; everything after a linear/matmul is
/// bf16 (q, k, v, softmax output, dropped probabilities, context, up and GELU
/// outputs); masks stay 1 byte; the residual stream and the loss's
/// log-probabilities stay fp32. The first forward also caches a bf16 copy of
/// every weight and bias it casts (live until autocast's cache is cleared).
/// Fused attention (one scaled_dot_product_attention kernel) against the
/// math path, same parameters and batch, dropout 0: the same losses and
/// gradients (fp32, 1e-5), through every head kind (the decoder's causal
/// self-attention and its cross-attention included).
TEST(Attention, FusedGradientsEqualTheMathPath) {
  ModelConfig c = tinyConfig(0.0);
  c.attention = AttentionKind::Math;
  Model math(c, allHeads());
  c.attention = AttentionKind::Fused;
  Model fused(c, allHeads());
  EXPECT_FALSE(math.fusedAttention());
  EXPECT_TRUE(fused.fusedAttention());
  Batch b = math.syntheticBatch(4, 3);
  at::Tensor lm = totalLoss(math, b, {}), lf = totalLoss(fused, b, {});
  EXPECT_NEAR(lm.item<float>(), lf.item<float>(), 1e-5);
  auto gm = gradsOf(math, lm), gf = gradsOf(fused, lf);
  ASSERT_EQ(gm.size(), gf.size());
  auto named = math.namedParameters();
  for (size_t i = 0; i < gm.size(); ++i) {
    ASSERT_TRUE(gm[i].defined() && gf[i].defined()) << named[i].first;
    const double diff = (gm[i] - gf[i]).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5) << named[i].first;
  }
}

/// Where no fused kernel takes the dropout (training on the CPU with
/// dropout > 0) a fused config runs the math path; in eval it is fused.
TEST(Attention, FusedFallsBackToMathForCpuDropout) {
  ModelConfig c = tinyConfig(0.1);
  c.attention = AttentionKind::Fused;
  Model m(c, allHeads());
  EXPECT_FALSE(m.fusedAttention());
  m.setTraining(false);
  EXPECT_TRUE(m.fusedAttention());
}

/// The fused rows of the saved-bytes contract (dropout 0): the attention
/// block keeps its norm's statistics and output, the fused QKV output
/// (q, k and v are views of it), the fp32 log-sum-exp and the kernel's
/// output (the out-projection's input, a view after the head merge) — no
/// S×S tensor; the decoder keeps no causal mask.
TEST(Attention, FusedSavedBytesMatchTheContract) {
  installCpuMemoryTracking();
  ModelConfig c = tinyConfig(0.0);
  c.attention = AttentionKind::Fused;
  c.pointwise = PointwiseKind::Aten;
  auto heads = allHeads();
  for (HeadConfig &h : heads)
    h.tap = 1;
  Model m(c, heads);
  const int64_t B = 4, S = c.seq, H = c.hidden, nh = c.heads, F = c.ffn, f = 4;
  const int64_t T = heads[3].targetSeq, V = heads[3].targetVocab;
  Batch b = m.syntheticBatch(B, 1);
  at::Tensor x = m.embed(b.tokens).detach().requires_grad_(true);
  // s queries over kv keys: norm stats and output, q (in the fused QKV or
  // its own projection), k and v, log-sum-exp, the context.
  auto attention = [&](int64_t s, int64_t kv) {
    return 2 * B * s * f + B * s * H * f + B * s * H * f + 2 * B * kv * H * f +
           B * nh * s * f + B * s * H * f;
  };
  auto mlp = [&](int64_t s) {
    return 2 * B * s * f + B * s * H * f + 2 * B * s * F * f;
  };
  EXPECT_EQ(savedBy([&] { return std::vector<at::Tensor>{m.attention(1, x)}; }),
            attention(S, S));
  const int64_t lossScalar = f;
  const int64_t decoder =
      B * T * 8 + B * T * H * f + attention(T, T) + B * T * H * f +
      (attention(T, S) + 2 * B * S * f + B * S * H * f) + B * T * H * f +
      mlp(T) + B * T * H * f + 2 * B * T * f + B * T * H * f + B * T * V * f +
      lossScalar;
  EXPECT_EQ(savedBy([&] {
              return std::vector<at::Tensor>{
                  m.loss(3, m.head(3, x, b.labels[3]), b.labels[3])};
            }),
            decoder);
}

/// The fused pointwise rows (fused attention, dropout 0): no norm output and
/// no GELU output is kept anywhere — the attention block keeps its norm's
/// statistics, the fused QKV output, the log-sum-exp and the context; the
/// MLP its norm's statistics and the up-projection's output; the heads'
/// norms only their statistics.
TEST(Pointwise, FusedSavedBytesMatchTheContract) {
  installCpuMemoryTracking();
  ModelConfig c = tinyConfig(0.0);
  c.attention = AttentionKind::Fused;
  c.pointwise = PointwiseKind::Fused;
  auto heads = allHeads();
  for (HeadConfig &h : heads)
    h.tap = 1;
  Model m(c, heads);
  const int64_t B = 4, S = c.seq, H = c.hidden, nh = c.heads, F = c.ffn, f = 4;
  const int64_t T = heads[3].targetSeq, V = heads[3].targetVocab;
  Batch b = m.syntheticBatch(B, 1);
  at::Tensor x = m.embed(b.tokens).detach().requires_grad_(true);
  auto attention = [&](int64_t s, int64_t kv) {
    return 2 * B * s * f + B * s * H * f + 2 * B * kv * H * f +
           B * nh * s * f + B * s * H * f;
  };
  auto mlp = [&](int64_t s) { return 2 * B * s * f + B * s * F * f; };
  EXPECT_EQ(savedBy([&] { return std::vector<at::Tensor>{m.attention(1, x)}; }),
            attention(S, S));
  EXPECT_EQ(savedBy([&] { return std::vector<at::Tensor>{m.mlp(1, x)}; }),
            mlp(S));
  auto headAndLoss = [&](int64_t h) {
    return [&, h] {
      return std::vector<at::Tensor>{
          m.loss(h, m.head(h, x, b.labels[h]), b.labels[h])};
    };
  };
  const int64_t lossScalar = f;
  const int64_t cls = heads[0].classes, tags = heads[1].classes;
  EXPECT_EQ(savedBy(headAndLoss(0)),
            2 * B * f + B * H * f + B * cls * f + lossScalar);
  EXPECT_EQ(savedBy(headAndLoss(1)),
            2 * B * S * f + B * S * tags * f + lossScalar);
  EXPECT_EQ(savedBy(headAndLoss(2)), 2 * B * S * f + 2 * B * S * f +
                                         2 * lossScalar);
  const int64_t decoder =
      B * T * 8 + B * T * H * f + attention(T, T) + B * T * H * f +
      (attention(T, S) + 2 * B * S * f) + B * T * H * f + mlp(T) +
      B * T * H * f + 2 * B * T * f + B * T * V * f + lossScalar;
  EXPECT_EQ(savedBy(headAndLoss(3)), decoder);
}

/// Fused pointwise kernels against ATen's ops, same parameters and batch:
/// the same losses and gradients (fp32, 1e-5) through every head kind,
/// without dropout (fused attention) and with it (math attention, the same
/// dropout masks: the kernels draw no random numbers).
TEST(Pointwise, FusedGradientsEqualTheAtenPath) {
  for (double dropout : {0.0, 0.1}) {
    SCOPED_TRACE("dropout " + std::to_string(dropout));
    ModelConfig c = tinyConfig(dropout);
    c.pointwise = PointwiseKind::Aten;
    Model aten(c, allHeads());
    c.pointwise = PointwiseKind::Fused;
    Model fused(c, allHeads());
    Batch b = aten.syntheticBatch(4, 3);
    at::manual_seed(5);
    at::Tensor la = totalLoss(aten, b, {});
    at::manual_seed(5);
    at::Tensor lf = totalLoss(fused, b, {});
    EXPECT_NEAR(la.item<float>(), lf.item<float>(), 1e-5);
    auto ga = gradsOf(aten, la), gf = gradsOf(fused, lf);
    ASSERT_EQ(ga.size(), gf.size());
    auto named = aten.namedParameters();
    for (size_t i = 0; i < ga.size(); ++i) {
      ASSERT_TRUE(ga[i].defined() && gf[i].defined()) << named[i].first;
      EXPECT_LE((ga[i] - gf[i]).abs().max().item<double>(), 1e-5)
          << named[i].first;
    }
  }
}

TEST(Model, Bf16SavedBytesPerUnitMatchTheContract) {
  installCpuMemoryTracking();
  ModelConfig c = tinyConfig(0.1);
  c.layers = 1;
  Model m(c, {tagHead("tag", 1, 5)});
  const int64_t B = 4, S = c.seq, H = c.hidden, nh = c.heads, F = c.ffn, C = 5;
  Batch b = m.syntheticBatch(B, 1);
  at::Tensor x = m.embed(b.tokens).detach().requires_grad_(true);
  at::autocast::set_autocast_enabled(at::kCPU, true);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  auto cur = [] { return cpuMemoryStats().currentBytes; };
  const int64_t stats = 2 * B * S * 4, act16 = B * S * H * 2;
  const int64_t attention = stats + act16 + 3 * act16 +
                            B * nh * S * S * (2 + 1 + 2) + act16 + B * S * H;
  const int64_t mlp = stats + act16 + 2 * B * S * F * 2 + B * S * H;
  const int64_t tag = stats + act16 + B * S * C * 4 + 4; // + nll weight
  auto weights = [](const std::vector<at::Tensor> &ps, size_t from, size_t to) {
    int64_t n = 0;
    for (size_t i = from; i < to; ++i)
      n += ps[i].numel() * 2;
    return n;
  };
  const auto lp =
      m.layerParameters(1); // attn: norm w,b, qkv w,b, out w,b; mlp: ...
  for (int pass = 0; pass < 2; ++pass) {
    int64_t before = cur();
    at::Tensor y = m.attention(1, x);
    EXPECT_EQ(y.scalar_type(), at::kFloat); // the residual stream stays fp32
    EXPECT_EQ(cur() - before - y.nbytes(),
              attention + (pass ? 0 : weights(lp, 2, 6)));
    before = cur();
    at::Tensor z = m.mlp(1, x);
    EXPECT_EQ(cur() - before - z.nbytes(),
              mlp + (pass ? 0 : weights(lp, 8, 12)));
    before = cur();
    at::Tensor l = m.loss(0, m.head(0, x), b.labels[0]);
    EXPECT_EQ(cur() - before - l.nbytes(),
              tag + (pass ? 0 : weights(m.headParameters(0), 2, 4)));
  }
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
}

TEST(Checkpoint, GradientsMatchThePlainRunWithDropout) {
  Model m(tinyConfig(0.2), allHeads());
  Batch b = m.syntheticBatch(4, 3);
  at::manual_seed(11);
  auto plain = gradsOf(m, totalLoss(m, b, {}));
  // Every layer a region, and one region spanning embeddings + layer 1.
  at::manual_seed(11);
  auto perLayer = gradsOf(m, totalLoss(m, b, {{1, 2}, {3, 4}, {5, 6}}));
  expectSameGrads(plain, perLayer, m);
  at::manual_seed(11);
  auto wide = gradsOf(m, totalLoss(m, b, {{0, 2}, {3, 4}, {5, 6}}));
  expectSameGrads(plain, wide, m);
  // The recompute replays the region's RNG without disturbing the caller's.
  at::manual_seed(11);
  totalLoss(m, b, {}).backward();
  at::Tensor after = at::rand({4});
  at::manual_seed(11);
  totalLoss(m, b, {{1, 2}, {3, 4}, {5, 6}}).backward();
  EXPECT_TRUE(at::equal(after, at::rand({4})));
}

TEST(Checkpoint, SavesOnlyTheBoundary) {
  installCpuMemoryTracking();
  ModelConfig c = tinyConfig(0.1);
  c.layers = 1;
  auto heads = allHeads();
  for (HeadConfig &h : heads)
    h.tap = 1;
  Model m(c, heads);
  Batch b = m.syntheticBatch(8, 3);
  at::Tensor x = m.embed(b.tokens).detach().requires_grad_(true);
  auto params = m.layerParameters(1);
  const int64_t before = cpuMemoryStats().currentBytes;
  at::Tensor y = checkpoint(
      [&](const at::Tensor &in) { return m.runUnits(1, 2, in); }, x, params);
  const int64_t kept = cpuMemoryStats().currentBytes - before;
  // The output, plus the saved CPU generator state (a few KB).
  EXPECT_GE(kept, y.nbytes());
  EXPECT_LT(kept, y.nbytes() + 8192);
  at::Tensor plain = m.runUnits(1, 2, x);
  EXPECT_GT(cpuMemoryStats().currentBytes - before - kept, 4 * y.nbytes());
}

TEST(Checkpoint, PartialGradComputesOnlyWhatItIsAskedFor) {
  // The cosine probe's autograd::grad to one layer's parameters through a
  // region, whose backward then computes only those (needs_input_grad): the
  // same gradients as without the region, nothing accumulated elsewhere.
  Model m(tinyConfig(0.2), allHeads());
  Batch b = m.syntheticBatch(4, 3);
  at::Tensor x = m.embed(b.tokens).detach().requires_grad_(true);
  std::vector<at::Tensor> params = m.layerParameters(1);
  for (const at::Tensor &p : m.layerParameters(2))
    params.push_back(p);
  const std::vector<at::Tensor> asked = m.layerParameters(2);
  at::manual_seed(5);
  at::Tensor plain = m.runUnits(1, 4, x);
  auto want = torch::autograd::grad({plain}, asked, {at::ones_like(plain)});
  at::manual_seed(5);
  at::Tensor y = checkpoint(
      [&](const at::Tensor &in) { return m.runUnits(1, 4, in); }, x, params);
  auto got = torch::autograd::grad({y}, asked, {at::ones_like(y)},
                                   /*retain_graph=*/true);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(at::allclose(got[i], want[i], 1e-5, 1e-7)) << i;
  EXPECT_FALSE(x.grad().defined());
  for (const at::Tensor &p : params)
    EXPECT_FALSE(p.grad().defined());
  // A full backward afterwards still reaches everything.
  y.sum().backward();
  EXPECT_TRUE(x.grad().defined());
  for (const at::Tensor &p : params)
    EXPECT_TRUE(p.grad().defined());
}

TEST(Offload, GradientsMatchAndHostPoolIsNotDeviceMemory) {
  installCpuMemoryTracking();
  Model m(tinyConfig(0.2), allHeads());
  Batch b = m.syntheticBatch(4, 5);
  at::manual_seed(3);
  auto plain = gradsOf(m, totalLoss(m, b, {}));
  Offloader off({0.0, /*minBytes=*/512});
  at::manual_seed(3);
  at::Tensor loss = totalLoss(m, b, {{1, 2}}, &off);
  off.synchronize();
  OffloadStats s = off.stats();
  EXPECT_GT(s.offloadedTensors, 0);
  EXPECT_GT(s.hostBytes, 0);
  EXPECT_EQ(s.hostBytes, hostPoolBytes());
  for (int64_t h = 0; h < m.numHeads(); ++h)
    off.prefetch("head" + std::to_string(h));
  off.synchronize();
  auto offloaded = gradsOf(m, loss);
  expectSameGrads(plain, offloaded, m);
  s = off.stats();
  EXPECT_EQ(s.misses, 0) << s.hits << " hits of " << s.offloadedTensors;
  EXPECT_GE(s.hits, s.offloadedTensors); // a copy saved twice is used twice
  EXPECT_DOUBLE_EQ(s.hitRate(), 1.0);
  loss.reset();
  EXPECT_EQ(hostPoolBytes(), 0); // freed with the graph
  // The same step again reuses the pool's buffers.
  const int64_t reserved = hostPoolReservedBytes();
  EXPECT_GE(reserved, s.hostPeakBytes);
  at::manual_seed(3);
  loss = totalLoss(m, b, {{1, 2}}, &off);
  off.synchronize();
  EXPECT_GT(hostPoolBytes(), 0);
  EXPECT_EQ(hostPoolReservedBytes(), reserved);
  loss.reset();
  releaseHostPoolCache();
  EXPECT_EQ(hostPoolReservedBytes(), 0);
}

TEST(Offload, SlowCopiesShowMissesAndTheWait) {
  Model m(tinyConfig(0.0), allHeads());
  Batch b = m.syntheticBatch(4, 5);
  Offloader off({/*copyDelayS=*/0.005, /*minBytes=*/1024});
  at::Tensor loss = totalLoss(m, b, {}, &off);
  off.synchronize();
  // Prefetch only head 0, right before the backward: too late to be ready.
  off.prefetch("head0");
  gradsOf(m, loss);
  OffloadStats s = off.stats();
  EXPECT_GT(s.misses, 0);
  EXPECT_GE(s.waitS, 0.005 * s.misses * 0.9);
  double maxWait = 0;
  for (const OffloadRecord &r : off.records()) {
    EXPECT_EQ(r.hit, r.waitS == 0.0);
    maxWait = std::max(maxWait, r.waitS);
  }
  EXPECT_GE(maxWait, 0.004);
  EXPECT_LT(s.hitRate(), 1.0);

  // Prefetched early enough (and waited out before backward): all hits.
  off.resetStats();
  off.setCopyDelay(0.001);
  loss = totalLoss(m, b, {}, &off);
  for (int64_t h = 0; h < m.numHeads(); ++h)
    off.prefetch("head" + std::to_string(h));
  off.synchronize();
  gradsOf(m, loss);
  EXPECT_EQ(off.stats().misses, 0);
  EXPECT_GT(off.stats().hits, 0);
}

TEST(Offload, RegionBoundaryOffload) {
  Model m(tinyConfig(0.2), allHeads());
  Batch b = m.syntheticBatch(4, 9);
  at::manual_seed(5);
  auto plain = gradsOf(m, totalLoss(m, b, {}));
  // An offload scope around a checkpoint region offloads its boundary input.
  Offloader off({0.0, 1024});
  at::Tensor x = m.embed(b.tokens);
  at::manual_seed(5);
  x = m.embed(b.tokens);
  at::Tensor h1;
  {
    Offloader::Scope scope(off, "region1");
    h1 = checkpoint([&](const at::Tensor &in) { return m.runUnits(1, 2, in); },
                    x, m.layerParameters(1));
  }
  EXPECT_EQ(off.stats().offloadedTensors, 1);
  at::Tensor h2 = m.runUnits(3, 4, h1), h3 = m.runUnits(5, 6, h2);
  std::vector<at::Tensor> taps{x, h1, h2, h3};
  at::Tensor total = at::zeros({}, at::kFloat);
  for (int64_t h = 0; h < m.numHeads(); ++h)
    total = total + m.loss(h, m.head(h, taps[m.heads()[h].tap], b.labels[h]),
                           b.labels[h]);
  off.prefetch("region1");
  expectSameGrads(plain, gradsOf(m, total), m);
  EXPECT_EQ(off.stats().hits + off.stats().misses, 1);
}

/// The backbone with every layer block at tensor grain (or kept), the heads
/// on their taps; every parameter's gradient of the summed losses.
std::vector<at::Tensor> gradsWithBlocks(const Model &m, const Batch &b,
                                        bool partial) {
  std::vector<at::Tensor> taps(m.config().layers + 1);
  at::Tensor x = b.tokens;
  for (int64_t u = 0; u < m.numUnits(); ++u) {
    x = partial && u > 0 ? m.unitPartial(u, x) : m.unit(u, x);
    if (u % 2 == 0)
      taps[u / 2] = x;
  }
  at::Tensor total = at::zeros({}, at::kFloat);
  for (int64_t h = 0; h < m.numHeads(); ++h)
    total = total + m.loss(h, m.head(h, taps[m.heads()[h].tap], b.labels[h]),
                           b.labels[h]);
  return gradsOf(m, total);
}

/// `grads(partial)`: every parameter's gradient with the blocks kept
/// (false) or at tensor grain (true) — equal bit for bit, one re-run per
/// layer block.
void expectKeptEqualsPartial(
    const Model &m, const std::function<std::vector<at::Tensor>(bool)> &grads,
    const std::string &what) {
  const std::vector<at::Tensor> kept = grads(false);
  const int64_t runs = Recomputed::runs();
  const std::vector<at::Tensor> partial = grads(true);
  EXPECT_EQ(Recomputed::runs() - runs, 2 * m.config().layers) << what;
  auto named = m.namedParameters();
  ASSERT_EQ(kept.size(), partial.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    ASSERT_EQ(kept[i].defined(), partial[i].defined()) << named[i].first;
    if (kept[i].defined())
      EXPECT_TRUE(at::equal(kept[i], partial[i]))
          << named[i].first << " (" << what << ")";
  }
}

/// Tensor grain (the plan's Decision::Partial): each block's projection
/// outputs re-created in the backward give the gradients of keeping them,
/// bit for bit, with one re-run per block — fused and ATen pointwise ops.
TEST(TensorGrain, GradientsEqualKeepingBitForBit) {
  for (PointwiseKind pointwise : {PointwiseKind::Fused, PointwiseKind::Aten}) {
    ModelConfig c = tinyConfig(0.0);
    c.attention = AttentionKind::Fused;
    c.pointwise = pointwise;
    Model m(c, allHeads());
    Batch b = m.syntheticBatch(4, 3);
    expectKeptEqualsPartial(
        m, [&](bool partial) { return gradsWithBlocks(m, b, partial); },
        pointwise == PointwiseKind::Fused ? "pointwise fused"
                                          : "pointwise aten");
  }
}

/// bf16 autocast on the CPU while alive (the trainer's PrecisionGuard: the
/// forward under it, the backward not); `cache`: weight casts cached.
struct Bf16Autocast {
  explicit Bf16Autocast(bool cache = true) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_cache_enabled(cache);
  }
  ~Bf16Autocast() {
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::set_autocast_cache_enabled(true);
    at::autocast::clear_cache();
  }
};

/// Under bf16 autocast (ATen pointwise ops, what the planner picks there):
/// the re-run replays autocast, so the re-created 16-bit norm copies, QKV,
/// up-projection and GELU outputs are the forward's bits, and so are the
/// gradients.
TEST(TensorGrain, GradientsEqualKeepingBitForBitUnderBf16) {
  ModelConfig c = tinyConfig(0.0);
  c.attention = AttentionKind::Fused;
  c.pointwise = PointwiseKind::Aten;
  Model m(c, allHeads());
  Batch b = m.syntheticBatch(4, 3);
  auto grads = [&](bool partial) {
    std::vector<at::Tensor> taps(c.layers + 1);
    at::Tensor total;
    {
      Bf16Autocast autocast;
      EXPECT_TRUE(!partial || m.partialServes(1));
      at::Tensor x = b.tokens;
      for (int64_t u = 0; u < m.numUnits(); ++u) {
        x = partial && u > 0 ? m.unitPartial(u, x) : m.unit(u, x);
        if (u % 2 == 0)
          taps[u / 2] = x;
      }
      EXPECT_EQ(taps[1].scalar_type(), at::kFloat); // the residual stream
      total = at::zeros({}, at::kFloat);
      for (int64_t h = 0; h < m.numHeads(); ++h)
        total = total + m.loss(h, m.head(h, taps[m.heads()[h].tap], b.labels[h]),
                               b.labels[h]);
    }
    return gradsOf(m, total);
  };
  expectKeptEqualsPartial(m, grads, "bf16");
}

/// What a block at tensor grain no longer keeps: the QKV projection's output
/// (and, with ATen pointwise ops, the norm's), the up-projection's (and the
/// norm's and the GELU's) — CostModel::projectionChain's outputs — beside
/// the random state it holds for the re-run (a few KB).
TEST(TensorGrain, KeepsLessByTheProjectionOutputs) {
  installCpuMemoryTracking();
  for (PointwiseKind pointwise : {PointwiseKind::Fused, PointwiseKind::Aten}) {
    ModelConfig c = tinyConfig(0.0);
    c.attention = AttentionKind::Fused;
    c.pointwise = pointwise;
    Model m(c, allHeads());
    const int64_t B = 4, S = c.seq, H = c.hidden, F = c.ffn, f = 4;
    const bool aten = pointwise == PointwiseKind::Aten;
    Batch b = m.syntheticBatch(B, 1);
    at::Tensor x = m.embed(b.tokens).detach().requires_grad_(true);
    for (int64_t u : {1, 2}) {
      const int64_t kept = savedBy([&] { return std::vector<at::Tensor>{m.unit(u, x)}; });
      const int64_t partial =
          savedBy([&] { return std::vector<at::Tensor>{m.unitPartial(u, x)}; });
      const int64_t dropped =
          u == 1 ? B * S * 3 * H * f + (aten ? B * S * H * f : 0)
                 : B * S * F * f + (aten ? B * S * H * f + B * S * F * f : 0);
      EXPECT_GE(kept - partial, dropped - 8192) << "unit " << u;
      EXPECT_LE(kept - partial, dropped) << "unit " << u;
    }
  }
  // Under bf16 autocast (ATen pointwise ops): the same tensors at 2 bytes —
  // the norms' 16-bit copies the linears keep, not their fp32 outputs.
  ModelConfig c = tinyConfig(0.0);
  c.attention = AttentionKind::Fused;
  c.pointwise = PointwiseKind::Aten;
  Model m(c, allHeads());
  const int64_t B = 4, S = c.seq, H = c.hidden, F = c.ffn, e = 2;
  Batch b = m.syntheticBatch(B, 1);
  at::Tensor x = m.embed(b.tokens).detach().requires_grad_(true);
  Bf16Autocast autocast(/*cache=*/false); // each run its own weight copies
  for (int64_t u : {1, 2}) {
    const int64_t kept =
        savedBy([&] { return std::vector<at::Tensor>{m.unit(u, x)}; });
    const int64_t partial =
        savedBy([&] { return std::vector<at::Tensor>{m.unitPartial(u, x)}; });
    const int64_t dropped = u == 1 ? B * S * 3 * H * e + B * S * H * e
                                   : 2 * B * S * F * e + B * S * H * e;
    EXPECT_GE(kept - partial, dropped - 8192) << "bf16 unit " << u;
    EXPECT_LE(kept - partial, dropped) << "bf16 unit " << u;
  }
}

/// A re-created tensor that drew random numbers (dropout) is drawn again with
/// the forward's random state: the gradients of keeping it, bit for bit, and
/// the caller's random stream after the backward as if nothing re-ran.
TEST(TensorGrain, RecomputedRandomOpsGiveTheGradientsOfKeepingThem) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({8, 32});
  at::Tensor w = at::randn({32, 32}).requires_grad_(true);
  auto run = [&](bool recompute) {
    at::manual_seed(5);
    std::unique_ptr<Recomputed> recomputed;
    std::unique_ptr<Recomputed::Scope> scope;
    if (recompute) {
      recomputed = std::make_unique<Recomputed>(
          [&x, &w] {
            return std::vector<at::Tensor>{
                std::get<0>(at::native_dropout(at::matmul(x, w), 0.5, true))};
          },
          at::Device(at::kCPU));
      scope = std::make_unique<Recomputed::Scope>(*recomputed);
    }
    at::Tensor h = std::get<0>(at::native_dropout(at::matmul(x, w), 0.5, true));
    if (recompute)
      recomputed->add(h);
    at::Tensor loss = (h * h.sin()).sum(); // h saved twice: by mul and sin
    scope.reset();
    at::Tensor grad = torch::autograd::grad({loss}, {w})[0];
    return std::make_pair(grad, at::rand({4}));
  };
  auto [kept, keptAfter] = run(false);
  const int64_t runs = Recomputed::runs();
  auto [again, againAfter] = run(true);
  EXPECT_EQ(Recomputed::runs() - runs, 1);
  EXPECT_TRUE(at::equal(kept, again));
  EXPECT_TRUE(at::equal(keptAfter, againAfter));
}

TEST(TensorGrain, RefusesWhatItCannotReCreate) {
  ModelConfig c = tinyConfig(0.1); // dropout on the CPU: the math attention
  Model m(c, allHeads());
  Batch b = m.syntheticBatch(2, 1);
  at::Tensor x = m.embed(b.tokens);
  EXPECT_THROW(m.unitPartial(1, x), std::invalid_argument);
  EXPECT_NO_THROW(m.unitPartial(2, x)); // the MLP has no such copies
  EXPECT_THROW(m.unitPartial(0, b.tokens), std::out_of_range);
  // What the trainer asks before it runs a plan's block at tensor grain
  // (else it keeps the block whole and says so).
  EXPECT_FALSE(m.partialServes(1));
  EXPECT_TRUE(m.partialServes(2));
  EXPECT_FALSE(m.partialServes(0));
  {
    // The fused pointwise kernels serve fp32 only.
    at::autocast::set_autocast_enabled(at::kCPU, true);
    const bool underAutocast = m.partialServes(2);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    EXPECT_FALSE(underAutocast);
  }
}

/// A registered tensor written in place before an op saves it cannot be
/// re-created as it is: an error, not a wrong gradient.
TEST(TensorGrain, RefusesATensorWrittenInPlace) {
  const at::Tensor x = at::randn({4, 8});
  at::Tensor w = at::randn({8, 8}).requires_grad_(true);
  Recomputed recomputed(
      [&] { return std::vector<at::Tensor>{at::matmul(x, w)}; },
      at::Device(at::kCPU));
  Recomputed::Scope scope(recomputed);
  at::Tensor h = at::matmul(x, w);
  recomputed.add(h);
  h.add_(1.0);
  EXPECT_ANY_THROW((h * h).sum());
}

} // namespace
