//===- MTPOps.cpp - mtp operations ----------------------------------------===//

#include "dialect/MTPOps.h"
#include "mtprt/Limits.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <cstdio>

using namespace mlir;
using namespace mtp;
namespace limits = mtprt::limits;

/// The shared bounds (mtprt/Limits.h) on a real the op carries (NaN and
/// ±inf lie in no range): the same ones Sema reports on a `.mtp` and the
/// runtime checks in a plan; the message names the range as Sema's does.
static std::string realBound(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
static std::string rangeText(limits::RealRange r) {
  return (r.openLo ? "(" : "[") + realBound(r.lo) + ", " + realBound(r.hi) +
         (r.openHi ? ")" : "]");
}
static LogicalResult checkReal(function_ref<InFlightDiagnostic()> emitError,
                               StringRef what, double value,
                               limits::RealRange range) {
  if (range.contains(value))
    return success();
  return emitError() << what << " must lie in " << rangeText(range)
                     << ", got " << value;
}
static LogicalResult checkReal(Operation *op, StringRef what, double value,
                               limits::RealRange range) {
  return checkReal([op] { return op->emitOpError(); }, what, value, range);
}

//===----------------------------------------------------------------------===//
// custom<Bytes>: byte counts print with the largest exact binary unit
//===----------------------------------------------------------------------===//

namespace {
struct ByteUnit {
  llvm::StringLiteral name;
  int64_t scale;
};
// Largest first; binary and decimal units interleaved so 24 GB prints as
// "24 GB" and 32 GiB as "32 GiB".
constexpr ByteUnit kByteUnits[] = {
    {"TiB", int64_t(1) << 40}, {"TB", 1000000000000},
    {"GiB", int64_t(1) << 30}, {"GB", 1000000000},
    {"MiB", int64_t(1) << 20}, {"MB", 1000000},
    {"KiB", int64_t(1) << 10}, {"KB", 1000},
    {"B", 1}};
} // namespace

static ParseResult parseBytes(OpAsmParser &parser, IntegerAttr &bytes) {
  int64_t count = 0;
  SMLoc loc = parser.getCurrentLocation();
  if (parser.parseInteger(count))
    return failure();
  int64_t scale = 1;
  StringRef unit;
  if (succeeded(parser.parseOptionalKeyword(
          &unit, {"TiB", "TB", "GiB", "GB", "MiB", "MB", "KiB", "KB", "B"}))) {
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
// custom<Bandwidth>: bytes per second, with a decimal unit when exact
//===----------------------------------------------------------------------===//

namespace {
// MLIR's lexer has no '/' token, so GB/s prints as GBps.
constexpr ByteUnit kRateUnits[] = {{"TBps", 1000000000000},
                                   {"GBps", 1000000000},
                                   {"MBps", 1000000},
                                   {"KBps", 1000},
                                   {"Bps", 1}};
} // namespace

static ParseResult parseBandwidth(OpAsmParser &parser, IntegerAttr &rate) {
  SMLoc loc = parser.getCurrentLocation();
  int64_t count = 0;
  StringRef unit;
  if (parser.parseInteger(count) || parser.parseKeyword(&unit))
    return failure();
  int64_t scale = 0;
  for (const ByteUnit &u : kRateUnits)
    if (u.name == unit)
      scale = u.scale;
  if (!scale)
    return parser.emitError(loc, "unknown bandwidth unit '")
           << unit << "' (expected TBps, GBps, MBps, KBps or Bps)";
  if (count < 0 || (count > 0 && scale > INT64_MAX / count))
    return parser.emitError(loc, "bandwidth out of range");
  rate = parser.getBuilder().getI64IntegerAttr(count * scale);
  return success();
}

static void printBandwidth(OpAsmPrinter &printer, Operation *,
                           IntegerAttr rate) {
  int64_t value = rate.getInt();
  for (const ByteUnit &u : kRateUnits) {
    if (value != 0 && value % u.scale == 0) {
      printer << value / u.scale << ' ' << u.name;
      return;
    }
  }
  printer << value << " Bps";
}

//===----------------------------------------------------------------------===//
// custom<OptionalF64>, custom<OptionalI64>: a value, or `none`
//===----------------------------------------------------------------------===//

static ParseResult parseOptionalF64(OpAsmParser &parser, FloatAttr &attr) {
  if (succeeded(parser.parseOptionalKeyword("none")))
    return success();
  double value;
  if (parser.parseFloat(value))
    return failure();
  attr = parser.getBuilder().getF64FloatAttr(value);
  return success();
}

static void printOptionalF64(OpAsmPrinter &printer, Operation *,
                             FloatAttr attr) {
  if (attr)
    printer.printFloat(attr.getValue());
  else
    printer << "none";
}

static ParseResult parseOptionalI64(OpAsmParser &parser, IntegerAttr &attr) {
  if (succeeded(parser.parseOptionalKeyword("none")))
    return success();
  int64_t value;
  if (parser.parseInteger(value))
    return failure();
  attr = parser.getBuilder().getI64IntegerAttr(value);
  return success();
}

static void printOptionalI64(OpAsmPrinter &printer, Operation *,
                             IntegerAttr attr) {
  if (attr)
    printer << attr.getInt();
  else
    printer << "none";
}

//===----------------------------------------------------------------------===//
// custom<DataSource>: `synthetic` or a path string
//===----------------------------------------------------------------------===//

static ParseResult parseDataSource(OpAsmParser &parser, StringAttr &path) {
  if (succeeded(parser.parseOptionalKeyword("synthetic")))
    return success();
  std::string value;
  if (parser.parseString(&value))
    return failure();
  path = parser.getBuilder().getStringAttr(value);
  return success();
}

static void printDataSource(OpAsmPrinter &printer, Operation *,
                            StringAttr path) {
  if (path)
    printer.printString(path.getValue());
  else
    printer << "synthetic";
}

//===----------------------------------------------------------------------===//
// LRScheduleAttr and custom<Schedule>
//===----------------------------------------------------------------------===//

// kind(peak, warmup = N)
FailureOr<LRScheduleAttr> LRScheduleAttr::parseBare(AsmParser &parser) {
  SMLoc loc = parser.getCurrentLocation();
  StringRef kindName;
  double peak;
  int64_t warmup = 0;
  if (parser.parseKeyword(&kindName))
    return failure();
  std::optional<ScheduleKind> kind = symbolizeScheduleKind(kindName);
  if (!kind)
    return parser.emitError(loc, "unknown schedule '")
           << kindName << "' (expected constant, linear or cosine)";
  if (parser.parseLParen() || parser.parseFloat(peak))
    return failure();
  if (succeeded(parser.parseOptionalComma()) &&
      (parser.parseKeyword("warmup") || parser.parseEqual() ||
       parser.parseInteger(warmup)))
    return failure();
  if (parser.parseRParen())
    return failure();
  return getChecked([&] { return parser.emitError(loc); },
                    parser.getContext(), *kind, APFloat(peak), warmup);
}

void LRScheduleAttr::printBare(AsmPrinter &printer) const {
  printer << stringifyScheduleKind(getKind()) << '(';
  printer.printFloat(getPeak());
  printer << ", warmup = " << getWarmup() << ')';
}

Attribute LRScheduleAttr::parse(AsmParser &parser, Type) {
  if (parser.parseLess())
    return {};
  FailureOr<LRScheduleAttr> attr = parseBare(parser);
  if (failed(attr) || parser.parseGreater())
    return {};
  return *attr;
}

void LRScheduleAttr::print(AsmPrinter &printer) const {
  printer << '<';
  printBare(printer);
  printer << '>';
}

LogicalResult
LRScheduleAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                       ScheduleKind, APFloat peak, int64_t warmup) {
  if (failed(checkReal(emitError, "learning rate", peak.convertToDouble(),
                       limits::kLearningRate)))
    return failure();
  if (warmup < 0)
    return emitError() << "warm-up steps must be non-negative, got " << warmup;
  return success();
}

//===----------------------------------------------------------------------===//
// BatchScheduleAttr
//===----------------------------------------------------------------------===//

// <start 32, max 512, rate 1.0e-02, ramp 2000, decay 9.8e-01 every 500,
//  floor 32>
Attribute BatchScheduleAttr::parse(AsmParser &parser, Type) {
  SMLoc loc = parser.getCurrentLocation();
  int64_t start, max, ramp, every, floor;
  double rate, decay;
  if (parser.parseLess() || parser.parseKeyword("start") ||
      parser.parseInteger(start) || parser.parseComma() ||
      parser.parseKeyword("max") || parser.parseInteger(max) ||
      parser.parseComma() || parser.parseKeyword("rate") ||
      parser.parseFloat(rate) || parser.parseComma() ||
      parser.parseKeyword("ramp") || parser.parseInteger(ramp) ||
      parser.parseComma() || parser.parseKeyword("decay") ||
      parser.parseFloat(decay) || parser.parseKeyword("every") ||
      parser.parseInteger(every) || parser.parseComma() ||
      parser.parseKeyword("floor") || parser.parseInteger(floor) ||
      parser.parseGreater())
    return {};
  return getChecked([&] { return parser.emitError(loc); },
                    parser.getContext(), start, max, APFloat(rate), ramp,
                    APFloat(decay), every, floor);
}

void BatchScheduleAttr::print(AsmPrinter &printer) const {
  printer << "<start " << getStart() << ", max " << getMax() << ", rate ";
  printer.printFloat(getRate());
  printer << ", ramp " << getRampSteps() << ", decay ";
  printer.printFloat(getDecay());
  printer << " every " << getEvery() << ", floor " << getFloor() << '>';
}

LogicalResult
BatchScheduleAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                          int64_t start, int64_t max, APFloat rate,
                          int64_t ramp, APFloat decay, int64_t every,
                          int64_t floor) {
  for (auto [what, value, range] :
       {std::tuple<StringRef, int64_t, limits::Range>{
            "dynamic batch start", start, limits::kGlobalBatch},
        {"dynamic batch max", max, limits::kGlobalBatch},
        {"dynamic batch ramp", ramp, limits::kBatchSteps},
        {"dynamic batch every", every, limits::kBatchEvery},
        {"dynamic batch floor", floor, limits::kGlobalBatch}})
    if (!range.contains(value))
      return emitError() << what << " must lie in [" << range.lo << ", "
                         << range.hi << "], got " << value;
  if (failed(checkReal(emitError, "dynamic batch rate", rate.convertToDouble(),
                       limits::kBatchRate)) ||
      failed(checkReal(emitError, "dynamic batch decay",
                       decay.convertToDouble(), limits::kBatchDecay)))
    return failure();
  mtprt::BatchSchedule s;
  s.start = start;
  s.max = max;
  s.floor = floor;
  if (const char *why = s.inconsistency())
    return emitError() << "dynamic batch: " << why << " (start " << start
                       << ", max " << max << ", floor " << floor << ")";
  return success();
}

BatchScheduleAttr BatchScheduleAttr::get(MLIRContext *context,
                                         const mtprt::BatchSchedule &s) {
  return get(context, s.start, s.max, APFloat(s.rate), s.rampSteps,
             APFloat(s.decay), s.every, s.floor);
}

//===----------------------------------------------------------------------===//
// SapsAttr
//===----------------------------------------------------------------------===//

// <fraction 3.0e-02, every 1000, lambda 1.0e+00>
Attribute SapsAttr::parse(AsmParser &parser, Type) {
  SMLoc loc = parser.getCurrentLocation();
  double fraction, lambda;
  int64_t every;
  if (parser.parseLess() || parser.parseKeyword("fraction") ||
      parser.parseFloat(fraction) || parser.parseComma() ||
      parser.parseKeyword("every") || parser.parseInteger(every) ||
      parser.parseComma() || parser.parseKeyword("lambda") ||
      parser.parseFloat(lambda) || parser.parseGreater())
    return {};
  return getChecked([&] { return parser.emitError(loc); },
                    parser.getContext(), APFloat(fraction), every,
                    APFloat(lambda));
}

void SapsAttr::print(AsmPrinter &printer) const {
  printer << "<fraction ";
  printer.printFloat(getFraction());
  printer << ", every " << getEvery() << ", lambda ";
  printer.printFloat(getLambda());
  printer << '>';
}

LogicalResult SapsAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                               APFloat fraction, int64_t every,
                               APFloat lambda) {
  if (!limits::kSapsEvery.contains(every))
    return emitError() << "saps every must lie in [" << limits::kSapsEvery.lo
                       << ", " << limits::kSapsEvery.hi << "], got " << every;
  return failure(failed(checkReal(emitError, "saps fraction",
                                  fraction.convertToDouble(),
                                  limits::kSapsFraction)) ||
                 failed(checkReal(emitError, "saps lambda",
                                  lambda.convertToDouble(),
                                  limits::kSapsLambda)));
}

