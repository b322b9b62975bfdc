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
    A backbone without an `attention` kind gets one: `fused` wherever one
    scaled-dot-product-attention kernel serves its dropout on the budget's
    device (any GPU; the CPU at dropout 0), else `math`.
  }];
}

def ExpandTrainingStep : Pass<"mtp-expand-training-step", "::mtp::ModelOp"> {
  let summary = "Lower a spec-level model into one explicit training step";
  let description = [{
    Builds an `mtp.step` in the model: the batch inputs, the parameter
    groups, the forward units in execution order with each task's head and
    loss at its tap, every task's loss and head backward (the gradient at its
    tap, as the per-task gradient pipeline needs it), the backbone backward
    from the top with the tap gradients summed in where the heads read, and
    the optimizer step. Each unit's output, saved tensors, FLOPs and
    workspace come from the cost model; a backward unit takes exactly the
    tensors its forward saved, so the DAG of heads on different layers — and
    what it keeps alive — is visible in the SSA uses.
  }];
}

def MemoryAnalysis : Pass<"mtp-memory-analysis", "::mtp::ModelOp"> {
  let summary = "Peak memory of the training step, by liveness";
  let description = [{
    Walks the expanded step in order: parameters, gradients (from their
    group's first backward unit) and optimizer state are resident; every
    activation lives from the unit that makes it to its last use; each unit
    adds its workspace while it runs. Attaches to the step the peak, the op
    where it occurs, a breakdown by kind, the bytes each task alone keeps
    alive, and `activation_reuse_ratio` (docs/cost-model.md); with
    `print` it also writes a report to stdout.
  }];
  let options = [
    Option<"print", "print", "bool", /*default=*/"false",
           "Print the analysis as a table">
  ];
}

def PlanMemory : Pass<"mtp-plan-memory", "::mtp::ModelOp"> {
  let summary = "Decide jointly what to keep, recompute and offload";
  let description = [{
    The one deciding pass: for every candidate — a backbone block (or, with
    checkpoint = task_granular, a task group's interval of blocks) and every
    head — keep its saved tensors, recompute them in a checkpoint region, or
    offload them to the host and prefetch them, so the simulated peak fits
    budget − headroom at the least added time (recompute FLOPs plus exposed
    transfer time; an offload whose exposed prefetch latency exceeds the
    strategy's max_latency is not allowed). Regions end at every task tap.
    Writes `mtp.decision` (and `mtp.region`) on each forward unit and the
    planned peak and added time on the step. A budget no plan meets is an
    error naming the smallest reachable peak and what would fit.

    The heuristic's plan is the start of a depth-first branch and bound that
    is exact for the cost model: `max-nodes` bounds it (a count, so plans are
    the same on every machine; 0 runs the heuristic alone), and the plan
    says whether the search finished (proved optimal) or stopped.
  }];
  let options = [
    Option<"maxNodes", "max-nodes", "int64_t", /*default=*/"40000",
           "branch-and-bound nodes before the search keeps its best plan">,
    Option<"costs", "costs", "std::string", /*default=*/"",
           "segment costs measured on the target (mtpc profile's JSON); "
           "default: the cost model's roofline">,
    Option<"exactFloor", "exact-floor", "bool", /*default=*/"true",
           "where no plan fits, search for the smallest reachable peak the "
           "error names (false: where even the bound on every plan is over "
           "the budget, stop at once with the most frugal plan's peak; "
           "where everything kept fits, keep it without looking for the "
           "floor — mtpc search)">
  ];
}

def FuseTaskGradients : Pass<"mtp-fuse-task-gradients", "::mtp::ModelOp"> {
  let summary = "Insert the per-task gradient pipeline at the taps";
  let description = [{
    After every task's head backward, one `mtp.fuse_task_grads` takes the
    tasks' gradients at their taps and returns what the backbone backward
    receives: GFM, per-task clipping and the DGFG weights from the
    strategy (docs/contracts.md). With `gradient_scope = params` the op also
    carries the cost of per-task parameter gradients over the top k shared
    layers (k layers × tasks of gradient memory, k layers of backward per
    task), which the plan shows next to the `features` scope.
  }];
  let options = [
    Option<"remarks", "remarks", "bool", /*default=*/"false",
           "Emit a remark on the model saying what the pass did (MLIR's "
           "pass statistics are compiled out of release LLVM builds)">
  ];
}

def CompressCollectives : Pass<"mtp-compress-collectives", "::mtp::ModelOp"> {
  let summary = "Compress the gradient buckets' all-reduce (GSC)";
  let description = [{
    Marks every `mtp.allreduce` bucket compressed with the strategy's top-k
    fraction, block size, bits and residual decay when `collective =
    compressed`, or `auto` with more than one device. The plan reports the
    bytes each process sends per step, compressed and not.
  }];
  let options = [
    Option<"remarks", "remarks", "bool", /*default=*/"false",
           "Emit a remark on the model saying what the pass did (MLIR's "
           "pass statistics are compiled out of release LLVM builds)">
  ];
}

def MaterializeCheckpoints : Pass<"mtp-materialize-checkpoints", "::mtp::ModelOp"> {
  let summary = "Write the planned checkpoint regions into the step";
  let description = [{
    For every region --mtp-plan-memory chose (`mtp.region` on its forward
    units): the forward units move into an `mtp.checkpoint` that keeps only
    its boundary and hands out only what the rest of the step reads, and an
    `mtp.recompute` right before the region's backward re-creates the tensors
    its backward units take. The memory analysis of the result is the
    planned peak.
  }];
  let options = [
    Option<"remarks", "remarks", "bool", /*default=*/"false",
           "Emit a remark on the model saying what the pass did (MLIR's "
           "pass statistics are compiled out of release LLVM builds)">
  ];
}

def MaterializeOffload : Pass<"mtp-materialize-offload", "::mtp::ModelOp"> {
  let summary = "Write the planned offloads into the step";
  let description = [{
    For every unit --mtp-plan-memory offloads: each tensor only its own
    backward reads gets an `mtp.offload` after its last forward use, an
    `mtp.prefetch` where the backward of the unit group before it starts
    (one group ahead, as the planner simulated), and an `mtp.wait` right
    before its first backward use, which then reads the prefetched copy.
    Copies run on stream 1, the low-priority copy stream.
  }];
  let options = [
    Option<"remarks", "remarks", "bool", /*default=*/"false",
           "Emit a remark on the model saying what the pass did (MLIR's "
           "pass statistics are compiled out of release LLVM builds)">
  ];
}

#endif // MTP_PASSES
