//===- CostModel.cpp - the one source of bytes, FLOPs and time ------------===//
//
// Notation: B micro batch, S sequence, H hidden, a attention heads, d = H/a,
// F MLP width, e bytes per activation element. Saved tensors follow the
// runtime's ATen calls (docs/cost-model.md walks through each unit):
//   layer_norm      saves its input, mean and rstd ([.., 1] fp32 each)
//   linear          saves its input
//   gelu            saves its input
//   fused pointwise a linear after a norm or a GELU saves nothing of its own:
//                   backward recomputes the norm's output from its input and
//                   statistics, the GELU's from its input
//   softmax         saves its output
//   native_dropout  saves a one-byte mask
//   cross_entropy   log_softmax saves its output, nll_loss a scalar weight
//   matmul (4-D)    saves the [B*a, ., .] operands of its bmm; a strided view
//                   of the fused QKV output cannot be reshaped in place, so
//                   that operand is a contiguous copy
// FLOPs count multiply-adds as two; element-wise ops are small terms.
//
//===----------------------------------------------------------------------===//

#include "passes/CostModel.h"
#include "passes/PlanMemory.h"

#include "mtprt/Zero.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringMap.h"

#include <algorithm>
#include <cassert>
#include <cmath>

using namespace mlir;
using namespace mtp;

CostModel::CostModel(ModelOp model)
    : model(model), backbone(model.getBackbone()), budget(model.getBudget()) {
  preset = lookupDevicePreset(budget ? budget.getDevice() : "cpu");
  if (!preset)
    preset = lookupDevicePreset("cpu");
  if (budget) {
    batch = budget.getMicroBatch();
    precision = budget.getPrecision();
  }
  dropout = backbone.getDropout().convertToDouble() > 0.0;
  attentionKind = backbone.getAttention().value_or(fittingAttention(model));
  pointwiseKind = backbone.getPointwise().value_or(fittingPointwise(model));
}

PointwiseKind CostModel::fittingPointwise(ModelOp model) {
  // The fused kernels compute a LayerNorm before a linear and GELU's erf
  // form only.
  if (model.getBackbone().hasGeluTanh() || model.getBackbone().hasRmsNorm() ||
      model.getBackbone().isPostNorm())
    return PointwiseKind::aten;
  BudgetOp budget = model.getBudget();
  const bool autocast = budget && budget.getPrecision() != Precision::fp32;
  return fusedPointwiseServes(autocast) ? PointwiseKind::fused
                                        : PointwiseKind::aten;
}

AttentionKind CostModel::fittingAttention(ModelOp model) {
  // Llama's grouped, rotary attention runs the fused kernel only.
  if (model.getBackbone().isLlama())
    return AttentionKind::fused;
  BudgetOp budget = model.getBudget();
  const DevicePreset *preset =
      budget ? lookupDevicePreset(budget.getDevice()) : nullptr;
  const bool gpu = budget && (!preset || preset->isGpu);
  const double dropout = model.getBackbone().getDropout().convertToDouble();
  return fusedAttentionServes(gpu, dropout) ? AttentionKind::fused
                                            : AttentionKind::math;
}

//===----------------------------------------------------------------------===//
// Shapes and bytes
//===----------------------------------------------------------------------===//

int64_t CostModel::bytes(Type type) {
  auto tensorType = cast<RankedTensorType>(type);
  Type element = tensorType.getElementType();
  int64_t elementBytes = element.isInteger(1)
                             ? 1
                             : (element.getIntOrFloatBitWidth() + 7) / 8;
  return tensorType.getNumElements() * elementBytes;
}

Type CostModel::activationElementType() const {
  Builder b(model.getContext());
  switch (precision) {
  case Precision::fp32:
    return b.getF32Type();
  case Precision::bf16:
    return b.getBF16Type();
  case Precision::fp16:
    return b.getF16Type();
  }
  llvm_unreachable("unknown precision");
}

RankedTensorType CostModel::tensor(ArrayRef<int64_t> shape,
                                   Type element) const {
  return RankedTensorType::get(shape, element);
}

RankedTensorType CostModel::hiddenType() const {
  // The residual stream: fp32 at every precision (autocast promotes).
  return tensor({batch, backbone.getSeq(), backbone.getHidden()},
                Builder(model.getContext()).getF32Type());
}

RankedTensorType CostModel::tokensType() const {
  return tensor({batch, backbone.getSeq()},
                IntegerType::get(model.getContext(), 64));
}

RankedTensorType CostModel::labelsType(TaskOp task) const {
  Builder b(model.getContext());
  int64_t s = backbone.getSeq();
  switch (task.getHead()) {
  case HeadKind::classify:
    if (task.getLoss() == LossKind::mse)
      return tensor({batch, int64_t(*task.getClasses())}, b.getF32Type());
    return tensor({batch}, b.getI64Type());
  case HeadKind::tag:
    return tensor({batch, s}, b.getI64Type());
  case HeadKind::span:
    return tensor({batch, 2}, b.getI64Type());
  case HeadKind::decoder:
    return tensor({batch, int64_t(*task.getTargetSeq())}, b.getI64Type());
  }
  llvm_unreachable("unknown head kind");
}

RankedTensorType CostModel::lossType() const {
  return tensor({}, Builder(model.getContext()).getF32Type());
}

//===----------------------------------------------------------------------===//
// Units
//===----------------------------------------------------------------------===//

namespace {
/// Saved tensors of a pre-norm attention sub-block family, for queries of
/// length `t` attending to keys of length `s` (t = s for self-attention).
struct Dims {
  int64_t b, s, h, a, d, f;
};
} // namespace

namespace {
/// The backbone's linear units: what ZeRO-Offload's 16-bit weights hold in
/// bf16 (Model::projectionParameters, the runtime's list).
constexpr UnitKind kProjections[] = {UnitKind::qkv, UnitKind::attn_out,
                                     UnitKind::mlp_up, UnitKind::mlp_down};
} // namespace

UnitCost CostModel::unit(UnitKind kind, TaskOp task, int64_t layer) const {
  UnitCost cost = unfrozenUnit(kind, task);
  // 16-bit weights: the linear reads (and keeps) the parameter itself.
  if (parameterBytes(kind, task, layer) == 2)
    llvm::erase_if(cost.saved, [](const SavedTensor &t) {
      return t.name == "weight" || t.name == "bias";
    });
  if (task || layer < 0 || !frozen(layer))
    return cost;
  if (layer <= noGradTop())
    return withoutBackward(std::move(cost));
  // Frozen, with trainable layers below: autograd saves only what the input
  // gradients need. A linear no longer keeps its input (the weight's
  // gradient would read it) and computes the input gradient only; under
  // autocast its bias copy is not cached (the cache holds leaves that
  // require grad) and dies after the add.
  auto dropSaved = [&](StringRef name) {
    llvm::erase_if(cost.saved,
                   [&](const SavedTensor &t) { return t.name == name; });
  };
  switch (kind) {
  case UnitKind::qkv:
  case UnitKind::attn_out:
  case UnitKind::mlp_up:
  case UnitKind::mlp_down:
    cost.backwardNeedsInput = false;
    cost.bwdFlops = cost.fwdFlops;
    dropSaved("bias");
    break;
  case UnitKind::attn_norm:
  case UnitKind::mlp_norm:
  case UnitKind::final_norm:
    dropSaved("normed"); // RMSNorm's x·rstd, read by the weight's gradient
    break;
  default:
    break;
  }
  return cost;
}

UnitCost CostModel::withoutBackward(UnitCost cost) {
  // Under NoGradGuard: nothing kept, no backward; what the unit would keep
  // is made all the same and dies with the call (a transient).
  if (cost.noGradWorkspace >= 0) {
    cost.fwdWorkspace = cost.noGradWorkspace;
  } else {
    for (const SavedTensor &t : cost.saved)
      cost.fwdWorkspace += bytes(t.type);
  }
  cost.saved.clear();
  cost.backwardNeedsInput = cost.backwardNeedsOutput = false;
  cost.backwardAliases = 0;
  cost.bwdFlops = cost.bwdWorkspace = cost.bwdFreed = cost.bwdPending = 0;
  return cost;
}

UnitCost CostModel::evalUnit(UnitKind kind, TaskOp task) const {
  // Eval mode: dropout is the identity (no masks, no scaled copies).
  CostModel evaluation = *this;
  evaluation.dropout = false;
  return withoutBackward(evaluation.unfrozenUnit(kind, task));
}