SapsAttr SapsAttr::get(MLIRContext *context, const mtprt::SapsConfig &c) {
  return get(context, APFloat(c.fraction), c.every, APFloat(c.lambda));
}

mtprt::SapsConfig SapsAttr::getConfig() const {
  return {getFraction().convertToDouble(), getEvery(),
          getLambda().convertToDouble()};
}

//===----------------------------------------------------------------------===//
// EwcAttr
//===----------------------------------------------------------------------===//

// <lambda 1.0e+04, batches 8[, threshold 6.0e-01]>
Attribute EwcAttr::parse(AsmParser &parser, Type) {
  SMLoc loc = parser.getCurrentLocation();
  double lambda, threshold = mtprt::EwcConfig::kAlways;
  int64_t batches;
  if (parser.parseLess() || parser.parseKeyword("lambda") ||
      parser.parseFloat(lambda) || parser.parseComma() ||
      parser.parseKeyword("batches") || parser.parseInteger(batches))
    return {};
  if (succeeded(parser.parseOptionalComma()) &&
      (parser.parseKeyword("threshold") || parser.parseFloat(threshold)))
    return {};
  if (parser.parseGreater())
    return {};
  return getChecked([&] { return parser.emitError(loc); },
                    parser.getContext(), APFloat(lambda), batches,
                    APFloat(threshold));
}

void EwcAttr::print(AsmPrinter &printer) const {
  printer << "<lambda ";
  printer.printFloat(getLambda());
  printer << ", batches " << getBatches();
  if (getConfig().detects()) {
    printer << ", threshold ";
    printer.printFloat(getThreshold());
  }
  printer << '>';
}

LogicalResult EwcAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                              APFloat lambda, int64_t batches,
                              APFloat threshold) {
  if (!limits::kEwcBatches.contains(batches))
    return emitError() << "ewc batches must lie in [" << limits::kEwcBatches.lo
                       << ", " << limits::kEwcBatches.hi << "], got "
                       << batches;
  if (threshold.convertToDouble() != mtprt::EwcConfig::kAlways &&
      failed(checkReal(emitError, "ewc threshold", threshold.convertToDouble(),
                       limits::kEwcThreshold)))
    return failure();
  return checkReal(emitError, "ewc lambda", lambda.convertToDouble(),
                   limits::kEwcLambda);
}

EwcAttr EwcAttr::get(MLIRContext *context, const mtprt::EwcConfig &c) {
  return get(context, APFloat(c.lambda), c.fisherBatches, APFloat(c.threshold));
}

