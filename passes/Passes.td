//===- Passes.td - mtp passes ------------------------------*- tablegen -*-===//
//
// Every mtp pass is declared here; mtp-opt and mtpc register them all, so each
// appears in `mtp-opt --help` with its options.
//
//===----------------------------------------------------------------------===//

#ifndef MTP_PASSES
#define MTP_PASSES

include "mlir/Pass/PassBase.td"

def NormalizeSpec : Pass<"mtp-normalize-spec", "::mtp::ModelOp"> {
  let summary = "Put a spec-level model into canonical order";
  let description = [{
    Orders the body of an `mtp.model` the way the later passes read it: the
    backbone first, then the tasks by the layer they read (the order their
    heads run in the forward pass; ties keep their source order), then the
    correlations with each pair named in task order, then the budget. Two
    specs that differ only in how they were written normalize to the same IR.
  }];
}

#endif // MTP_PASSES