UnitCost CostModel::unfrozenUnit(UnitKind kind, TaskOp task) const {
  Builder builder(model.getContext());
  // Under bf16/fp16 autocast, what a linear or matmul produces is 16-bit;
  // the residual stream stays fp32 (fp32 + bf16 promotes), and so do norm
  // statistics; a norm's output is kept as the 16-bit copy the next linear
  // casts, and each linear keeps the 16-bit copy of its weight and bias that
  // autocast made (docs/runtime.md §2).
  Type act = activationElementType();
  Type f32 = builder.getF32Type();
  Type mask = builder.getI1Type();
  const bool autocast = !act.isF32();
  const int64_t b = batch, s = backbone.getSeq(), h = backbone.getHidden(),
                a = backbone.getHeads(), d = backbone.getHeadDim(),
                f = backbone.getFfn();
  const int64_t e = bytes(tensor({1}, act));
  const int64_t bsh = b * s * h, bass = b * a * s * s;
  // The fused pointwise kernels recompute in backward what a linear after a
  // norm or a GELU would keep; the recomputed tensor has its input
  // gradient's size and is freed before that gradient is made, so it needs
  // no workspace of its own.
  const bool fusedPointwise = pointwiseKind == PointwiseKind::fused;
  auto stream = [&] { return tensor({b, s, h}, f32); };
  auto weights = [&](UnitCost &cost, int64_t out, int64_t in) {
    if (!autocast)
      return;
    cost.saved.push_back({"weight", tensor({out, in}, act)});
    cost.saved.push_back({"bias", tensor({out}, act)});
  };

  UnitCost cost;
  switch (kind) {
  case UnitKind::embed:
    cost.output = stream();
    if (dropout)
      cost.saved.push_back({"mask", tensor({b, s, h}, mask)});
    cost.backwardNeedsInput = true; // the token indices
    cost.fwdFlops = 2 * bsh;
    cost.bwdFlops = 2 * bsh;
    // The gathered embeddings live beside their sum until the add returns
    // (Llama adds no position table: the gather is the output).
    cost.fwdWorkspace = backbone.hasPositionTable() ? 4 * bsh : 0;
    if (backbone.isPostNorm()) {
      // BERT: word + position + type, then a LayerNorm, which keeps the
      // sum and its statistics; RoBERTa's embedding keeps its position ids.
      cost.saved.push_back({"sum", tensor({b, s, h}, f32)});
      cost.saved.push_back({"mean", tensor({b, s, 1}, f32)});
      cost.saved.push_back({"rstd", tensor({b, s, 1}, f32)});
      if (backbone.getPositionPad())
        cost.saved.push_back(
            {"position_ids", tensor({b, s}, builder.getI64Type())});
      cost.fwdFlops += 8 * bsh;
      cost.bwdFlops += 12 * bsh;
      cost.fwdWorkspace = 8 * bsh;
    }
    return cost;
  case UnitKind::final_norm:
  case UnitKind::attn_norm:
  case UnitKind::mlp_norm:
    if (kind == UnitKind::final_norm || backbone.hasRmsNorm()) {
      // fp32 like the stream it normalizes (a final norm: the heads read it
      // as they read a layer's output; their own linears cast under
      // autocast).
      cost.output = kind == UnitKind::final_norm ? stream()
                                                 : tensor({b, s, h}, act);
      cost.backwardNeedsInput = true;
      if (backbone.hasRmsNorm()) {
        // ATen's composite rms_norm: x·rsqrt(mean(x²) + eps), then ·weight;
        // the multiplications keep the rsqrt and the normalized x.
        cost.saved.push_back({"rstd", tensor({b, s, 1}, f32)});
        cost.saved.push_back({"normed", tensor({b, s, h}, f32)});
        cost.fwdFlops = 4 * bsh;
        cost.bwdFlops = 10 * bsh;
        // x² before its mean; in backward the normalized x's and x's
        // gradient terms.
        cost.fwdWorkspace = 4 * bsh;
        cost.bwdWorkspace = 8 * bsh;
        return cost;
      }
      cost.saved.push_back({"mean", tensor({b, s, 1}, f32)});
      cost.saved.push_back({"rstd", tensor({b, s, 1}, f32)});
      cost.fwdFlops = 8 * bsh;
      cost.bwdFlops = 12 * bsh;
      return cost;
    }
    // Post-norm (BERT): the norm of the residual sum is the block's output,
    // fp32 like the stream.
    cost.output = backbone.isPostNorm() ? stream() : tensor({b, s, h}, act);
    cost.saved.push_back({"mean", tensor({b, s, 1}, f32)});
    cost.saved.push_back({"rstd", tensor({b, s, 1}, f32)});
    cost.backwardNeedsInput = true;
    cost.fwdFlops = 8 * bsh;
    cost.bwdFlops = 12 * bsh;
    // The fp32 norm output until the cast copy is made.
    if (autocast)
      cost.fwdWorkspace = 4 * bsh;
    return cost;
  case UnitKind::qkv:
    if (backbone.isLlama()) {
      // The queries' and keys' rows, then the values': qk dies after the
      // rotation, v is kept by the attention core (counted there).
      const int64_t rows = (a + 2 * backbone.getKvHeadCount()) * d;
      cost.output = tensor({b, s, rows}, act);
      weights(cost, rows, h);
      cost.backwardNeedsInput = true;
      cost.fwdFlops = 2 * bsh * rows;
      cost.bwdFlops = 2 * cost.fwdFlops;
      return cost;
    }
    cost.output = tensor({b, s, 3 * h}, act);
    weights(cost, 3 * h, h);
    cost.backwardNeedsInput = !fusedPointwise;
    cost.fwdFlops = 2 * bsh * 3 * h;
    cost.bwdFlops = 2 * cost.fwdFlops + (fusedPointwise ? 4 * bsh : 0);
    return cost;
  case UnitKind::attn_core:
    cost.output = tensor({b, s, h}, act);
    if (backbone.isLlama()) {
      // Rotary q and k are new tensors (the rotation keeps only the shared
      // tables); the flash kernel keeps them, v (kv heads: grouped), its
      // output and the log-sum-exp.
      const int64_t kvd = backbone.getKvHeadCount() * d;
      cost.backwardNeedsOutput = true;
      cost.saved.push_back({"q_rotary", tensor({b, a, s, d}, act)});
      cost.saved.push_back({"k_rotary", tensor({b, s, kvd}, act)});
      cost.saved.push_back({"v", tensor({b, s, kvd}, act)});
      cost.saved.push_back({"logsumexp", tensor({b, a, s}, f32)});
      cost.fwdFlops = 4 * b * s * s * h + 5 * bass + 6 * b * s * (h + kvd);
      cost.bwdFlops = 10 * b * s * s * h + 5 * bass + 6 * b * s * (h + kvd);
      // The rotation's x·cos, rotate_half(x) and its ·sin beside the
      // kernel's buffers; in backward the q, k, v gradients in the kernel's
      // layout, then the rotation's terms.
      cost.fwdWorkspace =
          3 * e * bsh + flashAttentionBuffers(s, s, /*backward=*/false);
      cost.bwdWorkspace = e * (bsh + 2 * b * s * kvd) + 2 * e * bsh +
                          flashAttentionBuffers(s, s, /*backward=*/true);
      return cost;
    }
    if (attentionKind == AttentionKind::fused) {
      // scaled_dot_product_attention keeps q, k and v — strided views of
      // the fused QKV output, which they keep whole — its output (whose
      // merge into [B, S, H] is a view, kept once with attn_out's input)
      // and the fp32 log-sum-exp of every query row; no S×S tensor.
      cost.backwardNeedsInput = true;
      cost.backwardNeedsOutput = true;
      cost.saved.push_back({"logsumexp", tensor({b, a, s}, f32)});
      cost.fwdFlops = 4 * b * s * s * h + 5 * bass;
      // The backward recomputes the scores block by block.
      cost.bwdFlops = 10 * b * s * s * h + 5 * bass;
      cost.fwdWorkspace = flashAttentionBuffers(s, s, /*backward=*/false);
      // The kernel writes the q, k, v gradients in its own layout beside
      // its buffers, and returns: q, k and v (the saved QKV output) are
      // freed before the split's backward copies those into the QKV
      // gradient. So the QKV gradient (the unit's input gradient) stands
      // for the kernel's three in the unit's transient, not beside them
      // (measured: the kernel's allocations are the peak, the copy after
      // is lower by the freed QKV).
      cost.bwdWorkspace = flashAttentionBuffers(s, s, /*backward=*/true);
      return cost;
    }
    // q·scale, k^T and v as contiguous [B*a, ., .] bmm operands.
    cost.saved.push_back({"q", tensor({b, a, s, d}, act)});
    // A causal backbone's mask, made per layer, kept by masked_fill.
    if (backbone.isCausal())
      cost.saved.push_back({"causal", tensor({s, s}, mask)});
    cost.saved.push_back({"k_t", tensor({b, a, d, s}, act)});
    cost.saved.push_back({"probs", tensor({b, a, s, s}, act)});
    if (dropout) {
      cost.saved.push_back({"probs_mask", tensor({b, a, s, s}, mask)});
      cost.saved.push_back({"probs_dropped", tensor({b, a, s, s}, act)});
    }
    cost.saved.push_back({"v", tensor({b, a, s, d}, act)});
    cost.fwdFlops = 4 * b * s * s * h + 5 * bass + bsh;
    cost.bwdFlops = 8 * b * s * s * h + 5 * bass;
    // The scores are held until the core returns; the head-layout context
    // lives until it is merged into [B, S, H].
    cost.fwdWorkspace = e * (bass + bsh);
    cost.bwdWorkspace = e * (2 * bass + 3 * bsh);
    if (dropout) {
      // Its peak is inside the dropout's backward (grad · mask · scale):
      // the probabilities' incoming gradient and two [B, a, S, S] products
      // alive, after the probabilities-times-v backward has freed the
      // dropped probabilities and v (mtprt-run --profile-memory).
      cost.bwdWorkspace = 3 * e * bass;
      cost.bwdFreed = e * (bass + b * a * s * d);
    }
    {
      // Without autograd nothing holds the QKV projection (the unit's input)
      // once it is split into per-head q, k, v copies: beyond the input and
      // the output, the copies beside the input; then q·scale beside the
      // scores (the first matmul); then two [B, a, S, S] at once (the scores
      // and their masked copy, or the softmax's probabilities beside them),
      // the input gone. With dropout (a frozen layer runs in train mode)
      // the masked scores are held to the core's end: they, the
      // probabilities, their dropped copy and its mask at once, beside v.
      // A causal mask is made per layer.
      const int64_t dropped =
          dropout ? e * (3 * bass + bsh) + bytes(tensor({b, a, s, s}, mask))
                  : 0;
      cost.noGradWorkspace =
          std::max({e * 3 * bsh, e * (bsh + bass), e * 2 * bass, dropped}) +
          (backbone.isCausal() ? s * s : 0);
    }
    return cost;
  case UnitKind::attn_out:
    cost.output = tensor({b, s, h}, act);
    weights(cost, h, h);
    cost.backwardNeedsInput = true;
    cost.fwdFlops = 2 * bsh * h;
    cost.bwdFlops = 4 * bsh * h;
    return cost;
  case UnitKind::attn_residual:
  case UnitKind::mlp_residual:
    cost.output = stream();
    // The add hands its incoming gradient to the skip input, and to the
    // branch too unless dropout scales it into a new tensor.
    cost.backwardAliases = dropout ? 1 : 2;
    if (dropout) {
      cost.saved.push_back({"mask", tensor({b, s, h}, mask)});
      cost.fwdWorkspace = e * bsh; // the dropped branch before the add
    }
    cost.fwdFlops = 3 * bsh;
    cost.bwdFlops = 2 * bsh;
    return cost;
  case UnitKind::mlp_up:
    if (backbone.hasGatedMlp()) {
      // The gate's rows, then the up's: one output [B, S, 2F].
      cost.output = tensor({b, s, 2 * f}, act);
      weights(cost, 2 * f, h);
      cost.backwardNeedsInput = true;
      cost.fwdFlops = 4 * bsh * f;
      cost.bwdFlops = 8 * bsh * f;
      return cost;
    }
    cost.output = tensor({b, s, f}, act);
    weights(cost, f, h);
    cost.backwardNeedsInput = !fusedPointwise;
    cost.fwdFlops = 2 * bsh * f;
    cost.bwdFlops = 4 * bsh * f + (fusedPointwise ? 4 * bsh : 0);
    return cost;
  case UnitKind::mlp_act:
    if (backbone.hasGatedMlp()) {
      // silu(gate) · up: silu keeps the gate and the product keeps silu's
      // output and up (the gate and up are views of the up-projection's
      // output, which they keep whole).
      cost.output = tensor({b, s, f}, act);
      cost.backwardNeedsInput = true;
      cost.saved.push_back({"silu", tensor({b, s, f}, act)});
      cost.fwdFlops = 6 * b * s * f;
      cost.bwdFlops = 12 * b * s * f;
      cost.fwdWorkspace = 0;
      // No workspace beyond the incoming and the result gradients: the
      // halves' zero-filled [B, S, 2F] buffers (the narrows' backward) and
      // the product's and silu's gradients fit in what those free. Measured,
      // not derived: with 4F here the peak was over-predicted by 8-17% at
      // four sizes; with none, by 0.5-3.5% (docs/pretrained.md).
      cost.bwdWorkspace = 0;
      return cost;
    }
    cost.output = tensor({b, s, f}, act);
    cost.backwardNeedsInput = true;
    // The fused GELU backward scales the incoming gradient in place.
    cost.backwardAliases = fusedPointwise ? 1 : 0;
    cost.fwdFlops = 8 * b * s * f;
    cost.bwdFlops = 12 * b * s * f;
    return cost;
  case UnitKind::mlp_down:
    cost.output = tensor({b, s, h}, act);
    weights(cost, h, f);
    cost.backwardNeedsInput = !fusedPointwise;
    cost.fwdFlops = 2 * bsh * f;
    cost.bwdFlops = 4 * bsh * f + (fusedPointwise ? 8 * b * s * f : 0);
    if (fusedPointwise) {
      // Without autograd the fused GELU-linear still holds its input, the
      // up-projection (which the step's liveness ends at mlp_act), beside
      // the GELU it makes from it.
      cost.noGradWorkspace = cost.fwdWorkspace + e * b * s * f;
      for (const SavedTensor &t : cost.saved)
        cost.noGradWorkspace += bytes(t.type);
    }
    return cost;
  case UnitKind::head:
    return headCost(task);
  case UnitKind::loss:
    return lossCost(task);
  }
  llvm_unreachable("unknown unit kind");
}

