#!/usr/bin/env bash
# Copies what the GPU machine lacks into .carry/ (git-ignored) for the device
# tool's `carry`: GoogleTest sources from Debian's googletest package, and
# flatbuffers' headers and flatc (a plain C++ binary) for the plan schema,
# nlohmann/json's headers for the runtime's JSON.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rm -rf "$root/.carry/googletest"
mkdir -p "$root/.carry"
cp -r /usr/src/googletest "$root/.carry/googletest"
rm -rf "$root/.carry/flatbuffers"
mkdir -p "$root/.carry/flatbuffers/bin" "$root/.carry/flatbuffers/include"
cp /usr/bin/flatc "$root/.carry/flatbuffers/bin/"
cp -r /usr/include/flatbuffers "$root/.carry/flatbuffers/include/"
rm -rf "$root/.carry/nlohmann"
mkdir -p "$root/.carry/nlohmann/include"
cp -r /usr/include/nlohmann "$root/.carry/nlohmann/include/"
# A generated training program, to build on the GPU machine the way a user
# builds `mtpc build --emit-project` output on a GPU node (that machine has
# no MLIR, so mtpc runs here): 00_tiny written for an H100, CUDA kernels on.
build=${MTPC_BUILD_DIR:-$root/build}
rm -rf "$root/.carry/tiny_gpu"
sed -e 's/device      = cpu/device      = H100_80GB/; s/memory      = 2GiB/memory      = 80GiB/' \
  "$root/examples/00_tiny.mtp" > "$root/.carry/tiny_gpu.mtp"
"$build/bin/mtpc" build "$root/.carry/tiny_gpu.mtp" --device cuda --emit-project "$root/.carry/tiny_gpu"
"$build/bin/mtpc" plan "$root/.carry/tiny_gpu.mtp" --format=json -o "$root/.carry/tiny_gpu.plan.json"
du -sh "$root/.carry"