mtprt::EwcConfig EwcAttr::getConfig() const {
  mtprt::EwcConfig c;
  c.lambda = getLambda().convertToDouble();
  c.fisherBatches = getBatches();
  c.threshold = getThreshold().convertToDouble();
  return c;
}

//===----------------------------------------------------------------------===//
// PipelineChoiceAttr
//===----------------------------------------------------------------------===//

// <2 stages peak 21037056 step 1.2e-02 fits | refused "why">
Attribute PipelineChoiceAttr::parse(AsmParser &parser, Type) {
  SMLoc loc = parser.getCurrentLocation();
  int64_t stages = 0, peak = 0;
  double step = 0;
  std::string refusal;
  if (parser.parseLess() || parser.parseInteger(stages) ||
      parser.parseKeyword("stages") || parser.parseKeyword("peak") ||
      parser.parseInteger(peak) || parser.parseKeyword("step") ||
      parser.parseFloat(step))
    return {};
  if (failed(parser.parseOptionalKeyword("fits")) &&
      (parser.parseKeyword("refused") || parser.parseString(&refusal)))
    return {};
  if (parser.parseGreater())
    return {};
  return getChecked([&] { return parser.emitError(loc); },
                    parser.getContext(), stages, peak, APFloat(step),
                    StringAttr::get(parser.getContext(), refusal));
}

void PipelineChoiceAttr::print(AsmPrinter &printer) const {
  printer << '<' << getStages() << " stages peak " << getPeakBytes()
          << " step ";
  printer.printFloat(getStepSeconds());
  if (fits())
    printer << " fits>";
  else {
    printer << " refused ";
    printer.printString(getRefusal().getValue());
    printer << '>';
  }
}

LogicalResult
PipelineChoiceAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                           int64_t stages, int64_t peak, APFloat step,
                           StringAttr) {
  if (!limits::kPipelineStages.contains(stages))
    return emitError() << "a pipeline choice's stages must lie in ["
                       << limits::kPipelineStages.lo << ", "
                       << limits::kPipelineStages.hi << "], got " << stages;
  if (peak < 0 || !(step.convertToDouble() >= 0.0) ||
      std::isinf(step.convertToDouble()))
    return emitError() << "a pipeline choice's peak and step must be "
                          "non-negative and finite";
  return success();
}

//===----------------------------------------------------------------------===//
// AdaptersAttr
//===----------------------------------------------------------------------===//

// <bottleneck 8 | auto, separation 1.0e-01[, share 5.0e-01[, regroup 100]]>
Attribute AdaptersAttr::parse(AsmParser &parser, Type) {
  SMLoc loc = parser.getCurrentLocation();
  int64_t bottleneck = 0;
  double separation;
  if (parser.parseLess() || parser.parseKeyword("bottleneck"))
    return {};
  if (failed(parser.parseOptionalKeyword("auto")) &&
      parser.parseInteger(bottleneck))
    return {};
  if (parser.parseComma() || parser.parseKeyword("separation") ||
      parser.parseFloat(separation))
    return {};
  std::optional<APFloat> share;
  if (succeeded(parser.parseOptionalComma())) {
    double t;
    if (parser.parseKeyword("share") || parser.parseFloat(t))
      return {};
    share = APFloat(t);
  }
  std::optional<int64_t> regroup;
  if (share && succeeded(parser.parseOptionalComma())) {
    int64_t n;
    if (parser.parseKeyword("regroup") || parser.parseInteger(n))
      return {};
    regroup = n;
  }
  if (parser.parseGreater())
    return {};
  return getChecked([&] { return parser.emitError(loc); },
                    parser.getContext(), bottleneck, APFloat(separation),
                    share, regroup);
}

void AdaptersAttr::print(AsmPrinter &printer) const {
  printer << "<bottleneck ";
  if (getBottleneck() == 0)
    printer << "auto";
  else
    printer << getBottleneck();
  printer << ", separation ";
  printer.printFloat(getSeparation());
  if (getShare()) {
    printer << ", share ";
    printer.printFloat(*getShare());
  }
  if (getRegroup())
    printer << ", regroup " << *getRegroup();
  printer << '>';
}

LogicalResult
AdaptersAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                     int64_t bottleneck, APFloat separation,
                     std::optional<APFloat> share,
                     std::optional<int64_t> regroup) {
  if (bottleneck != 0 && !limits::kAdapterBottleneck.contains(bottleneck))
    return emitError() << "adapters bottleneck must be auto or lie in ["
                       << limits::kAdapterBottleneck.lo << ", "
                       << limits::kAdapterBottleneck.hi << "], got "
                       << bottleneck;
  if (share && failed(checkReal(emitError, "adapters share",
                                share->convertToDouble(),
                                limits::kAdapterShare)))
    return failure();
  if (regroup && !share)
    return emitError() << "adapters regroup splits groups formed by share: "
                          "give share too";
  if (regroup && !limits::kAdapterRegroup.contains(*regroup))
    return emitError() << "adapters regroup must lie in ["
                       << limits::kAdapterRegroup.lo << ", "
                       << limits::kAdapterRegroup.hi << "] steps, got "
                       << *regroup;
  return checkReal(emitError, "adapters separation",
                   separation.convertToDouble(), limits::kAdapterSeparation);
}

AdaptersAttr AdaptersAttr::get(MLIRContext *context,
                               const mtprt::AdapterConfig &c) {
  return get(context, c.bottleneck, APFloat(c.separation),
             c.share ? std::optional<APFloat>(APFloat(*c.share))
                     : std::nullopt,
             c.regroup ? std::optional<int64_t>(c.regroup) : std::nullopt);
}

mtprt::AdapterConfig AdaptersAttr::getConfig() const {
  mtprt::AdapterConfig c;
  c.bottleneck = getBottleneck();
  c.separation = getSeparation().convertToDouble();
  if (getShare())
    c.share = getShare()->convertToDouble();
  c.regroup = getRegroup().value_or(0);
  return c;
}

mtprt::BatchSchedule BatchScheduleAttr::getSchedule() const {
  mtprt::BatchSchedule s;
  s.start = getStart();
  s.max = getMax();
  s.rate = getRate().convertToDouble();
  s.rampSteps = getRampSteps();
  s.decay = getDecay().convertToDouble();
  s.every = getEvery();
  s.floor = getFloor();
  return s;
}

static ParseResult parseSchedule(OpAsmParser &parser, LRScheduleAttr &attr) {
  FailureOr<LRScheduleAttr> parsed = LRScheduleAttr::parseBare(parser);
  if (failed(parsed))
    return failure();
  attr = *parsed;
  return success();
}

static void printSchedule(OpAsmPrinter &printer, Operation *,
                          LRScheduleAttr attr) {
  attr.printBare(printer);
}

//===----------------------------------------------------------------------===//
// StepPlanAttr
//===----------------------------------------------------------------------===//