SmallVector<UnitKind, 3> CostModel::projectionChain(bool attention) const {
  // Llama's blocks have no tensor-grain path in the runtime yet; the fused
  // pointwise kernels serve fp32 only (under autocast the norm's re-created
  // output is the 16-bit copy the linear keeps, Model::sinkable).
  if (backbone.isLlama() || backbone.isPostNorm() ||
      (!activationElementType().isF32() &&
       pointwiseKind == PointwiseKind::fused))
    return {};
  if (attention)
    return attentionKind == AttentionKind::fused
               ? SmallVector<UnitKind, 3>{UnitKind::attn_norm, UnitKind::qkv}
               : SmallVector<UnitKind, 3>{};
  if (pointwiseKind == PointwiseKind::fused)
    return {UnitKind::mlp_norm, UnitKind::mlp_up};
  return {UnitKind::mlp_norm, UnitKind::mlp_up, UnitKind::mlp_act};
}

int64_t CostModel::flashAttentionBuffers(int64_t queries, int64_t keys,
                                         bool backward) const {
  // LibTorch's flash CPU kernel tiles queries by 32 (64 from 192 rows, 256
  // from 768) and keys by 512, with per-thread fp32 buffers (and a 16-bit
  // copy of the score tile under autocast). One intra-op thread is assumed:
  // each further thread adds one more set (a few tens of KiB). The CUDA
  // kernels keep their tiles in shared memory.
  if (preset->isGpu)
    return 0;
  int64_t qs = queries >= 768 ? 256 : queries >= 192 ? 64 : 32;
  qs = std::min(qs, queries);
  const int64_t ks = std::min<int64_t>(512, keys);
  const int64_t d = backbone.getHeadDim();
  const int64_t e = bytes(tensor({1}, activationElementType()));
  const bool reduced = e < 4;
  if (!backward)
    return 4 * (qs * ks + 2 * qs + qs * d) + (reduced ? e * qs * ks : 0);
  // The score and score-gradient tiles, and (16-bit) their reduced copies
  // and an fp32 accumulator of the query-block gradient.
  return 4 * 2 * qs * ks + (reduced ? 2 * e * qs * ks + 4 * qs * d : 0);
}

