#!/usr/bin/env bash
# The main job on the bundled example, as far as the pipeline goes today:
# build, check the spec (errors or a summary), print its memory plan and
# its spec-level IR, then train with the runtime's demo step program.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh"
build=${MTPC_BUILD_DIR:-$root/build}
spec=${1:-$root/examples/00_tiny.mtp}
"$build/bin/mtpc" check "$spec"
"$build/bin/mtpc" plan "$spec"
"$build/bin/mtpc" "$spec" --emit=mlir
# The runtime side: a hand-written step program on the training driver (what
# `mtpc build` will generate from the spec) trains on synthetic data, on 2
# processes exchanging GSC-compressed gradients over gloo.
echo "[example] runtime: mtprt-demo, 600 steps on synthetic data"
"$build/runtime/tools/mtprt-demo" --steps 600 --batch-size 32 --threads 1 \
  --progress plain --metrics "$build/example-metrics.jsonl"
echo "[example] the same program on 2 processes with GSC-compressed gradients"
"$build/runtime/tools/mtprt-demo" --nproc 2 --steps 100 --batch-size 32 \
  --threads 1 --compress --progress plain
echo "[example] metrics (SPEC.md §5 names): $build/example-metrics.jsonl"
