//===- MTPInterfaces.td - mtp op interfaces ----------------*- tablegen -*-===//

#ifndef MTP_INTERFACES
#define MTP_INTERFACES

include "mlir/IR/OpBase.td"

def MTP_CostOpInterface : OpInterface<"CostOpInterface"> {
  let cppNamespace = "::mtp";
  let description = [{
    A step op that computes: its FLOPs (what the cost model turns into
    seconds) and the workspace it holds while it runs, on top of the live
    tensors (the memory analysis and the planner's timeline). The units, the
    gradient pipeline and the optimizer step.
  }];
  let methods = [
    InterfaceMethod<"The op's floating-point operations.", "int64_t",
      "getFlopCount", (ins), [{}], [{ return $_op.getFlops(); }]>,
    InterfaceMethod<"Bytes of temporaries while the op runs.", "int64_t",
      "getWorkspaceBytes", (ins), [{}], [{ return $_op.getWorkspace(); }]>,
  ];
}

#endif // MTP_INTERFACES
