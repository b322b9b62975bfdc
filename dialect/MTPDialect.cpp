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
