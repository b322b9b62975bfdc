//===- CostModel.cpp - the one source of bytes, FLOPs and time ------------===//

#include "passes/CostModel.h"

using namespace mtp;

int64_t CostModel::layerParameters(int64_t h, int64_t f) {
  int64_t norms = 2 * (2 * h);            // two LayerNorms, weight + bias
  int64_t attention = 3 * h * h + 3 * h   // fused QKV projection
                      + h * h + h;        // output projection
  int64_t mlp = h * f + f + f * h + h;    // up- and down-projection
  return norms + attention + mlp;
}

int64_t CostModel::headParameters(TaskOp task, BackboneOp backbone) {
  int64_t h = backbone.getHidden();
  switch (task.getHead()) {
  case HeadKind::classify:
    return h * *task.getClasses() + *task.getClasses();
  case HeadKind::tag:
    return h * *task.getLabels() + *task.getLabels();
  case HeadKind::span:
    return h * 2 + 2;
  case HeadKind::decoder: {
    // Its own token and position embeddings, decoder layers (self-attention,
    // cross-attention to the tap, MLP; three norms), a final norm and an
    // output projection.
    int64_t vocab = *task.getVocab(), f = backbone.getFfn();
    int64_t selfAttn = 4 * h * h + 4 * h, crossAttn = 4 * h * h + 4 * h;
    int64_t mlp = h * f + f + f * h + h, norms = 3 * 2 * h;
    int64_t layer = selfAttn + crossAttn + mlp + norms;
    return vocab * h + backbone.getSeq() * h + *task.getLayers() * layer +
           2 * h + h * vocab + vocab;
  }
  }
  llvm_unreachable("unknown head kind");
}

ParameterCount CostModel::parameters() const {
  ParameterCount count;
  BackboneOp bb = model.getBackbone();
  int64_t h = bb.getHidden();
  count.embeddings = bb.getVocab() * h + bb.getSeq() * h;
  count.perLayer = layerParameters(h, bb.getFfn());
  count.backbone = count.embeddings + bb.getLayers() * count.perLayer + 2 * h;
  int64_t tasks = 0;
  for (TaskOp task : model.getTasks()) {
    count.heads += headParameters(task, bb);
    ++tasks;
  }
  if (StrategyOp strategy = model.getStrategy())
    if (std::optional<uint64_t> hidden = strategy.getDgfgHidden())
      count.gate = dgfgParameterCount(tasks, *hidden);
  return count;
}