// <peak N, keep N, uniform N, minimal N, added F, uniform_added F,
//  [step F [measured],] [search N optimal|stopped [bound F],] regions [A to B, ...], offloads ["unit" BYTES stream S wait F, ...]>
Attribute StepPlanAttr::parse(AsmParser &parser, Type) {
  SMLoc loc = parser.getCurrentLocation();
  int64_t peaks[4], nodes;
  double added, uniformAdded, step = 0, bound = 0;
  bool measured = false;
  StringRef searched;
  SmallVector<PlanRegion> regions;
  SmallVector<PlanOffload> offloads;
  if (parser.parseLess() || parser.parseKeyword("peak") ||
      parser.parseInteger(peaks[0]) || parser.parseComma() ||
      parser.parseKeyword("keep") || parser.parseInteger(peaks[1]) ||
      parser.parseComma() || parser.parseKeyword("uniform") ||
      parser.parseInteger(peaks[2]) || parser.parseComma() ||
      parser.parseKeyword("minimal") || parser.parseInteger(peaks[3]) ||
      parser.parseComma() || parser.parseKeyword("added") ||
      parser.parseFloat(added) || parser.parseComma() ||
      parser.parseKeyword("uniform_added") || parser.parseFloat(uniformAdded) ||
      parser.parseComma())
    return {};
  // The predicted step is optional (unknown: 0).
  if (succeeded(parser.parseOptionalKeyword("step"))) {
    if (parser.parseFloat(step))
      return {};
    measured = succeeded(parser.parseOptionalKeyword("measured"));
    if (parser.parseComma())
      return {};
  }
  // The search's figures are optional (a step planned before they were
  // recorded reads as a heuristic's plan).
  nodes = 0;
  searched = "stopped";
  SMLoc searchLoc = loc;
  if (succeeded(parser.parseOptionalKeyword("search")) &&
      (parser.parseInteger(nodes) ||
       (searchLoc = parser.getCurrentLocation(),
        parser.parseKeyword(&searched)) ||
       (succeeded(parser.parseOptionalKeyword("bound")) &&
        parser.parseFloat(bound)) ||
       parser.parseComma()))
    return {};
  if (parser.parseKeyword("regions"))
    return {};
  auto parseRegion = [&]() -> ParseResult {
    PlanRegion r;
    if (parser.parseInteger(r.first) || parser.parseKeyword("to") ||
        parser.parseInteger(r.last))
      return failure();
    regions.push_back(r);
    return success();
  };
  auto parseOffload = [&]() -> ParseResult {
    std::string unit;
    PlanOffload o;
    if (parser.parseString(&unit) || parser.parseInteger(o.bytes) ||
        parser.parseKeyword("stream") || parser.parseInteger(o.stream) ||
        parser.parseKeyword("wait") || parser.parseFloat(o.exposedWait))
      return failure();
    o.unit = StringAttr::get(parser.getContext(), unit);
    offloads.push_back(o);
    return success();
  };
  if (searched != "optimal" && searched != "stopped") {
    parser.emitError(searchLoc, "expected 'optimal' or 'stopped' after the "
                                "search's "
                          "node count, got '")
        << searched << "'";
    return {};
  }

  if (parser.parseCommaSeparatedList(AsmParser::Delimiter::Square,
                                     parseRegion) ||
      parser.parseComma() || parser.parseKeyword("offloads") ||
      parser.parseCommaSeparatedList(AsmParser::Delimiter::Square,
                                     parseOffload) ||
      parser.parseGreater())
    return {};
  return getChecked([&] { return parser.emitError(loc); }, parser.getContext(),
                    peaks[0], peaks[1], peaks[2], peaks[3], APFloat(added),
                    APFloat(uniformAdded), APFloat(step), measured, nodes,
                    searched == "optimal", APFloat(bound),
                    ArrayRef<PlanRegion>(regions),
                    ArrayRef<PlanOffload>(offloads));
}

void StepPlanAttr::print(AsmPrinter &printer) const {
  printer << "<peak " << getPlannedPeakBytes() << ", keep "
          << getKeepPeakBytes() << ", uniform " << getUniformPeakBytes()
          << ", minimal " << getMinimalPeakBytes() << ", added ";
  printer.printFloat(getAddedSeconds());
  printer << ", uniform_added ";
  printer.printFloat(getUniformAddedSeconds());
  if (!getKeepStepSeconds().isZero()) {
    printer << ", step ";
    printer.printFloat(getKeepStepSeconds());
    if (getMeasuredCosts())
      printer << " measured";
  }
  printer << ", search " << getSearchNodes()
          << (getOptimal() ? " optimal" : " stopped");
  if (!getOptimal() && !getLowerBoundSeconds().isZero()) {
    printer << " bound ";
    printer.printFloat(getLowerBoundSeconds());
  }
  printer << ", regions [";
  llvm::interleaveComma(getRegions(), printer, [&](const PlanRegion &r) {
    printer << r.first << " to " << r.last;
  });
  printer << "], offloads [";
  llvm::interleaveComma(getOffloads(), printer, [&](const PlanOffload &o) {
    printer.printString(o.unit.getValue());
    printer << ' ' << o.bytes << " stream " << o.stream << " wait ";
    printer.printFloat(APFloat(o.exposedWait));
  });
  printer << "]>";
}