UnitCost CostModel::headCost(TaskOp task) const {
  Builder builder(model.getContext());
  Type act = activationElementType();
  Type f32 = builder.getF32Type();
  Type mask = builder.getI1Type();
  const int64_t b = batch, s = backbone.getSeq(), h = backbone.getHidden(),
                a = backbone.getHeads(), d = backbone.getHeadDim(),
                f = backbone.getFfn();
  const int64_t e = bytes(tensor({1}, act));

  UnitCost cost;
  const bool autocast = !act.isF32();
  // With fused pointwise kernels, a linear after a norm or a GELU keeps
  // nothing (see unit()): no norm output, no GELU output.
  const bool fusedPointwise = pointwiseKind == PointwiseKind::fused;
  auto weights = [&](int64_t out, int64_t in) {
    if (!autocast)
      return;
    cost.saved.push_back({"weight", tensor({out, in}, act)});
    cost.saved.push_back({"bias", tensor({out}, act)});
  };
  // The head's LayerNorm keeps its input: the tap (or, for classify, a view
  // of it — which keeps the whole tap alive just the same).
  cost.backwardNeedsInput = true;
  // D13: the head reads its tap through the adapter (Model::adapt), which
  // keeps its bottleneck's ReLU output, the up-projection's output u and
  // the gate (its input's sequence mean m, g, 1 − g) for the backward; the
  // head's first op then keeps the adapted y instead of a view of the tap.
  // With the separation loss, Model::gateMean's own m and g live until the
  // micro-batch's last head backward (counted here, with the head's).
  const std::optional<mtprt::AdapterConfig> adapter = adapters();
  const int64_t rows = task.getHead() == HeadKind::classify ? 1 : s;
  const int64_t r = adapter ? adapter->bottleneck : 0;
  AdapterCost ad;
  if (adapter) {
    auto keep = [&](std::string name, RankedTensorType type) {
      ad.saved.push_back({std::move(name), type});
    };
    const bool shared = readsSharedAdapter(task);
    if (autocast) {
      // Autocast's bf16 copy of the input for the down-projection, and the
      // cast weights of both projections (a shared adapter's too: each
      // head's forward runs under its own autocast scope, whose cache ends
      // with it).
      keep("adapter.input", tensor({b, rows, h}, act));
      for (auto [out, in] : {std::pair<int64_t, int64_t>{r, h}, {h, r}}) {
        keep("adapter.weight", tensor({out, in}, act));
        keep("adapter.bias", tensor({out}, act));
      }
    }
    if (rows > 1)
      keep("adapter.mean", tensor({b, h}, f32));
    keep("adapter.gate", tensor({b, h}, f32));
    keep("adapter.open", tensor({b, h}, f32)); // 1 − g
    keep("adapter.relu", tensor({b, rows, r}, act));
    keep("adapter.up", tensor({b, rows, h}, act));
    keep("adapter.adapted", tensor({b, rows, h}, f32));
    if (adapter->separation > 0) {
      if (rows > 1)
        keep("adapter.summary_mean", tensor({b, h}, f32));
      keep("adapter.summary_gate", tensor({b, h}, f32));
    }
    const int64_t bsh = b * rows * h;
    // A shared adapter's gradient is the group's (StepTimeline counts it
    // at the first of its heads' backwards): the member holds its gate.
    ad.params = shared ? mtprt::AdapterConfig::gateParameters(h)
                       : mtprt::AdapterConfig::parameters(h, r);
    ad.fwdFlops = 4 * b * rows * h * r + 6 * bsh;
    // Forward: (1 − g)·u beside y as the sum is made. Backward, beside y's
    // gradient (the tap's, where it has one): u's gradient and the full
    // product for 1 − g's before autograd sums it to [B, 1, H]; then the
    // down-projection's input gradient beside the ReLU's.
    ad.fwdWorkspace = 4 * bsh;
    ad.bwdWorkspace = 4 * 2 * bsh + e * b * rows * r;
  }
  auto withAdapter = [&](UnitCost c) {
    c.saved.append(ad.saved.begin(), ad.saved.end());
    c.fwdFlops += ad.fwdFlops;
    c.bwdFlops += 2 * ad.fwdFlops;
    c.fwdWorkspace = std::max(c.fwdWorkspace, ad.fwdWorkspace);
    c.bwdWorkspace = std::max(c.bwdWorkspace, ad.bwdWorkspace);
    return c;
  };
  switch (task.getHead()) {
  case HeadKind::classify: {
    int64_t c = *task.getClasses();
    cost.output = tensor({b, c}, act);
    cost.saved = {{"mean", tensor({b, 1}, f32)}, {"rstd", tensor({b, 1}, f32)}};
    if (!fusedPointwise)
      cost.saved.push_back({"normed", tensor({b, h}, act)});
    cost.saved.push_back({"pooled", tensor({b, h}, act)});
    weights(h, h);
    weights(c, h);
    cost.fwdFlops = 2 * b * h * h + 2 * b * h * c + 12 * b * h;
    cost.bwdFlops = 2 * cost.fwdFlops;
    cost.fwdWorkspace = e * b * h; // the pooler's pre-tanh output
    return withAdapter(std::move(cost));
  }
  case HeadKind::tag:
  case HeadKind::span: {
    int64_t c = task.getHead() == HeadKind::tag ? int64_t(*task.getLabels()) : 2;
    cost.output = tensor({b, s, c}, act);
    cost.saved = {{"mean", tensor({b, s, 1}, f32)},
                  {"rstd", tensor({b, s, 1}, f32)}};
    if (!fusedPointwise)
      cost.saved.push_back({"normed", tensor({b, s, h}, act)});
    weights(c, h);
    cost.fwdFlops = 2 * b * s * h * c + 8 * b * s * h;
    cost.bwdFlops = 2 * cost.fwdFlops;
    return withAdapter(std::move(cost));
  }
  case HeadKind::decoder: {
    // A pre-norm decoder on T teacher-forced tokens: per layer a causal
    // self-attention block, cross-attention to the tap and an MLP block.
    const int64_t t = *task.getTargetSeq(), v = *task.getVocab(),
                  layers = *task.getLayers();
    const bool fused = attentionKind == AttentionKind::fused;
    cost.output = tensor({b, t, v}, act);
    // Its backward runs node by node: each phase (in forward order, the
    // embedding, then per layer self-attention, cross-attention and MLP, then
    // the final norm) frees its saved tensors once it has run and creates
    // its weights' gradients when it starts. A phase's output is freed with
    // the next phase, which keeps it as its input.
    struct Phase {
      int64_t saved = 0, out = 0, grads = 0, workspace = 0;
    };
    llvm::SmallVector<Phase> phases;
    int64_t savedTotal = 0, savedAtPhase = 0;
    auto endPhase = [&](int64_t params, int64_t workspace, int64_t out) {
      phases.push_back({savedTotal - savedAtPhase, out,
                        kGradientBytes * params, workspace});
      savedAtPhase = savedTotal;
    };
    auto add = [&](std::string name, RankedTensorType type) {
      savedTotal += bytes(type);
      cost.saved.push_back({std::move(name), type});
    };
    // What only the ATen path keeps: a norm's or the GELU's output.
    auto addUnfused = [&](std::string name, RankedTensorType type) {
      if (!fusedPointwise)
        add(std::move(name), type);
    };
    const int64_t bth = b * t * h, norm = 2 * h;
    // The adapter runs first and its backward last (every layer's
    // cross-attention reads the adapted tap, which it keeps to the end).
    if (adapter) {
      for (const SavedTensor &t : ad.saved)
        add(t.name, t.type);
      endPhase(ad.params, ad.bwdWorkspace, 0);
    }
    add("inputs", tensor({b, t}, builder.getI64Type()));
    add("embedded", tensor({b, t, h}, act));
    if (dropout)
      add("embed_mask", tensor({b, t, h}, mask));
    if (!fused)
      add("causal", tensor({t, t}, mask));
    endPhase(v * h + t * h, 0, e * bth);
    int64_t flops = 2 * b * t * h;
    // The widest backward transients: with the fused kernel the q, k, v
    // gradients in its layout beside its buffers; on the math path the
    // scores and their gradient.
    const int64_t selfWorkspace =
        fused ? e * 4 * bth + flashAttentionBuffers(t, t, true)
              : e * 2 * b * a * t * std::max(s, t);
    const int64_t crossWorkspace =
        fused ? e * (bth + 2 * b * s * h) +
                    flashAttentionBuffers(t, std::max(s, t), true)
              : e * 2 * b * a * t * std::max(s, t);
    for (int64_t l = 1; l <= layers; ++l) {
      std::string p = "l" + std::to_string(l) + ".";
      // Attention of t queries over k keys: the query side's norm, q, k^T,
      // the core, v, the context, the residual mask and the block's output.
      auto attention = [&](const std::string &q, int64_t k) {
        add(q + "mean", tensor({b, t, 1}, f32));
        add(q + "rstd", tensor({b, t, 1}, f32));
        addUnfused(q + "normed", tensor({b, t, h}, act));
        if (fused) {
          // The projections q, k, v are views of (self: one [B,T,3H]; cross:
          // [B,T,H] and [B,S,2H]), the log-sum-exp, and the output, which is
          // the out-projection's input (no causal mask: is_causal).
          add(q + "q", tensor({b, t, h}, act));
          add(q + "kv", tensor({b, k, 2 * h}, act));
          add(q + "logsumexp", tensor({b, a, t}, f32));
          add(q + "context", tensor({b, t, h}, act));
          if (dropout)
            add(q + "mask", tensor({b, t, h}, mask));
          add(q + "out", tensor({b, t, h}, act));
          return;
        }
        add(q + "q", tensor({b, a, t, d}, act));
        add(q + "k_t", tensor({b, a, d, k}, act));
        add(q + "probs", tensor({b, a, t, k}, act));
        if (dropout) {
          add(q + "probs_mask", tensor({b, a, t, k}, mask));
          add(q + "probs_dropped", tensor({b, a, t, k}, act));
        }
        add(q + "v", tensor({b, a, k, d}, act));
        add(q + "context", tensor({b, t, h}, act));
        if (dropout)
          add(q + "mask", tensor({b, t, h}, mask));
        add(q + "out", tensor({b, t, h}, act));
      };
      // Causal self-attention (its input, the previous block's output, is
      // counted there), then cross-attention with keys and values from the
      // normed tap.
      attention(p + "self.", t);
      endPhase(norm + 3 * h * h + 3 * h + h * h + h, selfWorkspace, e * bth);
      add(p + "cross.mem_mean", tensor({b, s, 1}, f32));
      add(p + "cross.mem_rstd", tensor({b, s, 1}, f32));
      addUnfused(p + "cross.memory", tensor({b, s, h}, act));
      attention(p + "cross.", s);
      endPhase(2 * norm + (h * h + h) + (2 * h * h + 2 * h) + (h * h + h),
               crossWorkspace, e * bth);
      // MLP.
      add(p + "mlp.mean", tensor({b, t, 1}, f32));
      add(p + "mlp.rstd", tensor({b, t, 1}, f32));
      addUnfused(p + "mlp.normed", tensor({b, t, h}, act));
      add(p + "mlp.up", tensor({b, t, f}, act));
      addUnfused(p + "mlp.act", tensor({b, t, f}, act));
      if (dropout)
        add(p + "mlp.mask", tensor({b, t, h}, mask));
      add(p + "mlp.out", tensor({b, t, h}, act));
      endPhase(norm + h * f + f + f * h + h, e * b * t * f, e * bth);
      flops += 2 * b * t * h * 3 * h + 4 * b * t * t * h + 2 * b * t * h * h // self
               + 2 * b * s * h * 2 * h + 2 * b * t * h * h +
               4 * b * t * s * h + 2 * b * t * h * h // cross
               + 4 * b * t * h * f;                 // mlp
    }
    add("final.mean", tensor({b, t, 1}, f32));
    add("final.rstd", tensor({b, t, 1}, f32));
    addUnfused("final.normed", tensor({b, t, h}, act));
    endPhase(norm + h * v + v, 0, 0);
    cost.fwdFlops = flops + 2 * b * t * h * v + ad.fwdFlops;
    cost.bwdFlops = 2 * cost.fwdFlops;
    // The forward's widest transient: the cross K/V's projection beside the
    // kernel's buffers, or (math) the cross-attention scores.
    cost.fwdWorkspace =
        fused ? e * 2 * b * s * h +
                    flashAttentionBuffers(t, std::max(s, t), false)
              : e * (b * a * t * std::max(s, t) + 2 * b * s * h);
    // Without autograd each phase's tensors die with the next phase: the
    // widest phase's beside the widest transient but the cross K/V
    // projection, which that phase's tensors already hold.
    int64_t widest = 0;
    for (const Phase &ph : phases)
      widest = std::max(widest, ph.saved);
    cost.noGradWorkspace = widest + cost.fwdWorkspace - e * 2 * b * s * h;
    cost.fwdWorkspace = std::max(cost.fwdWorkspace, ad.fwdWorkspace);
    // The backward's peak: the phase (run last to first) with the most
    // alive — what earlier phases saved, its own saved tensors but its
    // output, the gradients created so far, its workspace.
    int64_t gradsTotal = 0, best = -1;
    for (const Phase &ph : phases)
      gradsTotal += ph.grads;
    assert(gradsTotal == kGradientBytes * headParameters(task) &&
           "the phases' parameters are the head's");
    // At the params scope the head's backward keeps the graph: nothing is
    // freed there (the backbone backward frees it when it runs through).
    StrategyOp strategy = model.getStrategy();
    const bool retains =
        strategy && strategy.getGradientScope() == GradientScope::params;
    int64_t before = savedTotal, created = 0;
    for (const Phase &ph : llvm::reverse(phases)) {
      before -= ph.saved;
      created += ph.grads;
      int64_t alive = retains ? savedTotal : before + ph.saved - ph.out;
      if (alive + created + ph.workspace > best) {
        best = alive + created + ph.workspace;
        cost.bwdWorkspace = ph.workspace;
        cost.bwdFreed = savedTotal - alive;
        cost.bwdPending = gradsTotal - created;
      }
    }
    return cost;
  }
  }
  llvm_unreachable("unknown head kind");
}

