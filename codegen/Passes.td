//===- Passes.td - codegen passes --------------------------*- tablegen -*-===//
//
// The passes that leave the mtp dialect: lowering the planned step to EmitC
// (the C++ emitter prints it). mtp-opt registers them beside passes/'s.
//
//===----------------------------------------------------------------------===//

#ifndef MTP_CODEGEN_PASSES
#define MTP_CODEGEN_PASSES

include "mlir/Pass/PassBase.td"

def LowerStepToEmitC : Pass<"mtp-lower-step-to-emitc", "::mlir::ModuleOp"> {
  let summary = "Lower each model's planned step to EmitC calls of the runtime";
  let description = [{
    Replaces every `mtp.model` with an `emitc.func @mtp_step_<model>` that
    calls the runtime's step operations (runtime/include/mtprt/Step.h) in the
    step's order: backbone units one call each (a checkpoint region as one
    call, an offloaded unit as KeepOffload), each head + loss after its tap,
    the head backwards with their prefetches, the fused per-task gradient op,
    the backbone backward (its planned recomputes and prefetches listed in a
    comment), the gradient collective and the optimizer step, all inside the
    micro-batch loop where they belong. Run it on a planned, materialized
    step; `mtp-translate --mtp-to-cpp` (or `mtpc --emit=cpp`) prints the C++.
  }];
  let dependentDialects = ["::mlir::emitc::EmitCDialect"];
}

#endif // MTP_CODEGEN_PASSES
