#!/usr/bin/env bash
# Installs what is missing, builds everything, and runs every test: the lit
# suite (dialect, passes, tools, ...) and the gtest suites, in one lit run
# with one summary. Exit status 0 only when nothing failed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh"
build=${MTPC_BUILD_DIR:-$root/build}
echo "[test] lit + gtest"
exec python3 /usr/lib/llvm-19/build/utils/lit/lit.py -sv \
  "$build/test" "$build/unittests/compiler" "$build/runtime/unittests"