UnitCost CostModel::lossCost(TaskOp task) const {
  Builder builder(model.getContext());
  Type f32 = builder.getF32Type();
  const int64_t b = batch, s = backbone.getSeq();
  UnitCost cost;
  cost.output = lossType();
  if (task.getLoss() == LossKind::mse) {
    cost.backwardNeedsInput = true;
    int64_t c = *task.getClasses();
    cost.fwdFlops = 3 * b * c;
    cost.bwdFlops = 2 * b * c;
    return cost;
  }
  // cross_entropy = log_softmax (saves its fp32 output) + nll_loss.
  int64_t rows = 0, classes = 0;
  switch (task.getHead()) {
  case HeadKind::classify:
    rows = b, classes = *task.getClasses();
    break;
  case HeadKind::tag:
    rows = b * s, classes = *task.getLabels();
    break;
  case HeadKind::span:
    rows = 2 * b, classes = s; // start and end, each over the sequence
    break;
  case HeadKind::decoder:
    rows = b * int64_t(*task.getTargetSeq()), classes = *task.getVocab();
    break;
  }
  // nll_loss also keeps its total weight, an fp32 scalar.
  if (task.getHead() == HeadKind::span) {
    cost.saved.push_back({"start_log_probs", tensor({b, s}, f32)});
    cost.saved.push_back({"start_weight", tensor({}, f32)});
    cost.saved.push_back({"end_log_probs", tensor({b, s}, f32)});
    cost.saved.push_back({"end_weight", tensor({}, f32)});
  } else {
    cost.saved.push_back({"log_probs", tensor({rows, classes}, f32)});
    cost.saved.push_back({"total_weight", tensor({}, f32)});
  }
  cost.fwdFlops = 5 * rows * classes;
  cost.bwdFlops = 3 * rows * classes;
  // nll_loss's input gradient beside log_softmax's (docs/runtime.md §2).
  cost.bwdWorkspace = 4 * rows * classes;
  return cost;
}

int64_t CostModel::blockRecomputeBytes(int64_t block) const {
  if (block < 1)
    return 0;
  static constexpr UnitKind attention[] = {
      UnitKind::attn_norm, UnitKind::qkv, UnitKind::attn_core,
      UnitKind::attn_out, UnitKind::attn_residual};
  static constexpr UnitKind mlp[] = {UnitKind::mlp_norm, UnitKind::mlp_up,
                                     UnitKind::mlp_act, UnitKind::mlp_down,
                                     UnitKind::mlp_residual};
  ArrayRef<UnitKind> kinds = block % 2 ? ArrayRef<UnitKind>(attention)
                                       : ArrayRef<UnitKind>(mlp);
  int64_t total = 0;
  const int64_t layer = (block + 1) / 2;
  for (size_t i = 0; i < kinds.size(); ++i) {
    UnitCost u = unit(kinds[i], {}, layer);
    for (const SavedTensor &t : u.saved)
      total += bytes(t.type);
    // The output, where its own backward or its reader's keeps it: the
    // block's last output is read by the next block's (or a head's) norm.
    bool read = i + 1 < kinds.size()
                    ? unit(kinds[i + 1], {}, layer).backwardNeedsInput
                    : true;
    if (read || u.backwardNeedsOutput)
      total += bytes(u.output);
  }
  return total;
}

SmallVector<std::pair<int64_t, int64_t>> CostModel::cosineProbePaths() const {
  // The runtime measures the cosine matrix for the DGFG gate and its
  // recalibration only: without the gate there is no probe.
  SmallVector<std::pair<int64_t, int64_t>> paths;
  StrategyOp strategy = model.getStrategy();
  if (!strategy || !strategy.getDgfgHidden())
    return paths;
  // Tasks reading a layer of the no-grad run have no tap gradient: they
  // take no part.
  SmallVector<int64_t> taps;
  for (TaskOp task : model.getTasks())
    if (int64_t(task.getTapLayer()) > noGradTop() &&
        (taskFilter.empty() ||
         llvm::any_of(taskFilter, [&](FlatSymbolRefAttr t) {
           return t.getValue() == task.getSymName();
         })))
      taps.push_back(task.getTapLayer());
  if (taps.size() < 2)
    return paths;
  const int64_t common = *llvm::min_element(taps);
  // Each task's tap gradient goes down to layer `common`'s parameters (the
  // embeddings' when a task taps them); frozen ones have no gradient, and
  // the runtime measures the cosines on the tap gradients themselves.
  if (frozen(common))
    return paths;
  for (int64_t tap : taps)
    paths.push_back({common == 0 ? 0 : 2 * common - 1, 2 * tap});
  return paths;
}

int64_t CostModel::probeMlpChain(int64_t layer) const {
  const int64_t b = batch, s = backbone.getSeq(), h = backbone.getHidden(),
                f = backbone.getFfn();
  // The up-projection's width: Llama's holds the gate's and the up's rows.
  const int64_t up = backbone.hasGatedMlp() ? 2 * f : f;
  // The residual stream's gradient is fp32; inside the MLP the activation
  // gradients have the activations' type (16-bit under autocast). SwiGLU's
  // backward adds a second zero-filled up-width buffer (one per half)
  // beside the accumulated one.
  const int64_t e = bytes(tensor({1}, activationElementType()));
  return 4 * b * s * h + e * b * s * (up + f) +
         parameterBytes(UnitKind::mlp_up, {}, layer) * (h * up + h) +
         (backbone.hasGatedMlp() ? e * b * s * up : 0);
}

int64_t CostModel::partialProbePath(int64_t block) const {
  const bool attention = block % 2 == 1;
  const int64_t layer = (block + 1) / 2;
  const int64_t b = batch, s = backbone.getSeq(), h = backbone.getHidden(),
                f = backbone.getFfn();
  const int64_t e = bytes(tensor({1}, activationElementType()));
  int64_t recreated = 0;
  // The norm's output is re-created where the linear after it keeps it
  // (ATen pointwise ops; the fused norm-linear keeps nothing).
  for (UnitKind k : projectionChain(attention))
    if (pointwiseKind == PointwiseKind::aten ||
        (k != UnitKind::attn_norm && k != UnitKind::mlp_norm))
      recreated += bytes(unfrozenUnit(k, {}).output);
  // Under autocast the re-run casts its linear's weight afresh (freed when
  // it returns, after its outputs exist; counted through the block's
  // backward: an upper bound) — not a 16-bit weight, which it reads as is.
  const UnitKind linear = attention ? UnitKind::qkv : UnitKind::mlp_up;
  const int64_t rows = attention ? 3 * h : f;
  const int64_t weightCopy =
      e < 4 && parameterBytes(linear, {}, layer) == 4 ? e * (rows * h + rows)
                                                     : 0;
  if (!attention)
    // The MLP's chain counts the GELU's output gradient and the
    // up-projection's: at the down-projection's backward the re-created GELU
    // output stands where the former will be (measured: ATen pointwise at
    // fp32 to the byte; the fused GELU-linear makes no GELU gradient).
    return probeMlpChain(layer) + recreated - e * b * s * f + weightCopy;
  // The attention's backward: the stream's and the output projection's
  // gradients, the re-created outputs, the kernel's q, k, v gradients and
  // buffers (not measured on a path: an estimate).
  return 4 * b * s * h + e * b * s * h + recreated + 3 * e * b * s * h +
         weightCopy + flashAttentionBuffers(s, s, /*backward=*/true);
}

int64_t CostModel::cosineProbeWorkspace(
    ArrayRef<std::pair<int64_t, int64_t>> regions,
    ArrayRef<int64_t> partials) const {
  SmallVector<std::pair<int64_t, int64_t>> paths = cosineProbePaths();
  const int64_t n = paths.size();
  if (n < 2)
    return 0;
  const int64_t common = (paths.front().first + 1) / 2;
  const int64_t b = batch, s = backbone.getSeq(), h = backbone.getHidden(),
                f = backbone.getFfn();
  // The up-projection's width: Llama's holds the gate's and the up's rows.
  const int64_t up = backbone.hasGatedMlp() ? 2 * f : f;
  // Gradients are fp32 (the runtime's grads of fp32 master weights), but
  // for 16-bit projections.
  const int64_t e = bytes(tensor({1}, activationElementType()));
  int64_t probeParams, chain, widest;
  if (common == 0) {
    probeParams = embeddingParameters();
    chain = 4 * b * s * h; // the embedding dropout's input gradient
    widest = backbone.getVocab() * h;
  } else {
    probeParams = layerParameters();
    chain = probeMlpChain(common);
    // The Gram's double copies are of the layer's widest weight: the
    // up-projection, or the fused QKV where it is wider (ffn < 3·hidden).
    const int64_t qkvRows =
        backbone.isLlama()
            ? (backbone.getHeads() + 2 * backbone.getKvHeadCount()) *
                  backbone.getHeadDim()
            : 3 * h;
    widest = std::max(h * up, qkvRows * h);
  }
  // 16-bit projections' gradients take 2 bytes a value.
  int64_t held = kGradientBytes * probeParams;
  if (common > 0)
    for (UnitKind k : kProjections)
      held -= (kGradientBytes - parameterBytes(k, {}, common)) *
              unitParameters(k);
  // A region's re-run: its blocks' tensors, and the inner backward's chain.
  const int64_t innerChain = 4 * (b * s * h + h * up + h) + e * b * s * up;
  const int64_t perBlock[2] = {blockRecomputeBytes(2), blockRecomputeBytes(1)};
  int64_t probe = 0;
  for (int64_t k = 0; k < n; ++k) {
    int64_t path = chain;
    const int64_t low = std::max<int64_t>(1, paths[k].first),
                  high = paths[k].second;
    // ZeRO 3: one block on the path whole at a time (a region's blocks
    // together), each freed as the probe's backward leaves it.
    int64_t gathered = 0;
    for (int64_t blk = paths[k].first; blk <= high; ++blk) {
      int64_t here = shardedBlockBytes(blk);
      for (auto [first, last] : regions)
        if (blk >= first && blk <= last) {
          here = 0;
          for (int64_t r = first; r <= last; ++r)
            here += shardedBlockBytes(r);
        }
      gathered = std::max(gathered, here);
    }
    for (auto [first, last] : regions)
      if (last >= low && first <= high) {
        int64_t rerun = innerChain;
        for (int64_t blk = first; blk <= last; ++blk)
          rerun += perBlock[blk % 2];
        path = std::max(path, rerun);
      }
    for (int64_t blk : partials)
      if (blk >= low && blk <= high)
        path = std::max(path, partialProbePath(blk));
    probe = std::max(probe, k * held + path + gathered);
  }
  return std::max(probe, n * held + 8 * n * widest);
}