LogicalResult
StepPlanAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                     int64_t planned, int64_t keep, int64_t uniform,
                     int64_t minimal, APFloat added, APFloat uniformAdded,
                     APFloat keepStep, bool measuredCosts, int64_t searchNodes,
                     bool optimal, APFloat lowerBound,
                     ArrayRef<PlanRegion> regions,
                     ArrayRef<PlanOffload> offloads) {
  for (int64_t bytes : {planned, keep, uniform, minimal})
    if (bytes < 0 || bytes > limits::kMaxBytes)
      return emitError() << "plan peak " << bytes << " B is outside [0, "
                         << limits::kMaxBytes << "]";
  if (searchNodes < 0)
    return emitError() << "plan's search node count must be >= 0, got "
                       << searchNodes;
  if (optimal && !lowerBound.isZero())
    return emitError() << "an optimal plan's search has no bound (its plan "
                          "is the optimum); drop `bound`";
  for (const APFloat &s : {added, uniformAdded, keepStep, lowerBound})
    if (!s.isFinite() || s.isNegative())
      return emitError() << "plan's added, step and bound seconds must be finite "
                            "and >= 0";
  int64_t previous = 0;
  for (const PlanRegion &r : regions) {
    if (r.first <= previous || r.last < r.first)
      return emitError() << "plan regions must be ascending, disjoint block "
                            "ranges from 1; got "
                         << r.first << " to " << r.last;
    previous = r.last;
  }
  for (const PlanOffload &o : offloads)
    if (o.bytes < 0 || o.bytes > limits::kMaxBytes || o.stream < 0 ||
        !std::isfinite(o.exposedWait) || o.exposedWait < 0)
      return emitError() << "plan offload of '" << o.unit.getValue()
                         << "' has an invalid size, stream or wait";
  return success();
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

StrategyOp ModelOp::getStrategy() {
  auto range = getBody().getOps<StrategyOp>();
  return range.empty() ? StrategyOp() : *range.begin();
}

TrainOp ModelOp::getTrain() {
  auto range = getBody().getOps<TrainOp>();
  return range.empty() ? TrainOp() : *range.begin();
}

/// At most one op of type OpT in the model's body.
/// Each size lies within mtprt/Limits.h, but their products need not fit
/// in int64: the cost model multiplies batch, sequence, widths and layers in
/// integer bytes and FLOPs. Bounding the step's totals here, in floating
/// point with a margin, keeps all of its arithmetic exact (no formula needs
/// to check): a 70B Llama at seq 8192 stays 100x inside.
static LogicalResult verifySizes(ModelOp model) {
  BackboneOp backbone = model.getBackbone();
  if (!backbone)
    return success();
  BudgetOp budget = model.getBudget();
  double micro = budget ? double(budget.getMicroBatch()) : 8.0;
  double seq = double(backbone.getSeq()), hidden = double(backbone.getHidden());
  double ffn = double(backbone.getFfn()), heads = double(backbone.getHeads());
  // A transformer layer's tensors per token (norms, QKV, attention rows of
  // seq per head, MLP) and FLOPs (forward + backward, ~3x the forward),
  // with a 4x margin over what the cost model counts.
  double layerBytes = 4 * micro * seq * 8 * (16 * hidden + 4 * ffn + 4 * heads * seq);
  double layerFlops = 4 * micro * seq * 6 * (4 * hidden * hidden + 2 * hidden * ffn + 2 * seq * hidden);
  double layers = double(backbone.getLayers());
  double bytes = layers * layerBytes, flops = layers * layerFlops;
  double params = layers * (4 * hidden * hidden + 2 * hidden * ffn) +
                  double(backbone.getVocab()) * hidden;
  for (TaskOp task : model.getTasks()) {
    double out = double(std::max({task.getClasses().value_or(0),
                                  task.getLabels().value_or(0),
                                  task.getVocab().value_or(0)}));
    double depth = double(task.getLayers().value_or(0));
    bytes += depth * layerBytes + 4 * micro * seq * 8 * 4 * out;
    flops += depth * layerFlops + 4 * micro * seq * 6 * hidden * out;
    params += depth * (4 * hidden * hidden + 2 * hidden * ffn) + hidden * out;
  }
  bytes += 16 * params;
  if (bytes > double(limits::kMaxBytes) || flops > double(limits::kMaxFlops))
    return model.emitOpError("is too large to plan: about ")
           << llvm::formatv("{0:e2}", bytes).str() << " bytes and "
           << llvm::formatv("{0:e2}", flops).str()
           << " FLOPs per step pass the 64-bit arithmetic the planner "
              "works in (at most 2^60 bytes and 2^62 FLOPs); lower "
              "micro_batch, seq or the widths";
  return success();
}

template <typename OpT>
static LogicalResult verifyAtMostOne(ModelOp model, StringRef what) {
  SmallVector<OpT> ops(model.getBody().getOps<OpT>());
  if (ops.size() > 1)
    return ops[1].emitOpError("duplicates the model's ")
        .append(what)
        .attachNote(ops[0].getLoc())
        .append("first ", what, " here");
  return success();
}

StepOp ModelOp::getStep() {
  auto range = getBody().getOps<StepOp>();
  return range.empty() ? StepOp() : *range.begin();
}

LogicalResult ModelOp::verifyRegions() {
  SmallVector<BackboneOp> backbones(getBody().getOps<BackboneOp>());
  if (backbones.empty())
    return emitOpError("needs an 'mtp.backbone'");
  if (backbones.size() > 1)
    return backbones[1].emitOpError("duplicates the model's backbone")
        .attachNote(backbones[0].getLoc())
        .append("first backbone here");

  if (failed(verifyAtMostOne<BudgetOp>(*this, "budget")) ||
      failed(verifyAtMostOne<StrategyOp>(*this, "strategy")) ||
      failed(verifyAtMostOne<TrainOp>(*this, "training settings")))
    return failure();

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
  return verifySizes(*this);
}

//===----------------------------------------------------------------------===//
// BackboneOp
//===----------------------------------------------------------------------===//


/// The shared bounds (mtprt/Limits.h) on an integer the op carries: the same
/// ones Sema reports on a `.mtp` and the runtime checks in a plan.
static LogicalResult checkRange(Operation *op, StringRef what, int64_t value,
                                limits::Range range) {
  if (range.contains(value))
    return success();
  return op->emitOpError() << what << " must lie in [" << range.lo << ", "
                           << range.hi << "], got " << value;
}

LogicalResult BackboneOp::verify() {
  for (auto [what, value, range] :
       {std::tuple<StringRef, int64_t, limits::Range>{"layers", getLayers(),
                                                      limits::kLayers},
        {"hidden", getHidden(), limits::kHidden},
        {"heads", getHeads(), limits::kHeads},
        {"ffn", getFfn(), limits::kFfn},
        {"vocab", getVocab(), limits::kVocab},
        {"seq", getSeq(), limits::kSeq}})
    if (failed(checkRange(*this, what, value, range)))
      return failure();
  if (getHidden() % getHeads() != 0)
    return emitOpError("hidden size ")
           << getHidden() << " does not split into " << getHeads()
           << " attention heads";
  if (std::optional<uint64_t> p = getPositions()) {
    if (failed(checkRange(*this, "positions", *p, limits::kPositions)))
      return failure();
    if (*p < getSeq())
      return emitOpError("has ")
             << *p << " position rows, fewer than seq = " << getSeq();
  }
  if (getNormEps() &&
      failed(checkReal(*this, "norm_eps", getNormEpsilon(), limits::kNormEps)))
    return failure();
  if (isLlama()) {
    if (getPointwise() == PointwiseKind::fused)
      return emitOpError("pointwise fused: llama's RMSNorm and SwiGLU run on "
                         "ATen's pointwise ops (pointwise aten)");
    if (getAttention() == AttentionKind::math)
      return emitOpError("attention math: llama runs the fused attention "
                         "kernel only (grouped queries, rotary positions)");
    if (getKvHeadCount() < 1 || getHeads() % getKvHeadCount() != 0)
      return emitOpError("kv_heads ")
             << getKvHeadCount() << " does not divide heads " << getHeads();
    if (getHeadDim() % 2)
      return emitOpError("rotary positions need an even head size, got ")
             << getHeadDim();
    if (getRopeTheta() && !(getRopeTheta()->convertToDouble() > 0))
      return emitOpError("rope_theta must be positive");
    if (std::optional<ArrayRef<double>> r = getRopeScaling()) {
      if (r->size() != 4)
        return emitOpError("rope_scaling holds [factor, low_freq_factor, "
                           "high_freq_factor, original positions]");
      if (!((*r)[0] > 0 && (*r)[1] > 0 && (*r)[2] > (*r)[1] && (*r)[3] >= 1))
        return emitOpError("rope_scaling needs factor > 0, 0 < "
                           "low_freq_factor < high_freq_factor, original "
                           "positions >= 1");
    }
  } else if (getKvHeads() || getRopeTheta() || getRopeScaling()) {
    return emitOpError("kv_heads, rope_theta and rope_scaling are llama's");
  }
  if (isPostNorm() && getPointwise() == PointwiseKind::fused)
    return emitOpError("pointwise fused: a post-norm (bert) backbone runs "
                       "ATen's pointwise ops (pointwise aten)");
  if (!isPostNorm() && (getTypeVocab() || getPositionPad()))
    return emitOpError("type_vocab and position_pad are bert's");
  if (std::optional<uint64_t> p = getTokenPad(); p && *p >= getVocab())
    return emitOpError("token_pad ") << *p << " is not a token id";
  if (std::optional<uint64_t> p = getPositionPad()) {
    const int64_t pad = int64_t(*p), end = pad + 1 + int64_t(getSeq());
    if (pad < 0 || pad >= int64_t(getVocab()) || end > getPositionRows())
      return emitOpError("position_pad ")
             << pad << ": a token id whose + 1 + seq = " << end
             << " fits the " << getPositionRows() << " position rows";
  }
  if (std::optional<ArrayRef<int64_t>> f = getFreeze())
    if (f->size() != 2 || (*f)[0] < 0 || (*f)[0] > (*f)[1] ||
        (*f)[1] > int64_t(getLayers()))
      return emitOpError("freeze holds [first, last] with 0 <= first <= "
                         "last <= layers (")
             << getLayers() << ")";
  if (getWeights() && getKind() == BackboneKind::transformer)
    return emitOpError("a transformer backbone has no Hugging Face weights "
                       "to load; declare the checkpoint's family");
  if (hasGeluTanh() && getPointwise() == PointwiseKind::fused)
    return emitOpError("pointwise fused computes GELU's erf form; a ")
           << stringifyBackboneKind(getKind())
           << " backbone's GELU is the tanh form: pointwise aten";
  return checkReal(*this, "dropout", getDropout().convertToDouble(),
                   limits::kDropout);
}

//===----------------------------------------------------------------------===//
// TaskOp
//===----------------------------------------------------------------------===//

namespace {
/// The head parameters each head kind takes, in printing order.
ArrayRef<StringLiteral> headParams(HeadKind kind) {
  static constexpr StringLiteral classify[] = {"classes"};
  static constexpr StringLiteral tag[] = {"labels"};
  static constexpr StringLiteral decoder[] = {"layers", "vocab", "target_seq"};
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

// custom<HeadParams>: `(key = N, ...)`, the head's integer parameters in one
// list (classes, labels, layers, vocab, target_seq; printed in that order).
static ParseResult parseHeadParams(OpAsmParser &parser, IntegerAttr &classes,
                                   IntegerAttr &labels, IntegerAttr &layers,
                                   IntegerAttr &vocab, IntegerAttr &targetSeq) {
  std::pair<StringLiteral, IntegerAttr *> params[] = {
      {"classes", &classes}, {"labels", &labels}, {"layers", &layers},
      {"vocab", &vocab},     {"target_seq", &targetSeq}};
  auto parseParam = [&]() -> ParseResult {
    SMLoc loc = parser.getCurrentLocation();
    StringRef key;
    int64_t value;
    if (parser.parseKeyword(&key) || parser.parseEqual() ||
        parser.parseInteger(value))
      return failure();
    auto *it = llvm::find_if(params, [&](auto &p) { return p.first == key; });
    if (it == std::end(params))
      return parser.emitError(loc, "unknown head parameter '")
             << key << "' (expected classes, labels, layers, vocab or "
                       "target_seq)";
    if (*it->second)
      return parser.emitError(loc, "parameter '") << key << "' given twice";
    *it->second = parser.getBuilder().getI64IntegerAttr(value);
    return success();
  };
  return parser.parseCommaSeparatedList(AsmParser::Delimiter::Paren,
                                        parseParam);
}

static void printHeadParams(OpAsmPrinter &printer, Operation *,
                            IntegerAttr classes, IntegerAttr labels,
                            IntegerAttr layers, IntegerAttr vocab,
                            IntegerAttr targetSeq) {
  std::pair<StringLiteral, IntegerAttr> params[] = {{"classes", classes},
                                                    {"labels", labels},
                                                    {"layers", layers},
                                                    {"vocab", vocab},
                                                    {"target_seq", targetSeq}};
  printer << '(';
  bool first = true;
  for (auto [key, value] : params) {
    if (!value)
      continue;
    printer << (first ? "" : ", ") << key << " = " << value.getInt();
    first = false;
  }
  printer << ')';
}

LogicalResult TaskOp::verify() {
  // Each kind takes exactly its own parameters.
  ArrayRef<StringLiteral> wanted = headParams(getHead());
  StringRef kind = stringifyHeadKind(getHead());
  for (StringRef key : {"classes", "labels", "layers", "vocab", "target_seq"}) {
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

  if (failed(checkReal(*this, "loss weight", getWeight().convertToDouble(),
                       limits::kLossWeight)))
    return failure();

  for (auto [what, value, range] :
       {std::tuple<StringRef, std::optional<uint64_t>, limits::Range>{
            "classes", getClasses(), limits::kClasses},
        {"labels", getLabels(), limits::kLabels},
        {"decoder layers", getLayers(), limits::kDecoderLayers},
        {"vocab", getVocab(), limits::kVocab},
        {"target_seq", getTargetSeq(), limits::kSeq}})
    if (value && failed(checkRange(*this, what, int64_t(*value), range)))
      return failure();

  auto model = (*this)->getParentOfType<ModelOp>();
  if (BackboneOp backbone = model ? model.getBackbone() : BackboneOp()) {
    if (getTapLayer() > backbone.getLayers())
      return emitOpError("reads layer ")
                 << getTapLayer() << " but the backbone has "
                 << backbone.getLayers() << " layers (0 = embeddings)";
    if (std::optional<uint64_t> target = getTargetSeq();
        target && int64_t(*target) > backbone.getSeq())
      return emitOpError("decodes ")
             << *target << " target tokens, more than the backbone's seq "
             << backbone.getSeq();
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
  for (auto [what, value, range] :
       {std::tuple<StringRef, int64_t, limits::Range>{"gpus", getGpus(),
                                                      limits::kGpus},
        {"micro_batch", getMicroBatch(), limits::kMicroBatch},
        {"global_batch", getGlobalBatch(), limits::kGlobalBatch}})
    if (failed(checkRange(*this, what, value, range)))
      return failure();
  if (getHeadroom() >= getMemory())
    return emitOpError("headroom (")
           << getHeadroom() << " bytes) leaves nothing of the device's "
           << getMemory() << " bytes";
  if (getPipeline()) {
    if (failed(checkRange(*this, "pipeline", getPipelineStages(),
                          limits::kPipelineStages)))
      return failure();
    if (getGpus() % getPipelineStages() != 0)
      return emitOpError("gpus ")
             << getGpus() << " is not a multiple of the pipeline's "
             << getPipelineStages() << " stages";
  }
  if (getGpipe() && getPipelineStages() < 2 && !getPipelineAuto())
    return emitOpError("gpipe needs a pipeline of two stages or more");
  if (getPipelineChoices() && !getPipelineAuto())
    return emitOpError("choices are pipeline_auto's record; it is absent");
  if (getPipelineAuto() && (getZero() || getZeroAuto()))
    return emitOpError("pipeline_auto with ZeRO: a pipeline's stages do not "
                       "shard their state (docs/pipeline.md)");
  if (std::optional<ArrayRef<int64_t>> starts = getStageStarts()) {
    if (int64_t(starts->size()) != getPipelineStages() || starts->empty() ||
        starts->front() != 0)
      return emitOpError("stages needs one first unit per pipeline stage (")
             << getPipelineStages() << "), the first 0";
    for (size_t i = 1; i < starts->size(); ++i)
      if ((*starts)[i] <= (*starts)[i - 1])
        return emitOpError("stages' first units must increase");
  }
  int64_t perStep = getMicroBatch() * getReplicas();
  if (getGlobalBatch() % perStep != 0)
    return emitOpError("global batch ")
           << getGlobalBatch() << " is not a multiple of micro_batch x "
           << (getPipeline() ? "replicas" : "gpus") << " = " << perStep;
  if (getZeroStage() > 3)
    return emitOpError("ZeRO stage ") << getZeroStage() << " is not 1, 2 or 3";
  if (getZero() && getZeroAuto())
    return emitOpError("has both a ZeRO stage and zero_auto");
  if (std::optional<APFloat> flops = getPeakFlops())
    if (!(flops->convertToDouble() > 0.0) || std::isinf(flops->convertToDouble()))
      return emitOpError("peak FLOP/s must be positive, got ")
             << flops->convertToDouble();
  if (getPrecision() == Precision::fp16 && getDevice() == "cpu")
    return emitOpError("fp16 needs a GPU (loss scaling); use bf16 or fp32 on "
                       "'cpu'");
  return success();
}

//===----------------------------------------------------------------------===//
// StrategyOp
//===----------------------------------------------------------------------===//

/// True when `value` lies in [lo, hi] (or (lo, hi] with openLo).
static bool inRange(double value, double lo, double hi, bool openLo = false) {
  return (openLo ? value > lo : value >= lo) && value <= hi;
}

LogicalResult StrategyOp::verify() {
  if (failed(checkRange(*this, "quantization block", getQuantBlock(),
                        limits::kQuantBlock)))
    return failure();
  if (std::optional<uint64_t> hidden = getDgfgHidden())
    if (failed(checkRange(*this, "DGFG hidden width", int64_t(*hidden),
                          limits::kDgfgHidden)))
      return failure();
  double threshold = getGroupThreshold().convertToDouble();
  if (!inRange(threshold, -1.0, 1.0))
    return emitOpError("group threshold must lie in [-1, 1], got ")
           << threshold;
  double latency = getMaxOffloadLatency().convertToDouble();
  if (!(latency > 0.0) || std::isinf(latency))
    return emitOpError("offload latency bound must be positive, got ")
           << latency << " s";
  if (std::optional<APFloat> keep = getGfmKeep())
    if (failed(checkReal(*this, "GFM keep fraction", keep->convertToDouble(),
                         limits::kGfmKeep)))
      return failure();
  for (auto [name, value, range] :
       {std::tuple<StringRef, double, limits::RealRange>{
            "reuse threshold", getReuseThreshold().convertToDouble(),
            limits::kRecalibration},
        {"similarity std threshold", getSimStdThreshold().convertToDouble(),
         limits::kRecalibration},
        {"residual decay", getResidualDecay().convertToDouble(),
         limits::kResidualDecay},
        {"clip max_norm", getClipMaxNorm().convertToDouble(),
         limits::kClipNorm},
        {"top-k fraction", getTopk().convertToDouble(), limits::kTopK}})
    if (failed(checkReal(*this, name, value, range)))
      return failure();
  int64_t bits = getQuantBits();
  if (bits != 2 && bits != 4 && bits != 8 && bits != 16)
    return emitOpError("quantization bits must be 2, 4, 8 or 16, got ")
           << bits;
  if (std::optional<uint64_t> hidden = getDgfgHidden()) {
    auto model = (*this)->getParentOfType<ModelOp>();
    int64_t tasks = llvm::range_size(model.getTasks());
    int64_t params = dgfgParameterCount(tasks, *hidden);
    if (params >= kDgfgMaxParameters)
      return emitOpError("DGFG gate of width ")
             << *hidden << " over " << tasks << " tasks has " << params
             << " parameters; the gate must stay under "
             << kDgfgMaxParameters;
  }
  if (auto model = (*this)->getParentOfType<ModelOp>())
    if (BackboneOp backbone = model.getBackbone())
      if (getGradientScope() == GradientScope::params &&
          getScopeLayers() > backbone.getLayers())
        return emitOpError("gradient scope covers ")
               << getScopeLayers() << " layers but the backbone has "
               << backbone.getLayers();
  if (AdaptersAttr adapters = getAdaptersAttr())
    if (auto model = (*this)->getParentOfType<ModelOp>())
      if (BackboneOp backbone = model.getBackbone())
        if (adapters.getBottleneck() > int64_t(backbone.getHidden()))
          return emitOpError("adapters bottleneck ")
                 << adapters.getBottleneck() << " is wider than the hidden size "
                 << backbone.getHidden();
  if (getSapsAttr() && getGradientScope() == GradientScope::params)
    return emitOpError("saps folds the backbone's gradients as autograd "
                       "makes them; the params scope needs them whole");
  // The plan is for the largest batch the schedule reaches.
  if (BatchScheduleAttr schedule = getDynamicBatchAttr())
    if (auto model = (*this)->getParentOfType<ModelOp>())
      if (BudgetOp budget = model.getBudget()) {
        // Checked here, not trusted: the budget may not be verified yet.
        if (!limits::kMicroBatch.contains(budget.getMicroBatch()) ||
            !limits::kGpus.contains(budget.getGpus()))
          return success(); // the budget's own verifier says what is wrong
        const int64_t perStep = budget.getMicroBatch() * budget.getGpus();
        const int64_t largest = schedule.getSchedule().largestBatch(perStep);
        if (budget.getGlobalBatch() != largest)
          return emitOpError("dynamic batch reaches a global batch of ")
                 << largest << " but the budget's is "
                 << budget.getGlobalBatch()
                 << "; the budget's batch must be the schedule's largest";
      }
  return success();
}

//===----------------------------------------------------------------------===//
// TrainOp
//===----------------------------------------------------------------------===//

LogicalResult TrainOp::verify() {
  if (failed(checkRange(*this, "steps", getSteps(), limits::kSteps)) ||
      failed(checkRange(*this, "warm-up", getLr().getWarmup(),
                        limits::kWarmup)))
    return failure();
  if (getLr().getWarmup() > getSteps())
    return emitOpError("warm-up of ")
           << getLr().getWarmup() << " steps exceeds the " << getSteps()
           << " training steps";
  for (auto [name, value, range] :
       {std::tuple<StringRef, double, limits::RealRange>{
            "weight decay", getWeightDecay().convertToDouble(),
            limits::kWeightDecay},
        {"beta1", getBeta1().convertToDouble(), limits::kBeta},
        {"beta2", getBeta2().convertToDouble(), limits::kBeta},
        {"eps", getEps().convertToDouble(), limits::kEps}})
    if (failed(checkReal(*this, name, value, range)))
      return failure();
  if (ArrayAttr phases = getPhasesAttr()) {
    int64_t total = 0;
    auto model = (*this)->getParentOfType<ModelOp>();
    for (PhaseAttr phase : phases.getAsRange<PhaseAttr>()) {
      if (phase.getSteps() < 1 || phase.getTasks().empty())
        return emitOpError("a phase trains at least one task for at least "
                           "one step");
      total += phase.getSteps();
      for (FlatSymbolRefAttr task : phase.getTasks())
        if (model && !llvm::any_of(model.getTasks(), [&](TaskOp t) {
              return t.getSymName() == task.getValue();
            }))
          return emitOpError("phase names task ")
                 << task << ", which the model does not have";
    }
    if (total != getSteps())
      return emitOpError("phases take ")
             << total << " steps but the training has " << getSteps();
  }
  if (auto model = (*this)->getParentOfType<ModelOp>())
    if (StrategyOp s = model.getStrategy(); s && s.getEwcAttr()) {
      ArrayAttr phases = getPhasesAttr();
      if (!phases || phases.size() < 2)
        return emitOpError("ewc needs two phases or more");
    }
  return success();
}

//===----------------------------------------------------------------------===//
// Step IR
//===----------------------------------------------------------------------===//

void StepOp::build(OpBuilder &builder, OperationState &state) {
  Region *body = state.addRegion();
  body->push_back(new Block());
}

std::optional<UnitRef> mtp::getUnitRef(Operation *op) {
  if (auto fwd = dyn_cast<FwdOp>(op))
    return UnitRef{fwd.getUnit(), fwd.getLayer(), fwd.getTaskAttr()};
  if (auto bwd = dyn_cast<BwdOp>(op))
    return UnitRef{bwd.getUnit(), bwd.getLayer(), bwd.getTaskAttr()};
  return std::nullopt;
}

int64_t mtp::getBlockNumber(UnitKind kind, uint64_t layer) {
  switch (kind) {
  case UnitKind::embed:
    return 0;
  case UnitKind::head:
  case UnitKind::loss:
    return -1;
  case UnitKind::attn_norm:
  case UnitKind::qkv:
  case UnitKind::attn_core:
  case UnitKind::attn_out:
  case UnitKind::attn_residual:
    return 2 * int64_t(layer) - 1;
  case UnitKind::mlp_norm:
  case UnitKind::mlp_up:
  case UnitKind::mlp_act:
  case UnitKind::mlp_down:
  case UnitKind::mlp_residual:
  case UnitKind::final_norm:
    return 2 * int64_t(layer);
  }
  llvm_unreachable("unknown unit kind");
}

std::string FwdOp::getUnitName() {
  std::string name = stringifyUnitKind(getUnit()).str();
  if (FlatSymbolRefAttr task = getTaskAttr())
    return name + "_" + task.getValue().str();
  if (getUnit() != UnitKind::embed)
    name += std::to_string(getLayer());
  return name;
}

void FwdOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  std::string stem = getUnitName();
  setName(getOutput(), stem);
  ArrayAttr names = getSavedNamesAttr();
  for (auto [i, value] : llvm::enumerate(getSaved())) {
    if (names && i < names.size())
      setName(value, stem + "_" + cast<StringAttr>(names[i]).getValue().str());
    else
      setName(value, stem + "_saved");
  }
}

void BwdOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  std::string stem = "d_" + stringifyUnitKind(getUnit()).str();
  if (FlatSymbolRefAttr task = getTaskAttr())
    stem += "_" + task.getValue().str();
  else if (getUnit() != UnitKind::embed)
    stem += std::to_string(getLayer());
  for (Value value : getInputGrads())
    setName(value, stem);
}

//===----------------------------------------------------------------------===//
// Step IR verification: symbols, units, regions
//===----------------------------------------------------------------------===//

/// `ref` (if any) names an `mtp.task` of the enclosing model.
static LogicalResult verifyTaskRef(Operation *op, FlatSymbolRefAttr ref,
                                   SymbolTableCollection &symbolTable) {
  if (!ref)
    return success();
  auto model = op->getParentOfType<ModelOp>();
  Operation *target =
      model ? symbolTable.lookupSymbolIn(model, ref.getAttr()) : nullptr;
  if (!target)
    return op->emitOpError("names unknown task ") << ref;
  if (!isa<TaskOp>(target))
    return op->emitOpError("names ") << ref << ", which is not an 'mtp.task'";
  return success();
}

LogicalResult InputOp::verify() {
  StringRef name = getName();
  if (name == "tokens" && getTaskAttr())
    return emitOpError("'tokens' belong to the backbone and name no task");
  if (name == "labels" && !getTaskAttr())
    return emitOpError("'labels' need the task they belong to");
  if (name != "tokens" && name != "labels")
    return emitOpError("reads '")
           << name << "'; a step's inputs are 'tokens' and a task's 'labels'";
  return success();
}

LogicalResult InputOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  return verifyTaskRef(*this, getTaskAttr(), symbolTable);
}

LogicalResult WeightsOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  return verifyTaskRef(*this, getTaskAttr(), symbolTable);
}

LogicalResult FwdOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  return verifyTaskRef(*this, getTaskAttr(), symbolTable);
}

