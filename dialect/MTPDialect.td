//===- MTPDialect.td - the mtp dialect ---------------------*- tablegen -*-===//
//
// The `mtp` dialect describes a multi-task training job, first at the spec
// level (model, backbone, tasks, correlations, budget) and, after the
// expansion passes, as an explicit training step.
//
//===----------------------------------------------------------------------===//

#ifndef MTP_DIALECT
#define MTP_DIALECT

include "mlir/IR/OpBase.td"

def MTP_Dialect : Dialect {
  let name = "mtp";
  let cppNamespace = "::mtp";
  let summary = "Multi-task training pipelines: spec, training step, plan";
  let description = [{
    The spec level mirrors a `.mtp` file: one `mtp.model` holds the shared
    backbone, the task heads with the layer each reads, the correlations
    between tasks and the memory budget. Later passes lower it into a
    training step whose every value has a size and every op a cost.
  }];
  let useDefaultAttributePrinterParser = 1;
  // What --mtp-memory-analysis prints onto a step (the plan itself is the
  // step's inherent `plan`, each unit's decision its `mtp.fwd`'s). The
  // dialect verifies these on a step and refuses any other `mtp.` name.
  let discardableAttrs = (ins
    "::mlir::IntegerAttr":$peak_bytes,
    "::mlir::StringAttr":$peak_at,
    "::mlir::DictionaryAttr":$breakdown,
    "::mlir::IntegerAttr":$saved_bytes,
    "::mlir::DictionaryAttr":$task_only_bytes,
    "::mlir::FloatAttr":$activation_reuse_ratio,
    "::mlir::IntegerAttr":$eval_peak_bytes,
    "::mlir::IntegerAttr":$eval_batch
  );
  let hasOperationAttrVerify = 1;
}

class MTP_Op<string mnemonic, list<Trait> traits = []> :
    Op<MTP_Dialect, mnemonic, traits>;

#endif // MTP_DIALECT