//===----------------------------------------------------------------------===//
// Parameters
//===----------------------------------------------------------------------===//

int64_t CostModel::embeddingParameters() const {
  const int64_t rows =
      backbone.getVocab() +
      (backbone.hasPositionTable() ? backbone.getPositionRows() : 0) +
      (backbone.isPostNorm() ? backbone.getTypeVocabRows() : 0);
  // BERT's embeddings LayerNorm: weight and bias.
  return rows * backbone.getHidden() +
         (backbone.isPostNorm() ? 2 * backbone.getHidden() : 0);
}

int64_t CostModel::finalNormParameters() const {
  if (!backbone.hasFinalNorm())
    return 0;
  return (backbone.hasRmsNorm() ? 1 : 2) * backbone.getHidden();
}

int64_t CostModel::layerParameters() const {
  if (backbone.isLlama())
    return 2 * unitParameters(UnitKind::attn_norm) +
           unitParameters(UnitKind::qkv) + unitParameters(UnitKind::attn_out) +
           unitParameters(UnitKind::mlp_up) +
           unitParameters(UnitKind::mlp_down);
  int64_t h = backbone.getHidden(), f = backbone.getFfn();
  int64_t norms = 2 * (2 * h);          // two LayerNorms, weight + bias
  int64_t attention = 3 * h * h + 3 * h // fused QKV projection
                      + h * h + h;      // output projection
  int64_t mlp = h * f + f + f * h + h;  // up- and down-projection
  return norms + attention + mlp;
}

int64_t CostModel::headParameters(TaskOp task) const {
  int64_t h = backbone.getHidden();
  const int64_t adapter =
      !adapters()                ? 0
      : readsSharedAdapter(task) ? mtprt::AdapterConfig::gateParameters(h)
                                 : mtprt::AdapterConfig::parameters(
                                       h, adapters()->bottleneck);
  return adapter + plainHeadParameters(task);
}

int64_t CostModel::plainHeadParameters(TaskOp task) const {
  int64_t h = backbone.getHidden(), norm = 2 * h;
  switch (task.getHead()) {
  case HeadKind::classify: // norm, tanh pooler, classifier
    return norm + h * h + h + h * *task.getClasses() + *task.getClasses();
  case HeadKind::tag:
    return norm + h * *task.getLabels() + *task.getLabels();
  case HeadKind::span:
    return norm + h * 2 + 2;
  case HeadKind::decoder: {
    int64_t v = *task.getVocab(), t = *task.getTargetSeq();
    int64_t cross = 2 * norm + (h * h + h) + (2 * h * h + 2 * h) + (h * h + h);
    int64_t layer = layerParameters() + cross;
    return v * h + t * h + *task.getLayers() * layer + norm + h * v + v;
  }
  }
  llvm_unreachable("unknown head kind");
}

int64_t CostModel::unitParameters(UnitKind kind, TaskOp task) const {
  const int64_t h = backbone.getHidden(), f = backbone.getFfn();
  switch (kind) {
  case UnitKind::embed:
    return embeddingParameters();
  case UnitKind::attn_norm:
  case UnitKind::mlp_norm:
  case UnitKind::final_norm:
    return (backbone.hasRmsNorm() ? 1 : 2) * h;
  case UnitKind::qkv:
    if (backbone.isLlama()) {
      const int64_t rows =
          (backbone.getHeads() + 2 * backbone.getKvHeadCount()) *
          backbone.getHeadDim();
      return rows * h + (backbone.hasAttentionBias() ? rows : 0);
    }
    return 3 * h * h + 3 * h;
  case UnitKind::attn_out:
    return h * h + (backbone.hasAttentionBias() ? h : 0);
  case UnitKind::mlp_up: {
    const int64_t rows = backbone.hasGatedMlp() ? 2 * f : f;
    return h * rows + (backbone.hasMlpBias() ? rows : 0);
  }
  case UnitKind::mlp_down:
    return f * h + (backbone.hasMlpBias() ? h : 0);
  case UnitKind::head:
    return task ? headParameters(task) : 0;
  case UnitKind::attn_core:
  case UnitKind::attn_residual:
  case UnitKind::mlp_act:
  case UnitKind::mlp_residual:
  case UnitKind::loss:
    return 0;
  }
  llvm_unreachable("unknown unit kind");
}

ParameterCount CostModel::parameters() const {
  ParameterCount count;
  count.embeddings = embeddingParameters();
  count.perLayer = layerParameters();
  count.backbone = count.embeddings + backbone.getLayers() * count.perLayer +
                   finalNormParameters();
  int64_t tasks = 0;
  for (TaskOp task : model.getTasks()) {
    count.heads += headParameters(task);
    ++tasks;
  }
  if (StrategyOp strategy = model.getStrategy())
    if (std::optional<uint64_t> hidden = strategy.getDgfgHidden())
      count.gate = dgfgParameterCount(tasks, *hidden);
  return count;
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

int64_t CostModel::trainableParameters() const {
  int64_t frozenCount = frozen(0) ? embeddingParameters() : 0;
  for (int64_t l = 1, e = backbone.getLayers(); l <= e; ++l)
    if (frozen(l))
      frozenCount += layerParameters() + (l == e ? finalNormParameters() : 0);
  return parameters().total() - frozenCount;
}

int64_t CostModel::gradientBytes(BwdOp bwd) const {
  TaskOp task;
  if (FlatSymbolRefAttr name = bwd.getTaskAttr()) {
    for (TaskOp t : model.getTasks())
      if (t.getSymName() == name.getValue())
        task = t;
  } else if (frozen(bwd.getUnit() == UnitKind::final_norm
                        ? backbone.getLayers()
                        : int64_t(bwd.getLayer()))) {
    return 0;
  }
  // A group's shared adapter (npd(share)) arrives with the first of its
  // heads' backwards (sharedAdapterGradientBytes), not its owner's.
  return (task ? kGradientBytes
               : parameterBytes(bwd.getUnit(), task, bwd.getLayer())) *
             unitParameters(bwd.getUnit(), task) -
         (task && bwd.getUnit() == UnitKind::head && !readsSharedAdapter(task)
              ? sharedAdapterGradientBytes(task)
              : 0);
}

int64_t CostModel::adapterSplitsBytes() const {
  std::optional<mtprt::AdapterConfig> ad = adapters();
  if (!ad || !ad->regroup)
    return 0;
  int64_t bytes = 0;
  for (auto [h, o] : llvm::enumerate(ad->owner))
    if (o != int64_t(h))
      bytes += (kWeightBytes + kOptimizerBytes) *
               mtprt::AdapterConfig::adapterParameters(backbone.getHidden(),
                                                       ad->bottleneck);
  return bytes;
}

int64_t CostModel::sharedAdapterGradientBytes(TaskOp task) const {
  std::optional<mtprt::AdapterConfig> ad = adapters();
  if (!ad || ad->owner.empty() || ad->regroup) // as readsSharedAdapter
    return 0;
  const int64_t owner = adapterOwnerIndex(task);
  if (owner < 0 || llvm::count(ad->owner, owner) < 2)
    return 0;
  return kGradientBytes * mtprt::AdapterConfig::adapterParameters(
                              backbone.getHidden(), ad->bottleneck);
}

int64_t CostModel::adapterOwnerIndex(TaskOp task) const {
  std::optional<mtprt::AdapterConfig> ad = adapters();
  for (auto [i, t] : llvm::enumerate(model.getTasks()))
    if (t == task)
      return ad ? ad->ownerOf(int64_t(i)) : int64_t(i);
  return -1;
}

int64_t CostModel::allReduceBytes(int64_t elements, int64_t world) {
  if (world <= 1)
    return 0;
  return 2 * (world - 1) * (4 * elements) / world;
}

int64_t CostModel::compressedPayloadBytes(int64_t elements, double topk,
                                          int64_t block, int64_t bits) {
  int64_t kept = std::max<int64_t>(1, int64_t(std::ceil(topk * elements)));
  int64_t values = (kept * bits + 7) / 8;
  int64_t scales = 4 * ((kept + block - 1) / block);
  int64_t indices = std::min<int64_t>(4 * kept, (elements + 7) / 8);
  return values + scales + indices;
}

int64_t CostModel::allGatherBytes(int64_t payload, int64_t world) {
  return world <= 1 ? 0 : (world - 1) * payload;
}

double CostModel::interconnectBandwidth() const {
  if (budget)
    if (std::optional<uint64_t> override = budget.getInterconnectBandwidth())
      return double(*override);
  return preset->interconnectBandwidth;
}

double CostModel::messageLatency() const { return preset->messageLatency; }

double CostModel::broadcastLatency() const {
  return preset->broadcastLatency;
}

void CostModel::Communication::add(std::string what, int64_t wireBytes,
                                   int64_t steps, double bw, double latency) {
  const double s = double(steps) * latency + double(wireBytes) / bw;
  bytes += wireBytes;
  messages += steps;
  seconds += s;
  for (auto &p : parts)
    if (p.first == what) {
      p.second += s;
      return;
    }
  parts.push_back({std::move(what), s});
}

CostModel::Communication CostModel::stepCommunication() const {
  Communication c;
  const int64_t W = processes();
  StepOp step = model.getStep();
  // A pipeline's stages exchange only their own gradients (PipelinePlan).
  if (W <= 1 || !step || (budget && budget.getPipelineStages() > 1))
    return c;
  const double bw = interconnectBandwidth(), a = messageLatency();
  const int64_t M = budget ? budget.getAccumulationSteps() : 1;
  int64_t elements = 0;
  for (AllReduceOp op : step.getBody().front().getOps<AllReduceOp>())
    elements += op.getElements();
  const int64_t zero = zeroStage();
  const int64_t log2W = int64_t(std::ceil(std::log2(double(W))));
  // `total` bytes in collectives of at most `bucket` each: how many.
  auto pieces = [](int64_t total, int64_t bucket) {
    return bucket > 0 ? (total + bucket - 1) / bucket : int64_t(0);
  };
  if (zero < 2) {
    // mtprt::GradExchange at the step's end, over every bucket's values
    // flattened into one vector.
    auto buckets = step.getBody().front().getOps<AllReduceOp>();
    if (!buckets.empty())
      addGradientExchange(c, elements, *buckets.begin());
  } else {
    // Stage 2 sums the backbone's gradients as autograd makes them, every
    // micro-batch, a release bucket at a time (still all-reduces: reduces
    // to the owners are not built).
    const int64_t bucket =
        mtprt::ZeroLayout::releaseBucketBytes(elements, W);
    const int64_t total = 4 * elements, n = pieces(total, bucket);
    c.add("ZeRO gradient sums", M * 2 * (W - 1) * total / W,
          M * n * 2 * (W - 1), bw, a);
  }
  if (zero == 1 || zero == 2) {
    // The owners broadcast the updated values in place, a parameter's part
    // at a time (beside the next forward: counted whole here): each rank
    // receives what it lacks; one broadcast per parameter tensor and per
    // rank whose run it crosses.
    // 16-bit weights go at 2 B a value. The tensors, about: per trainable
    // layer its norms' and projections' weights and biases, the
    // embeddings' tables and norm, each head's two layers.
    const int64_t whole = 4 * elements - 2 * halfProjectionValues();
    int64_t tensors = frozen(0) ? 0 : 4;
    for (int64_t l = 1; l <= int64_t(backbone.getLayers()); ++l)
      tensors += frozen(l) ? 0 : 12;
    auto tasks = model.getTasks();
    tensors += 4 * int64_t(std::distance(tasks.begin(), tasks.end()));
    c.add("ZeRO parameter broadcasts", whole - whole / W,
          (tensors + W - 1) * log2W, bw, broadcastLatency());
  } else if (zero >= 3) {
    // Stage 3 gathers the sharded blocks at their next use instead; what
    // stays whole (heads, frozen layers) takes its updated values from the
    // owners of its runs: a broadcast per owner.
    const int64_t whole =
        std::max<int64_t>(0, 4 * elements - shardedBlocks().total);
    c.add("ZeRO 3 whole parameters' broadcasts", whole - whole / W,
          W * log2W, bw, broadcastLatency());
  }
  if (zero >= 3) {
    // Each sharded block gathered for its forward and (when its backward
    // reads it) again for its backward, every micro-batch: one broadcast
    // per rank whose run it spans, this rank receiving what it lacks.
    const int64_t run = 4 * mtprt::ZeroLayout::shardValues(elements, W);
    const int64_t nblocks = 2 * int64_t(backbone.getLayers()) + 1;
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t bytes = shardedBlockBytes(b);
      if (!bytes)
        continue;
      const int64_t owners =
          std::min<int64_t>(W, (bytes + run - 1) / std::max<int64_t>(run, 1) + 1);
      const int64_t times = M * (backwardReadsParameters(b) ? 2 : 1);
      c.add("ZeRO 3 block gathers", times * (bytes - bytes / W),
            times * owners * log2W, bw, broadcastLatency());
    }
  }
  return c;
}