LogicalResult BwdOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  return verifyTaskRef(*this, getTaskAttr(), symbolTable);
}

LogicalResult
FuseTaskGradsOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  for (Attribute task : getTasks()) {
    auto ref = dyn_cast<FlatSymbolRefAttr>(task);
    if (!ref)
      return emitOpError("names task ") << task << ", not a flat symbol";
    if (failed(verifyTaskRef(*this, ref, symbolTable)))
      return failure();
  }
  return success();
}

/// A unit's layer fits its kind and the model's backbone: the embeddings,
/// heads and losses at 0, a backbone sub-block at 1..layers; a head or loss
/// names its task, a backbone unit none.
static LogicalResult verifyUnit(Operation *op, UnitKind unit, uint64_t layer,
                                FlatSymbolRefAttr task) {
  bool perTask = unit == UnitKind::head || unit == UnitKind::loss;
  if (perTask != static_cast<bool>(task))
    return op->emitOpError(perTask
                               ? "needs the task it belongs to"
                               : "belongs to the backbone and names no task");
  bool atZero = perTask || unit == UnitKind::embed;
  if (atZero && layer != 0)
    return op->emitOpError("unit '")
           << stringifyUnitKind(unit) << "' sits at layer 0, not " << layer;
  if (atZero)
    return success();
  auto model = op->getParentOfType<ModelOp>();
  BackboneOp backbone = model ? model.getBackbone() : BackboneOp();
  int64_t layers = backbone ? backbone.getLayers() : limits::kLayers.hi;
  if (layer < 1 || int64_t(layer) > layers)
    return op->emitOpError("unit '")
           << stringifyUnitKind(unit) << "' at layer " << layer
           << " outside the backbone's layers 1.." << layers;
  return success();
}

