#!/usr/bin/env bash
# Builds the compiler (build/) and the runtime (build/runtime/) after making
# sure the toolchain is there (scripts/setup.sh, fast when it is).
#   MTPC_BUILD_DIR   where to build (default: <repo>/build)
#   MTPC_BUILD_TYPE  CMake build type (default: Release)
#   MTPC_CUDA=OFF    skip the CUDA kernels even where nvcc exists
#   MTPC_SANITIZE    sanitizers for every C++ file, e.g. address,undefined
#                    (scripts/test.sh's second build; empty: none)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
# shellcheck disable=SC1091
source "${MTPC_CACHE:-$HOME/.cache/mtpc}/toolchain.env"

build=${MTPC_BUILD_DIR:-$root/build}
type=${MTPC_BUILD_TYPE:-Release}
# ccache shares objects between clones in different folders (CI's fresh clone).
export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1

# Configure quietly (Torch's config warns about kineto and architectures);
# show the whole log only when configuring fails.
configure() {
  local log=$1; shift
  mkdir -p "$(dirname "$log")"
  cmake "$@" >"$log" 2>&1 || { cat "$log"; echo "[build] configure failed (log: $log)"; exit 1; }
}

echo "[build] compiler -> $build"
configure "$build/configure.log" -G Ninja -S "$root" -B "$build" -Wno-dev \
  -DCMAKE_BUILD_TYPE="$type" \
  -DMTPC_SANITIZE="${MTPC_SANITIZE:-}" \
  -DMLIR_DIR=/usr/lib/llvm-19/lib/cmake/mlir \
  -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-19/build/utils/lit/lit.py
cmake --build "$build"

# The frontend fuzzer needs clang (libFuzzer); MTPC_FUZZ=OFF skips it (and the
# runtime readers' fuzzers below).
if [ "${MTPC_FUZZ:-ON}" = ON ] && command -v clang++-19 >/dev/null; then
  echo "[build] frontend fuzzer -> $build/fuzz (clang-19, -fsanitize=fuzzer,address)"
  configure "$build/fuzz-configure.log" -G Ninja -S "$root/frontend/fuzz" -B "$build/fuzz" -Wno-dev \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DMLIR_DIR=/usr/lib/llvm-19/lib/cmake/mlir \
    -DMTPC_BUILD_DIR="$build"
  cmake --build "$build/fuzz"
fi

echo "[build] runtime -> $build/runtime (LibTorch $MTPC_TORCH_VERSION from $MTPC_TORCH_SOURCE; LibTorch-CUDA parts $MTPC_TORCH_CUDA_MATCH)"
# gloo's headers for the gloo process group: the declarations in
# runtime/src/gloo-abi for the pinned wheel; Debian's libtorch-dev was built
# against Debian's libgloo-dev, whose real headers are in /usr/include.
gloo_include=
[ "$MTPC_TORCH_SOURCE" = debian ] && gloo_include=/usr/include
configure "$build/runtime-configure.log" -G Ninja -S "$root/runtime" -B "$build/runtime" -Wno-dev \
  -DCMAKE_BUILD_TYPE="$type" \
  -DMTPC_SANITIZE="${MTPC_SANITIZE:-}" \
  -DTorch_DIR="$MTPC_TORCH_DIR" \
  -DMTPRT_GLOO_INCLUDE_DIR="$gloo_include" \
  -DMTPRT_TORCH_CUDA="$MTPC_TORCH_CUDA_MATCH" \
  -DMTPRT_ENABLE_CUDA="${MTPC_CUDA:-ON}"
cmake --build "$build/runtime"

# The runtime readers' fuzzers (JSON Lines, shards, checkpoint headers, plans):
# torch-free, so they need only clang-19 and flatc; MTPC_FUZZ=OFF skips them.
if [ "${MTPC_FUZZ:-ON}" = ON ] && command -v clang++-19 >/dev/null; then
  echo "[build] runtime reader fuzzers -> $build/fuzz-runtime (clang-19, -fsanitize=fuzzer,address,undefined)"
  configure "$build/fuzz-runtime-configure.log" -G Ninja -S "$root/runtime/fuzz" -B "$build/fuzz-runtime" -Wno-dev \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER=clang++-19 \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
  cmake --build "$build/fuzz-runtime"
fi