void CostModel::addGradientExchange(Communication &c, int64_t values,
                                    AllReduceOp like) const {
  const int64_t W = processes();
  if (W <= 1 || values <= 0)
    return;
  const double bw = interconnectBandwidth(), a = messageLatency();
  if (like && like.getCompressed()) {
    // GSC encodes and all-gathers runs of kGscBucketValues, one after
    // another (mtprt::GradExchange::sum).
    const double topk = like.getTopk()->convertToDouble();
    const int64_t full = values / kGscBucketValues,
                  rest = values % kGscBucketValues;
    auto payload = [&](int64_t n) {
      return allGatherBytes(
          compressedPayloadBytes(n, topk, *like.getBlock(), *like.getBits()),
          W);
    };
    c.add("gradient all-gather (GSC)",
          full * payload(kGscBucketValues) + (rest ? payload(rest) : 0),
          (full + (rest ? 1 : 0)) * (W - 1), bw, a);
  } else {
    // One ring all-reduce of the flattened gradients.
    c.add("gradient all-reduce", 2 * (W - 1) * 4 * values / W, 2 * (W - 1),
          bw, a);
  }
}

int64_t CostModel::processes() const {
  // A pipeline stage exchanges gradients with its data-parallel replicas.
  return budget ? std::max<int64_t>(1, budget.getReplicas()) : 1;
}

bool CostModel::optimizerOffload() const {
  StrategyOp s = model.getStrategy();
  return s && s.getOptimizerOffload();
}

bool CostModel::halfProjections() const {
  StrategyOp strategy = model.getStrategy();
  return mtprt::ZeroLayout::halfProjections(
      optimizerOffload(), budget && budget.getPrecision() == Precision::bf16,
      budget && budget.getPrecision() == Precision::fp16,
      budget ? budget.getZeroStage() : 0, processes(),
      strategy && strategy.getGradientScope() == GradientScope::params);
}

int64_t CostModel::foldedGradientBytes() const {
  const int64_t micro = budget ? budget.getAccumulationSteps() : 1;
  return mtprt::ZeroLayout::foldsHalfGradients(halfProjections(), processes(),
                                               micro)
             ? 4 * halfProjectionValues()
             : 0;
}

int64_t CostModel::halfProjectionValues() const {
  if (!halfProjections())
    return 0;
  int64_t perLayer = 0;
  for (UnitKind k : kProjections)
    perLayer += unitParameters(k);
  int64_t values = 0;
  for (int64_t l = 1; l <= int64_t(backbone.getLayers()); ++l)
    if (!frozen(l))
      values += perLayer;
  return values;
}

int64_t CostModel::parameterBytes(UnitKind kind, TaskOp task,
                                  int64_t layer) const {
  return !task && llvm::is_contained(kProjections, kind) && layer >= 1 &&
                 !frozen(layer) && halfProjections()
             ? 2
             : kWeightBytes;
}

bool CostModel::onCpu() const {
  return budget && budget.getDevice() == "cpu";
}

int64_t CostModel::zeroStage() const {
  // One process has nothing to scatter: stage 2 runs as 1 (as the runtime's
  // ZeroOptimizer does).
  const int64_t stage = budget ? budget.getZeroStage() : 0;
  return processes() > 1 ? stage : std::min<int64_t>(stage, 1);
}

int64_t CostModel::shardedBlockBytes(int64_t block) const {
  const int64_t layer = (block + 1) / 2;
  if (zeroStage() < 3 || block < 0 || layer > int64_t(backbone.getLayers()) ||
      frozen(layer))
    return 0;
  if (block == 0)
    return kWeightBytes * embeddingParameters();
  if (block % 2)
    return kWeightBytes * (unitParameters(UnitKind::attn_norm) +
                           unitParameters(UnitKind::qkv) +
                           unitParameters(UnitKind::attn_out));
  return kWeightBytes *
         (unitParameters(UnitKind::mlp_norm) + unitParameters(UnitKind::mlp_up) +
          unitParameters(UnitKind::mlp_down) +
          (layer == int64_t(backbone.getLayers()) ? finalNormParameters() : 0));
}

CostModel::ShardedBlocks CostModel::shardedBlocks() const {
  ShardedBlocks out;
  for (int64_t b = 0; b <= 2 * int64_t(backbone.getLayers()); ++b) {
    out.total += shardedBlockBytes(b);
    out.largest = std::max(out.largest, shardedBlockBytes(b));
  }
  return out;
}

// Mirrors GradExchange::averageGradients / sum and gscEncodeInto /
// decodeAdd in runtime/src/Distributed.cpp; every term is a tensor the
// runtime allocates (fp32 values 4 B, int64 positions 8 B, bytes 1 B).
int64_t CostModel::gscBucketTransient(int64_t n, double topk, int64_t block,
                                      int64_t world) {
  if (n <= 0)
    return 0;
  // gscLayout: k kept values, fp32 scales per block, positions as an n-bit
  // bitmap or k int32 indices (the smaller), k int8 codes.
  const int64_t k = std::min<int64_t>(
      n, std::max<int64_t>(1, int64_t(std::ceil(topk * double(n)))));
  const int64_t bitmapBytes = (n + 7) / 8;
  const bool bitmap = bitmapBytes < 4 * k;
  const int64_t indexBytes = bitmap ? bitmapBytes : 4 * k;
  const int64_t payload = 4 * ((k + block - 1) / block) + indexBytes + k;
  const int64_t slot = (payload + 3) / 4 * 4; // padded to 4 B per rank
  // Encode, beside this rank's payload: |g| (4n) with topk's values (4k)
  // and positions (8k); sorting the positions (the input, the sorted
  // positions, the permutation and the sort's scratch, 8k each); the kept
  // values (4k) beside the positions, and for a bitmap one byte per position
  // before packing.
  const int64_t topkPhase = 4 * n + 12 * k;
  const int64_t sortPhase = 32 * k;
  const int64_t packPhase = 12 * k + (bitmap ? 8 * bitmapBytes : 0);
  // A decode: a bitmap unpacked to a byte per position beside the positions
  // it yields (8k), then the positions beside the dequantized values (4k).
  const int64_t decode =
      bitmap ? std::max(8 * bitmapBytes + 8 * k, 12 * k) : 12 * k;
  const int64_t encode =
      slot + std::max({topkPhase, sortPhase, packPhase, decode});
  // The all-gather: this rank's payload and every rank's in one buffer;
  // then each rank's payload is decoded and added in turn.
  const int64_t gather = (world + 1) * slot;
  const int64_t sum = world * slot + decode;
  return std::max({encode, gather, sum});
}