LogicalResult BwdOp::verify() {
  if (uint64_t n = getAliases()) {
    if (getGrads().size() != 1 || n > getInputGrads().size())
      return emitOpError("aliases ")
             << n << " needs one incoming gradient and at least " << n
             << " input gradients";
    for (Value g : getInputGrads().take_front(n))
      if (g.getType() != getGrads().front().getType())
        return emitOpError("an aliased input gradient has type ")
               << g.getType() << ", the incoming one "
               << getGrads().front().getType();
  }
  // What is freed at the peak was saved (an i1 element is a byte).
  if (uint64_t freed = getFreed()) {
    uint64_t saved = 0;
    for (Value v : getSaved()) {
      auto type = cast<RankedTensorType>(v.getType());
      if (!type.hasStaticShape())
        return emitOpError("freed ") << freed << " needs static saved shapes";
      saved += uint64_t(type.getNumElements()) *
               std::max<uint64_t>(1, type.getElementTypeBitWidth() / 8);
    }
    if (freed > saved)
      return emitOpError("frees ")
             << freed << " bytes at its peak but saves only " << saved;
  }
  return verifyUnit(*this, getUnit(), getLayer(), getTaskAttr());
}

/// A checkpoint or recompute region runs at least one backbone unit.
static LogicalResult verifyRegionUnits(Operation *op, Region &body) {
  bool any = false;
  body.walk([&](FwdOp fwd) {
    if (!fwd.getTaskAttr())
      any = true;
  });
  if (!any)
    return op->emitOpError("runs no backbone unit; a checkpoint region "
                           "holds the forward units it re-runs");
  return success();
}

