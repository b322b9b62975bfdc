#!/usr/bin/env bash
# The device check, run on the lent GPU machine (H200, CUDA 13.0, Python 3.12
# with torch 2.11.0+cu130, CMake, Ninja; no MLIR, GoogleTest or internet).
# It builds the runtime against that torch and runs its gtest suite, where the
# CUDA tests (kernels vs. their CPU twins, caching-allocator statistics) run
# instead of skipping.
#
# Here, first:   scripts/gpu-carry.sh        (copies GoogleTest into .carry/)
# Then:          device run with carry [".carry"] and
#                command "scripts/gpu-check.sh"
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-$root/build/gpu-check}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
torch_dir=$(python3 -c 'import torch,os; print(os.path.join(torch.utils.cmake_prefix_path,"Torch"))')
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$out/gpu.txt"
cmake -G Ninja -S "$root/runtime" -B /tmp/mtprt-gpu -DCMAKE_BUILD_TYPE=Release \
  -DTorch_DIR="$torch_dir" -DMTPRT_TORCH_CUDA=ON \
  -DMTPRT_GTEST_SOURCE_DIR="$root/.carry/googletest" 2>&1 | tail -3
cmake --build /tmp/mtprt-gpu -j 16 2>&1 | tail -3
set -o pipefail
/tmp/mtprt-gpu/unittests/MTPRTTests --gtest_output=json:"$out/gtest.json" 2>&1 | tee "$out/gtest.log"