CostModel::ExchangeMemory
CostModel::gradientExchange(ArrayRef<AllReduceOp> buckets) const {
  int64_t values = 0;
  for (AllReduceOp op : buckets)
    values += op.getElements();
  return gradientExchange(values, buckets.empty() ? AllReduceOp() : buckets.front());
}

CostModel::ExchangeMemory CostModel::gradientExchange(int64_t values,
                                                      AllReduceOp like) const {
  ExchangeMemory m;
  const int64_t world = processes();
  // ZeRO 2 (only at more than one process): the backbone's gradients were
  // summed and freed during the backward, this rank's run is held
  // (StepTimeline); what is left is summed a bucket at a time.
  if (zeroStage() >= 2 && values > 0) {
    m.transient = mtprt::ZeroLayout::releaseBucketBytes(values, world);
    return m;
  }
  if (world <= 1 || !like || values <= 0)
    return m;
  // Every gradient flattened into one fp32 vector, summed in place (an
  // uncompressed all-reduce needs nothing more).
  m.transient = 4 * values;
  if (!like.getCompressed())
    return m;
  m.resident = 4 * values;
  const double topk = like.getTopk()->convertToDouble();
  const int64_t block = *like.getBlock();
  // The runtime encodes runs of kGscBucketValues of the flattened vector,
  // one after another: the largest run's transient counts.
  int64_t widest =
      gscBucketTransient(values % kGscBucketValues, topk, block, world);
  if (values >= kGscBucketValues)
    widest = std::max(widest,
                      gscBucketTransient(kGscBucketValues, topk, block, world));
  m.transient += widest;
  return m;
}

//===----------------------------------------------------------------------===//
// Time and budget
//===----------------------------------------------------------------------===//

double CostModel::peakFlops() const {
  if (budget)
    if (std::optional<APFloat> override = budget.getPeakFlops())
      return override->convertToDouble();
  return precision == Precision::fp32   ? preset->fp32Flops
         : precision == Precision::bf16 ? preset->bf16Flops
                                        : preset->fp16Flops;
}

double CostModel::memoryBandwidth() const {
  if (budget)
    if (std::optional<uint64_t> override = budget.getMemoryBandwidth())
      return double(*override);
  return preset->memoryBandwidth;
}

double CostModel::rooflineSeconds(int64_t flops, int64_t bytes,
                                  int64_t kernels) const {
  return std::max(computeSeconds(flops), double(bytes) / memoryBandwidth()) +
         double(kernels) * preset->kernelLatency;
}

int64_t CostModel::trafficBytes(Operation *op) const {
  int64_t bytes = 0;
  for (Value v : op->getOperands())
    bytes += CostModel::bytes(v.getType());
  for (Value v : op->getResults())
    bytes += CostModel::bytes(v.getType());
  auto taskOf = [&](FlatSymbolRefAttr name) -> TaskOp {
    if (name)
      for (TaskOp task : model.getTasks())
        if (task.getSymName() == name.getValue())
          return task;
    return {};
  };
  // The embeddings' forward gathers rows (as many as it writes); their
  // backward writes a dense gradient of the whole table.
  if (auto fwd = dyn_cast<FwdOp>(op))
    return bytes + (fwd.getUnit() == UnitKind::embed
                        ? CostModel::bytes(fwd->getResult(0).getType())
                        : kWeightBytes * unitParameters(fwd.getUnit(),
                                                        taskOf(fwd.getTaskAttr())));
  if (auto bwd = dyn_cast<BwdOp>(op)) {
    // A frozen unit reads its weights and writes no gradient of them.
    const bool frozenUnit = !bwd.getTaskAttr() && frozen(bwd.getLayer());
    return bytes + (kWeightBytes + (frozenUnit ? 0 : kGradientBytes)) *
                       unitParameters(bwd.getUnit(), taskOf(bwd.getTaskAttr()));
  }
  // GFM's transforms, the mask, the clip's norm and scale, the weighted
  // accumulate: a few passes over each tap gradient.
  if (auto fuse = dyn_cast<FuseTaskGradsOp>(op))
    return (fuse.getGfmKeep() ? 3 : 1) * bytes;
  if (isa<OptimizerStepOp>(op))
    return (2 * kWeightBytes + kGradientBytes + 2 * kOptimizerBytes) *
           trainableParameters();
  return bytes;
}

double CostModel::opSeconds(Operation *op) const {
  auto costly = dyn_cast<CostOpInterface>(op);
  if (!costly)
    return 0.0;
  int64_t kernels = isa<BwdOp>(op) ? 2 : 1;
  // The runtime's fused AdamW: one call per parameter group (the backbone,
  // each task's head).
  if (isa<OptimizerStepOp>(op))
    kernels = 1 + int64_t(llvm::range_size(model.getTasks()));
  return rooflineSeconds(costly.getFlopCount(), trafficBytes(op), kernels);
}

double CostModel::transferSeconds(int64_t bytes) const {
  int64_t link = budget ? budget.getLinkBandwidth() : preset->linkBandwidth;
  return double(bytes) / double(link);
}

int64_t CostModel::usableBytes() const {
  return budget ? budget.getUsableBytes() : INT64_MAX;
}

std::optional<mtprt::AdapterConfig> CostModel::adapters() const {
  StrategyOp s = model.getStrategy();
  AdaptersAttr attr = s ? s.getAdaptersAttr() : AdaptersAttr();
  if (!attr)
    return std::nullopt;
  mtprt::AdapterConfig c = attr.getConfig();
  // `auto` before --mtp-normalize-spec resolved it.
  c.bottleneck = c.bottleneckFor(
      backbone.getHidden(), embeddingParameters() +
                                backbone.getLayers() * layerParameters() +
                                finalNormParameters());
  if (c.share) {
    // The correlation groups task-granular checkpointing also uses; tasks
    // are in forward order, so a group's first is its lowest tap.
    SmallVector<TaskOp> tasks(model.getTasks());
    llvm::StringMap<int64_t> index;
    for (auto [i, t] : llvm::enumerate(tasks))
      index[t.getSymName()] = int64_t(i);
    c.owner.assign(tasks.size(), 0);
    for (const SmallVector<StringRef> &group : taskGroups(model, *c.share))
      for (StringRef name : group)
        c.owner[size_t(index[name])] = index[group.front()];
  }
  return c;
}

bool CostModel::readsSharedAdapter(TaskOp task) const {
  std::optional<mtprt::AdapterConfig> ad = adapters();
  // With regroup any group may split during training: the plan holds room
  // for every task's own adapter (the largest the groups become).
  if (!ad || ad->owner.empty() || ad->regroup)
    return false;
  for (auto [i, t] : llvm::enumerate(model.getTasks()))
    if (t == task)
      return ad->ownerOf(int64_t(i)) != int64_t(i);
  return false;
}

std::optional<mtprt::SapsConfig> CostModel::saps() const {
  if (StrategyOp s = model.getStrategy())
    if (SapsAttr attr = s.getSapsAttr())
      return attr.getConfig();
  return std::nullopt;
}

int64_t CostModel::sapsFoldTransient(int64_t gradientBytes,
                                     bool rerank) const {
  std::optional<mtprt::SapsConfig> c = saps();
  if (!c || gradientBytes <= 0)
    return 0;
  // Beside the gradient, its importance, then topk's values and indices
  // (12 B per selected entry); the importance is freed before the sort and
  // the new state, which are smaller.
  const int64_t k = c->selected(gradientBytes / kGradientBytes);
  // Between re-rankings: the gradient and its gathered selection.
  return rerank ? 2 * gradientBytes + 12 * k : gradientBytes + 4 * k;
}

bool CostModel::gradientsResidentThroughStep() const {
  return budget && budget.getAccumulationSteps() > 1;
}

CostModel::PipelineCost
CostModel::gradientPipeline(ArrayRef<Type> grads, bool gfm,
                            GradientScope scope, int64_t scopeLayers,
                            bool clip) const {
  PipelineCost c;
  for (Type t : grads) {
    auto type = cast<RankedTensorType>(t);
    int64_t n = type.getNumElements(), channels = type.getShape().back();
    if (gfm)
      c.flops += int64_t(10.0 * n * std::log2(std::max<int64_t>(2, channels)));
    c.flops += 6 * n;
  }
  // GFM and the clip act first; then (features scope) the cosine probe and
  // the Gram matrix, with the processed tap gradients live and the fused ones
  // not yet made (the memory analysis counts this before the results).
  c.workspace = gfmWorkspace(grads);
  if (scope == GradientScope::features)
    c.workspace = std::max(c.workspace, cosineProbeWorkspace());
  if (scope == GradientScope::params) {
    // The per-task top-k gradients are held from each head's backward to
    // the step's end (the timeline counts them with the gradients); here
    // their processed copies, beside GFM's spectrum of the widest weight.
    const int64_t h = backbone.getHidden(), f = backbone.getFfn();
    c.workspace =
        (gfm ? 2 * kGradientBytes * std::max(h * f, 3 * h * h) : 0) +
        (gfm || clip ? perTaskParameterGradientBytes(int64_t(grads.size()),
                                                     scopeLayers)
                     : 0);
  }
  return c;
}

int64_t CostModel::gfmWorkspace(ArrayRef<Type> grads) {
  int64_t widest = 0;
  for (Type t : grads)
    widest = std::max(widest, 2 * bytes(t));
  return widest;
}

int64_t CostModel::perTaskParameterGradientBytes(int64_t tasks,
                                                 int64_t layers) const {
  return tasks * layers * layerParameters() * kGradientBytes;
}

int64_t CostModel::optimizerFlops() const {
  return 12 * trainableParameters();
}