LogicalResult CheckpointOp::verify() {
  return verifyRegionUnits(*this, getBody());
}

LogicalResult RecomputeOp::verify() {
  return verifyRegionUnits(*this, getBody());
}

/// The optimizer step's moments and master weights are resident state, not
/// workspace.
int64_t OptimizerStepOp::getWorkspaceBytes() { return 0; }

LogicalResult FwdOp::verify() {
  if (ArrayAttr names = getSavedNamesAttr())
    if (names.size() != getOutputs().size() - 1)
      return emitOpError("names ") << names.size() << " saved tensors but has "
                                   << getOutputs().size() - 1;
  if (getOutputs().empty())
    return emitOpError("produces no output");
  if (getDecision() == Decision::Partial)
    return emitOpError("is planned 'partial', a block's decision; a unit's "
                       "plan is keep, recompute or offload");
  if (getRegion() && getDecision() != Decision::Recompute)
    return emitOpError("names checkpoint region ")
           << *getRegion() << " but its plan is "
           << (getDecision() ? stringifyDecision(*getDecision()) : "none")
           << "; only a recomputed unit falls in a region";
  return verifyUnit(*this, getUnit(), getLayer(), getTaskAttr());
}

LogicalResult FuseTaskGradsOp::verify() {
  if (getGrads().size() != getTasks().size())
    return emitOpError("takes ")
           << getGrads().size() << " gradients for " << getTasks().size()
           << " tasks";
  // One fused gradient per tap layer: no more than the tasks, each of a
  // task gradient's type.
  if (getFused().empty() || getFused().size() > getGrads().size())
    return emitOpError("returns ")
           << getFused().size() << " fused gradients for " << getGrads().size()
           << " task gradients (one per tap layer expected)";
  for (Type t : getFused().getTypes())
    if (!llvm::is_contained(getGrads().getTypes(), t))
      return emitOpError("returns a fused gradient of type ")
             << t << " that no task gradient has";
  return success();
}

#define GET_OP_CLASSES
#include "dialect/MTPInterfaces.cpp.inc"
#include "dialect/MTPOps.cpp.inc"
