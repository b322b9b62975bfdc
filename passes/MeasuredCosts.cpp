//===- MeasuredCosts.cpp - segment costs measured on the target -----------===//

#include "passes/MeasuredCosts.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "mtprt/Safetensors.h"

#include <cmath>

using namespace mlir;
using namespace mtp;

namespace {
llvm::Error fail(llvm::StringRef path, const llvm::Twine &what) {
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      path + ": " + what + "; measure it again with `mtpc profile SPEC -o " +
          path + "`");
}
} // namespace

llvm::Expected<MeasuredCosts> MeasuredCosts::load(llvm::StringRef path,
                                                  ModelOp model) {
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/true);
  if (!buffer)
    return llvm::createStringError(
        buffer.getError(), "cannot read the costs file " + path + ": " +
                               buffer.getError().message() +
                               "; write one with `mtpc profile SPEC -o " +
                               path + "`");
  // llvm::json::parse recurses once per level: a costs file nests 4 deep.
  constexpr int kMaxDepth = 16;
  const llvm::StringRef text = (*buffer)->getBuffer();
  if (mtprt::safetensors::nestingPast({text.data(), text.size()},
                                      kMaxDepth) != std::string_view::npos)
    return fail(path, llvm::Twine("nests deeper than ") + llvm::Twine(kMaxDepth) +
                          " levels; not a costs file `mtpc profile` wrote");
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(text);
  if (!parsed)
    return fail(path, "not JSON (" + llvm::toString(parsed.takeError()) + ")");
  const llvm::json::Object *root = parsed->getAsObject();
  if (!root)
    return fail(path, "not a JSON object");
  if (root->getString("schema") != "mtpc.costs/1")
    return fail(path, "field 'schema' is not \"mtpc.costs/1\"");

  MeasuredCosts costs;
  costs.path = path.str();
  // A time in seconds: finite, positive, under an hour.
  auto seconds = [&](const llvm::json::Object *o, llvm::StringRef where,
                     llvm::StringRef key, double &out) -> llvm::Error {
    std::optional<double> v = o ? o->getNumber(key) : std::nullopt;
    if (!v || !std::isfinite(*v) || *v <= 0 || *v > 3600)
      return fail(path, "field '" + (where.empty() ? std::string() : (where + ".").str()) +
                            key + "' must be seconds in (0, 3600]");
    out = *v;
    return llvm::Error::success();
  };
  // The device it was measured on: a CPU's times do not plan a GPU.
  if (BudgetOp budget = model.getBudget()) {
    StringRef device = root->getString("device").value_or("");
    const bool specCpu = budget.getDevice() == "cpu";
    if (device.empty() || specCpu != (device == "cpu"))
      return fail(path, "was measured on device '" + device +
                            "', the spec's budget is for " +
                            budget.getDevice());
  }
  // The precision it was measured at: bf16 GEMMs and autocast's casts time
  // nothing like fp32's. Profiles written before the field ran at fp32.
  if (BudgetOp budget = model.getBudget()) {
    StringRef have = root->getString("precision").value_or("fp32");
    StringRef want = stringifyPrecision(budget.getPrecision());
    if (have != want)
      return fail(path, "was measured at precision " + have +
                            ", the spec's budget trains at " + want);
  }
  // The shapes it was measured at.
  const llvm::json::Object *m = root->getObject("model");
  BackboneOp backbone = model.getBackbone();
  BudgetOp budget = model.getBudget();
  const std::pair<const char *, int64_t> shapes[] = {
      {"hidden", backbone.getHidden()}, {"heads", backbone.getHeads()},
      {"ffn", backbone.getFfn()},       {"seq", backbone.getSeq()},
      {"vocab", backbone.getVocab()},
      {"micro_batch", budget ? int64_t(budget.getMicroBatch()) : -1}};
  for (auto [key, want] : shapes) {
    std::optional<int64_t> have = m ? m->getInteger(key) : std::nullopt;
    if (!have)
      return fail(path, llvm::Twine("field 'model.") + key +
                            (m && m->get(key) ? "' is not a whole number"
                                              : "' is missing"));
    if (want >= 0 && *have != want)
      return fail(path, llvm::Twine("was measured with ") + key + " " +
                            llvm::Twine(*have) + ", the spec has " +
                            llvm::Twine(want));
  }
  const char *blocks[2] = {"mlp", "attention"};
  for (int k = 0; k < 2; ++k) {
    const llvm::json::Object *b = root->getObject(blocks[k]);
    if (llvm::Error e = seconds(b, blocks[k], "fwd_s", costs.blockFwd[k]))
      return std::move(e);
    if (llvm::Error e = seconds(b, blocks[k], "bwd_s", costs.blockBwd[k]))
      return std::move(e);
    if (llvm::Error e = seconds(b, blocks[k], "chain_s", costs.chain[k]))
      return std::move(e);
  }
  const llvm::json::Object *embed = root->getObject("embed");
  if (llvm::Error e = seconds(embed, "embed", "fwd_s", costs.embedFwd))
    return std::move(e);
  if (llvm::Error e = seconds(embed, "embed", "bwd_s", costs.embedBwd))
    return std::move(e);
  const llvm::json::Object *heads = root->getObject("heads");
  for (TaskOp task : model.getTasks()) {
    StringRef name = task.getSymName();
    const llvm::json::Object *h = heads ? heads->getObject(name) : nullptr;
    if (!h)
      return fail(path, "has no head '" + name + "' (field 'heads." + name +
                            "'): it was measured for another spec, or the "
                            "profiled batch had no labels for it");
    std::pair<double, double> &fb = costs.heads[name];
    std::string where = ("heads." + name).str();
    if (llvm::Error e = seconds(h, where, "fwd_s", fb.first))
      return std::move(e);
    if (llvm::Error e = seconds(h, where, "bwd_s", fb.second))
      return std::move(e);
  }
  if (heads)
    for (const auto &kv : *heads)
      if (llvm::none_of(model.getTasks(), [&](TaskOp t) {
            return t.getSymName() == llvm::StringRef(kv.first);
          }))
        return fail(path, "has head '" + llvm::StringRef(kv.first) +
                              "', which the spec has no task of: it was "
                              "measured for another spec");
  // What it was measured with, for the reader: well-formed when present.
  if (const llvm::json::Value *t = root->get("threads"))
    if (std::optional<int64_t> n = t->getAsInteger(); !n || *n < 1)
      return fail(path, "field 'threads' must be a whole number >= 1");
  const llvm::json::Object *link = root->getObject("link");
  if (const llvm::json::Value *b = link ? link->get("bytes") : nullptr)
    if (std::optional<double> v = b->getAsNumber();
        !v || !std::isfinite(*v) || *v <= 0)
      return fail(path, "field 'link.bytes' must be a positive byte count");
  for (auto [key, out] : {std::pair<const char *, double *>{
                              "to_host_bytes_per_s", &costs.toHost},
                          {"to_device_bytes_per_s", &costs.toDevice}}) {
    std::optional<double> v = link ? link->getNumber(key) : std::nullopt;
    if (!v || !std::isfinite(*v) || *v <= 0)
      return fail(path, llvm::Twine("field 'link.") + key +
                            "' must be a positive bandwidth");
    *out = *v;
  }
  // Optional: the optimizer, and the whole model's forward and backward
  // (every layer, every head at its tap), which calibrate the segments.
  if (root->get("optimizer_s"))
    if (llvm::Error e = seconds(root, "", "optimizer_s", costs.optimizer))
      return std::move(e);
  if (const llvm::json::Object *whole = root->getObject("model_step")) {
    double fwd = 0, bwd = 0;
    if (llvm::Error e = seconds(whole, "model_step", "fwd_s", fwd))
      return std::move(e);
    if (llvm::Error e = seconds(whole, "model_step", "bwd_s", bwd))
      return std::move(e);
    // Summed as the profile ran them: its own layer count, each head once.
    std::optional<int64_t> layers = m->getInteger("layers");
    if (!layers || *layers < 1 || *layers > (int64_t(1) << 20))
      return fail(path, "field 'model.layers' must be a layer count in [1, "
                        "2^20] with 'model_step'");
    double segFwd = costs.embedFwd, segBwd = costs.embedBwd;
    segFwd += double(*layers) * (costs.blockFwd[0] + costs.blockFwd[1]);
    segBwd += double(*layers) * (costs.blockBwd[0] + costs.blockBwd[1]);
    for (const auto &h : costs.heads) {
      segFwd += h.second.first;
      segBwd += h.second.second;
    }
    costs.fwdScale = fwd / segFwd;
    costs.bwdScale = bwd / segBwd;
    for (int k = 0; k < 2; ++k) {
      costs.blockFwd[k] *= costs.fwdScale;
      costs.chain[k] *= costs.fwdScale;
      costs.blockBwd[k] *= costs.bwdScale;
    }
    costs.embedFwd *= costs.fwdScale;
    costs.embedBwd *= costs.bwdScale;
    for (auto &h : costs.heads) {
      h.second.first *= costs.fwdScale;
      h.second.second *= costs.bwdScale;
    }
  }
  return costs;
}
