#!/usr/bin/env bash
# The main job on the bundled example: set up and build the compiler and the
# runtime, check the spec, print its memory plan, compile it to a training
# binary with `mtpc build`, train it (progress on the terminal, metrics as
# JSON Lines), and end with the run's one-paragraph summary: each task's loss
# from start to end, the measured peak against the predicted, throughput.
#   scripts/run-example.sh [SPEC] [binary flags...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh"
build=${MTPC_BUILD_DIR:-$root/build}
spec=${1:-$root/examples/00_tiny.mtp}
shift || true
name=$(basename "$spec" .mtp)
out="$build/examples"
mkdir -p "$out"

echo "[example] mtpc check $spec"
"$build/bin/mtpc" check "$spec"
echo "[example] mtpc plan $spec"
"$build/bin/mtpc" plan "$spec"
echo "[example] mtpc build $spec -o $out/$name  (the generated C++ is in $out/$name.project)"
"$build/bin/mtpc" build "$spec" -o "$out/$name"
rm -f "$out/$name.jsonl"
echo "[example] $out/$name: training (defaults from the spec; --help lists the flags)"
"$out/$name" --progress plain --metrics "$out/$name.jsonl" "$@"
echo "[example] metrics (docs/contracts.md#metric-names): $out/$name.jsonl"
