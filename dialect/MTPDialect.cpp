//===- MTPDialect.cpp - the mtp dialect -----------------------------------===//

#include "dialect/MTPDialect.h"
#include "dialect/MTPOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mtp;

#include "dialect/MTPOpsDialect.cpp.inc"
#include "dialect/MTPEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialect/MTPAttrs.cpp.inc"

LogicalResult MTPDialect::verifyOperationAttribute(Operation *op,
                                                  NamedAttribute attr) {
  StringRef name = attr.getName().getValue();
  auto fail = [&](StringRef what) {
    return op->emitOpError("has '") << name << "' " << what;
  };
  auto bytes = [&](Attribute a) {
    auto i = dyn_cast<IntegerAttr>(a);
    return i && i.getType().isSignlessInteger(64) && i.getInt() >= 0;
  };
  bool integer = name == getPeakBytesAttrHelper().getNameStr() ||
                 name == getSavedBytesAttrHelper().getNameStr() ||
                 name == getEvalPeakBytesAttrHelper().getNameStr() ||
                 name == getEvalBatchAttrHelper().getNameStr();
  bool dict = name == getBreakdownAttrHelper().getNameStr() ||
              name == getTaskOnlyBytesAttrHelper().getNameStr();
  bool text = name == getPeakAtAttrHelper().getNameStr();
  bool ratio = name == getActivationReuseRatioAttrHelper().getNameStr();
  if (!integer && !dict && !text && !ratio)
    return fail("which the mtp dialect does not define (the memory "
                "analysis's are mtp.peak_bytes, mtp.peak_at, mtp.breakdown, "
                "mtp.saved_bytes, mtp.task_only_bytes, "
                "mtp.activation_reuse_ratio, mtp.eval_peak_bytes, "
                "mtp.eval_batch)");
  if (!isa<StepOp>(op))
    return fail("but only an mtp.step carries the memory analysis");
  Attribute value = attr.getValue();
  if (integer && !bytes(value))
    return fail("that is not a non-negative i64 byte count");
  if (dict) {
    auto d = dyn_cast<DictionaryAttr>(value);
    if (!d || !llvm::all_of(d, [&](NamedAttribute e) {
          return bytes(e.getValue());
        }))
      return fail("that is not a dictionary of non-negative i64 byte counts");
  }
  if (text && !isa<StringAttr>(value))
    return fail("that is not a string");
  if (ratio) {
    auto f = dyn_cast<FloatAttr>(value);
    if (!f || !(f.getValueAsDouble() >= 0.0 && f.getValueAsDouble() <= 1.0))
      return fail("that is not a ratio in [0, 1]");
  }
  return success();
}

void MTPDialect::initialize() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialect/MTPAttrs.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "dialect/MTPOps.cpp.inc"
      >();
}
