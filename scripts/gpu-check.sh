#!/usr/bin/env bash
# The device check, run on the lent GPU machine (H200, CUDA 13.0, Python 3.12
# with torch 2.11.0+cu130, CMake, Ninja; no MLIR, GoogleTest or internet).
# It builds the runtime against that torch and runs its gtest suite, where the
# CUDA tests (kernels vs. their CPU twins, caching-allocator statistics,
# pinned-memory offload on low-priority streams, fp16 loss scaling) run instead
# of skipping; it fails if any of them skipped.
#
# Here, first:   scripts/gpu-carry.sh        (GoogleTest, flatbuffers into .carry/)
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
  -DMTPRT_GTEST_SOURCE_DIR="$root/.carry/googletest" \
  -DMTPRT_FLATBUFFERS_ROOT="$root/.carry/flatbuffers" \
  -DMTPRT_JSON_ROOT="$root/.carry/nlohmann" 2>&1 | tail -3
cmake --build /tmp/mtprt-gpu -j 16 2>&1 | tail -3
set -o pipefail
/tmp/mtprt-gpu/unittests/MTPRTTests --gtest_output=json:"$out/gtest.json" 2>&1 | tee "$out/gtest.log"
# Here the CUDA tests (pinned-memory offload on side streams, the caching
# allocator's peak, fp16 loss scaling, the kernels against their CPU twins)
# must run: a skip means the build lost its LibTorch-CUDA parts.
skipped=$(grep -E '^\[  SKIPPED \] (Cuda|CudaMemoryStats|BlockQuant|Kernels|Pointwise)\.' "$out/gtest.log" || true)
if [ -n "$skipped" ]; then
  echo "[gpu-check] CUDA tests were skipped on the GPU machine:"
  echo "$skipped"
  exit 1
fi
echo "[gpu-check] all gtests ran, CUDA ones included"

# The training driver on the GPU: the demo step program on CUDA, checkpointed
# and resumed (the NCCL exchange itself runs in the gtest above at world size
# 1: one GPU cannot host two NCCL ranks).
demo=/tmp/mtprt-gpu/tools/mtprt-demo
rm -rf /tmp/mtprt-gpu-ckpt
$demo --device cuda --steps 10 --checkpoint-dir /tmp/mtprt-gpu-ckpt --checkpoint-every 5 \
  --metrics "$out/demo-metrics.jsonl" --progress plain 2>&1 | tee "$out/demo.log"
$demo --device cuda --steps 15 --checkpoint-dir /tmp/mtprt-gpu-ckpt --resume \
  --progress plain 2>&1 | tee -a "$out/demo.log"
grep -q "resumed from /tmp/mtprt-gpu-ckpt/step-000000010.rank0.ckpt" "$out/demo.log"
echo "[gpu-check] driver on CUDA: trained, checkpointed and resumed"

# mtpc's generated program (scripts/gpu-carry.sh emitted the project here):
# built on this machine against the runtime above, its specialized CUDA
# kernels compiled by nvcc, trained on the GPU; the summary gives the
# measured peak against the prediction.
if [ -d "$root/.carry/tiny_gpu" ]; then
  cmake -G Ninja -S "$root/.carry/tiny_gpu" -B /tmp/tiny-gpu-build -DMTP_CUDA=ON \
    -Dmtprt_DIR=/tmp/mtprt-gpu -DTorch_DIR="$torch_dir" 2>&1 | tail -2
  cmake --build /tmp/tiny-gpu-build 2>&1 | tail -2
  /tmp/tiny-gpu-build/tiny --steps 100 --log-every 1 --metrics "$out/tiny-gpu.jsonl" \
    --progress plain 2>&1 | tee "$out/tiny-gpu.log"
  grep -q "specialized kernels" "$out/tiny-gpu.log"
  python3 "$root/test/tools/Inputs/peak_gap.py" 1.0 "$out/tiny-gpu.jsonl" | tail -3 | tee -a "$out/tiny-gpu.log"
  echo "[gpu-check] mtpc build's CUDA program: built here, trained on the GPU"
fi
