//===- MTPOps.cpp - mtp operations ----------------------------------------===//

#include "dialect/MTPOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringSwitch.h"

using namespace mlir;
using namespace mtp;

//===----------------------------------------------------------------------===//
// custom<Bytes>: byte counts print with the largest exact binary unit
//===----------------------------------------------------------------------===//

namespace {
struct ByteUnit {
  llvm::StringLiteral name;
  int64_t scale;
};
constexpr ByteUnit kByteUnits[] = {
    {"TiB", int64_t(1) << 40}, {"GiB", int64_t(1) << 30},
    {"MiB", int64_t(1) << 20}, {"KiB", int64_t(1) << 10}, {"B", 1}};
} // namespace

static ParseResult parseBytes(OpAsmParser &parser, IntegerAttr &bytes) {
  int64_t count = 0;
  SMLoc loc = parser.getCurrentLocation();
  if (parser.parseInteger(count))
    return failure();
  int64_t scale = 1;
  StringRef unit;
  if (succeeded(parser.parseOptionalKeyword(
          &unit, {"TiB", "GiB", "MiB", "KiB", "B"}))) {
    for (const ByteUnit &u : kByteUnits)
      if (u.name == unit)
        scale = u.scale;
  }
  if (count < 0 || (count > 0 && scale > INT64_MAX / count))
    return parser.emitError(loc, "byte count out of range");
  bytes = parser.getBuilder().getI64IntegerAttr(count * scale);
  return success();
}

static void printBytes(OpAsmPrinter &printer, Operation *, IntegerAttr bytes) {
  int64_t value = bytes.getInt();
  for (const ByteUnit &u : kByteUnits) {
    if (value != 0 && value % u.scale == 0) {
      printer << value / u.scale << ' ' << u.name;
      return;
    }
  }
  printer << value << " B";
}

//===----------------------------------------------------------------------===//
// custom<EnumKeyword>: an enum attribute as its bare keyword
//===----------------------------------------------------------------------===//

template <typename EnumAttrT>
static ParseResult parseEnumKeyword(OpAsmParser &parser, EnumAttrT &attr) {
  using EnumT = decltype(std::declval<EnumAttrT>().getValue());
  SMLoc loc = parser.getCurrentLocation();
  StringRef keyword;
  if (parser.parseKeyword(&keyword))
    return failure();
  std::optional<EnumT> value = symbolizeEnum<EnumT>(keyword);
  if (!value)
    return parser.emitError(loc, "unknown keyword '") << keyword << "'";
  attr = EnumAttrT::get(parser.getContext(), *value);
  return success();
}

template <typename EnumAttrT>
static void printEnumKeyword(OpAsmPrinter &printer, Operation *,
                             EnumAttrT attr) {
  printer << stringifyEnum(attr.getValue());
}

//===----------------------------------------------------------------------===//
// ModelOp
//===----------------------------------------------------------------------===//

void ModelOp::build(OpBuilder &builder, OperationState &state, StringRef name) {
  state.addAttribute(getSymNameAttrName(state.name),
                     builder.getStringAttr(name));
  Region *body = state.addRegion();
  body->push_back(new Block());
}

BackboneOp ModelOp::getBackbone() {
  auto range = getBody().getOps<BackboneOp>();
  return range.empty() ? BackboneOp() : *range.begin();
}

BudgetOp ModelOp::getBudget() {
  auto range = getBody().getOps<BudgetOp>();
  return range.empty() ? BudgetOp() : *range.begin();
}

LogicalResult ModelOp::verifyRegions() {
  SmallVector<BackboneOp> backbones(getBody().getOps<BackboneOp>());
  if (backbones.empty())
    return emitOpError("needs an 'mtp.backbone'");
  if (backbones.size() > 1)
    return backbones[1].emitOpError("duplicates the model's backbone")
        .attachNote(backbones[0].getLoc())
        .append("first backbone here");

  SmallVector<BudgetOp> budgets(getBody().getOps<BudgetOp>());
  if (budgets.size() > 1)
    return budgets[1].emitOpError("duplicates the model's budget")
        .attachNote(budgets[0].getLoc())
        .append("first budget here");

  if (getTasks().empty())
    return emitOpError("needs at least one 'mtp.task'");

  // One correlation per unordered pair: a second would silently override.
  llvm::DenseMap<std::pair<StringAttr, StringAttr>, CorrelateOp> seen;
  for (CorrelateOp corr : getBody().getOps<CorrelateOp>()) {
    StringAttr a = corr.getLhsAttr().getAttr();
    StringAttr b = corr.getRhsAttr().getAttr();
    if (b.getValue() < a.getValue())
      std::swap(a, b);
    auto [it, inserted] = seen.try_emplace({a, b}, corr);
    if (!inserted)
      return corr.emitOpError("correlates '")
          .append(a.getValue(), "' and '", b.getValue(),
                  "' a second time")
          .attachNote(it->second.getLoc())
          .append("first given here");
  }
  return success();
}

