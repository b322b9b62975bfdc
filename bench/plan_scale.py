#!/usr/bin/env python3
"""How long `mtpc plan` takes on a large spec: 1000 layers, 16 tasks.

Generates the spec (its activations far exceed the budget, so the joint
planner has to decide about every block), runs `mtpc plan` (parse, Sema,
MLIRGen, normalize, expand the step, plan memory, memory analysis, the
report) several times and prints the median and the spread of the wall time.
Usage:

    bench/plan_scale.py [--layers 1000] [--tasks 16] [--runs 5] [--mtpc build/bin/mtpc]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def spec(layers: int, tasks: int) -> str:
    lines = [f"model scale {{",
             f"  backbone transformer {{ layers = {layers}  hidden = 256  heads = 4"
             f"  ffn = 1024  vocab = 32000  seq = 512 }}"]
    kinds = ["tag(labels = 9)", "classify(classes = 3)", "span()", "tag(labels = 17)"]
    for t in range(tasks):
        tap = max(1, (t + 1) * layers // tasks)
        kind = kinds[t % len(kinds)]
        pooled = "pooled layer" if kind.startswith("classify") else "layer"
        lines.append(f"  task t{t} : {kind} from {pooled} {tap}")
    for t in range(0, tasks - 1, 2):
        lines.append(f"  correlate t{t} ~ t{t + 1} = 0.7")
    # Activations far over the budget: the planner has to work.
    lines.append("  budget { device = A100_40GB  gpus = 8  global_batch = 64  micro_batch = 8"
                 "  precision = bf16 }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mtpc", default=os.path.join(root, "build", "bin", "mtpc"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "scale.mtp")
        with open(path, "w") as f:
            f.write(spec(args.layers, args.tasks))
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            out = subprocess.run([args.mtpc, "plan", path], capture_output=True, text=True)
            times.append(time.perf_counter() - start)
            if out.returncode != 0:
                sys.stderr.write(out.stderr)
                return 1
        verdict = [l for l in out.stdout.splitlines()
                   if "verdict" in l or "keep everything" in l or "this plan" in l
                   or "uniform (every" in l]
    median = statistics.median(times)
    print(f"mtpc plan, {args.layers} layers, {args.tasks} tasks, {args.runs} runs")
    print(f"  median {median:.3f} s   min {min(times):.3f} s   max {max(times):.3f} s")
    for line in verdict:
        print("  " + line.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
