#!/usr/bin/env bash
# Installs what is missing, builds everything, and runs every test: the lit
# suite (dialect, passes, tools, ...) and the gtest suites, in one lit run
# with one summary. Exit status 0 only when nothing failed.
#
# A second build runs the suite too: a sanitizer build (build-sanitize/:
# AddressSanitizer + UBSan on the compiler tools, the runtime and every binary
# `mtpc build` links against it), so a memory error or undefined behaviour
# fails a test.
#   MTPC_SANITIZE_BUILD=OFF   skip the sanitizer build (a quicker local run;
#                             CI runs both)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh"
build=${MTPC_BUILD_DIR:-$root/build}
suites=("$build/test" "$build/unittests/compiler" "$build/runtime/unittests")
if [ "${MTPC_SANITIZE_BUILD:-ON}" = ON ]; then
  sanitized=${MTPC_SANITIZE_BUILD_DIR:-$build-sanitize}
  # The fuzzer is ASan-built already; the CUDA kernels only compile here.
  MTPC_BUILD_DIR="$sanitized" MTPC_SANITIZE=address,undefined MTPC_FUZZ=OFF \
    MTPC_CUDA=OFF "$root/scripts/build.sh"
  suites+=("$sanitized/test" "$sanitized/unittests/compiler"
           "$sanitized/runtime/unittests")
fi
echo "[test] lit + gtest"
exec python3 /usr/lib/llvm-19/build/utils/lit/lit.py -sv "${suites[@]}"