//===----------------------------------------------------------------------===//
// BackboneOp
//===----------------------------------------------------------------------===//

LogicalResult BackboneOp::verify() {
  if (getHidden() % getHeads() != 0)
    return emitOpError("hidden size ")
           << getHidden() << " does not split into " << getHeads()
           << " attention heads";
  return success();
}

//===----------------------------------------------------------------------===//
// TaskOp
//===----------------------------------------------------------------------===//

namespace {
/// The head parameters each head kind takes, in printing order.
ArrayRef<StringLiteral> headParams(HeadKind kind) {
  static constexpr StringLiteral classify[] = {"classes"};
  static constexpr StringLiteral tag[] = {"labels"};
  static constexpr StringLiteral decoder[] = {"layers", "vocab"};
  switch (kind) {
  case HeadKind::classify:
    return classify;
  case HeadKind::tag:
    return tag;
  case HeadKind::span:
    return {};
  case HeadKind::decoder:
    return decoder;
  }
  llvm_unreachable("unknown head kind");
}
} // namespace

// mtp.task @name : kind(param = N, ...) from [pooled] layer N
//                  loss KIND weight W attr-dict
ParseResult TaskOp::parse(OpAsmParser &parser, OperationState &result) {
  Builder &b = parser.getBuilder();
  StringAttr name;
  if (parser.parseSymbolName(name, getSymNameAttrName(result.name),
                             result.attributes) ||
      parser.parseColon())
    return failure();

  SMLoc kindLoc = parser.getCurrentLocation();
  StringRef kindName;
  if (parser.parseKeyword(&kindName))
    return failure();
  std::optional<HeadKind> kind = symbolizeHeadKind(kindName);
  if (!kind)
    return parser.emitError(kindLoc, "unknown head kind '")
           << kindName << "' (expected classify, tag, span or decoder)";
  result.addAttribute(getHeadAttrName(result.name),
                      HeadKindAttr::get(b.getContext(), *kind));

  if (parser.parseLParen())
    return failure();
  if (failed(parser.parseOptionalRParen())) {
    auto parseParam = [&]() -> ParseResult {
      SMLoc loc = parser.getCurrentLocation();
      StringRef key;
      int64_t value;
      if (parser.parseKeyword(&key) || parser.parseEqual() ||
          parser.parseInteger(value))
        return failure();
      if (!llvm::is_contained(headParams(*kind), key))
        return parser.emitError(loc, "'")
               << kindName << "' head takes no parameter '" << key << "'";
      if (result.attributes.get(key))
        return parser.emitError(loc, "parameter '") << key << "' given twice";
      result.addAttribute(key, b.getI64IntegerAttr(value));
      return success();
    };
    if (parser.parseCommaSeparatedList(parseParam) || parser.parseRParen())
      return failure();
  }

  int64_t layer;
  if (parser.parseKeyword("from"))
    return failure();
  if (succeeded(parser.parseOptionalKeyword("pooled")))
    result.addAttribute(getPooledAttrName(result.name), b.getUnitAttr());
  if (parser.parseKeyword("layer") || parser.parseInteger(layer))
    return failure();
  result.addAttribute(getTapLayerAttrName(result.name),
                      b.getI64IntegerAttr(layer));

  SMLoc lossLoc;
  StringRef lossName;
  double weight;
  if (parser.parseKeyword("loss") ||
      (lossLoc = parser.getCurrentLocation(), parser.parseKeyword(&lossName)))
    return failure();
  std::optional<LossKind> loss = symbolizeLossKind(lossName);
  if (!loss)
    return parser.emitError(lossLoc, "unknown loss '")
           << lossName << "' (expected cross_entropy or mse)";
  result.addAttribute(getLossAttrName(result.name),
                      LossKindAttr::get(b.getContext(), *loss));
  if (parser.parseKeyword("weight") || parser.parseFloat(weight))
    return failure();
  result.addAttribute(getWeightAttrName(result.name), b.getF64FloatAttr(weight));
  return parser.parseOptionalAttrDict(result.attributes);
}

void TaskOp::print(OpAsmPrinter &p) {
  p << ' ';
  p.printSymbolName(getSymName());
  p << " : " << stringifyHeadKind(getHead()) << '(';
  llvm::interleaveComma(headParams(getHead()), p, [&](StringRef key) {
    p << key << " = ";
    if (auto value = (*this)->getAttrOfType<IntegerAttr>(key))
      p << value.getInt();
    else
      p << "<missing>";
  });
  p << ") from " << (getPooled() ? "pooled " : "") << "layer "
    << getTapLayer() << " loss " << stringifyLossKind(getLoss())
    << " weight ";
  p.printFloat(getWeightAttr().getValue());
  p.printOptionalAttrDict(
      (*this)->getAttrs(),
      {getSymNameAttrName(), getHeadAttrName(), getClassesAttrName(),
       getLabelsAttrName(), getLayersAttrName(), getVocabAttrName(),
       getTapLayerAttrName(), getPooledAttrName(), getLossAttrName(),
       getWeightAttrName()});
}

LogicalResult TaskOp::verify() {
  // Each kind takes exactly its own parameters.
  ArrayRef<StringLiteral> wanted = headParams(getHead());
  StringRef kind = stringifyHeadKind(getHead());
  for (StringRef key : {"classes", "labels", "layers", "vocab"}) {
    bool present = (*this)->getAttr(key) != nullptr;
    bool expected = llvm::is_contained(wanted, key);
    if (expected && !present)
      return emitOpError("'") << kind << "' head needs '" << key << "'";
    if (!expected && present)
      return emitOpError("'") << kind << "' head takes no '" << key << "'";
  }

  if (getLoss() == LossKind::mse && getHead() != HeadKind::classify)
    return emitOpError("mse loss needs a 'classify' head (regression), not '")
           << kind << "'";
  if (getPooled() && getHead() != HeadKind::classify)
    return emitOpError("only a 'classify' head reads a pooled tap; '")
           << kind << "' reads every token";

  double weight = getWeight().convertToDouble();
  if (!(weight >= 0.0) || std::isinf(weight))
    return emitOpError("loss weight must be finite and non-negative, got ")
           << weight;

  auto model = (*this)->getParentOfType<ModelOp>();
  if (BackboneOp backbone = model ? model.getBackbone() : BackboneOp()) {
    if (getTapLayer() > backbone.getLayers())
      return emitOpError("reads layer ")
                 << getTapLayer() << " but the backbone has "
                 << backbone.getLayers() << " layers (0 = embeddings)";
  }
  return success();
}

//===----------------------------------------------------------------------===//
// CorrelateOp
//===----------------------------------------------------------------------===//

LogicalResult CorrelateOp::verify() {
  if (getLhs() == getRhs())
    return emitOpError("correlates task '")
           << getLhs() << "' with itself; name two distinct tasks";
  double value = getValue().convertToDouble();
  if (!(value >= -1.0 && value <= 1.0))
    return emitOpError("correlation must lie in [-1, 1], got ") << value;
  return success();
}

LogicalResult
CorrelateOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  for (FlatSymbolRefAttr ref : {getLhsAttr(), getRhsAttr()}) {
    Operation *target =
        symbolTable.lookupNearestSymbolFrom((*this)->getParentOp(), ref);
    if (!target)
      return emitOpError("names unknown task ") << ref;
    if (!isa<TaskOp>(target))
      return emitOpError("names ") << ref << ", which is not an 'mtp.task'";
  }
  return success();
}

//===----------------------------------------------------------------------===//
// BudgetOp
//===----------------------------------------------------------------------===//

LogicalResult BudgetOp::verify() {
  if (getHeadroom() >= getMemory())
    return emitOpError("headroom (")
           << getHeadroom() << " bytes) leaves nothing of the device's "
           << getMemory() << " bytes";
  int64_t perStep = getMicroBatch() * getGpus();
  if (getGlobalBatch() % perStep != 0)
    return emitOpError("global batch ")
           << getGlobalBatch() << " is not a multiple of micro_batch x gpus = "
           << perStep;
  if (getPrecision() == Precision::fp16 && getDevice() == "cpu")
    return emitOpError("fp16 needs a GPU (loss scaling); use bf16 or fp32 on "
                       "'cpu'");
  return success();
}

#define GET_OP_CLASSES
#include "dialect/MTPOps.cpp.inc"
