#!/usr/bin/env bash
# The main job on the bundled example, as far as the pipeline goes today:
# build, check the spec (errors or a summary), print its memory plan and
# its spec-level IR.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh"
build=${MTPC_BUILD_DIR:-$root/build}
spec=${1:-$root/examples/00_tiny.mtp}
"$build/bin/mtpc" check "$spec"
"$build/bin/mtpc" plan "$spec"
"$build/bin/mtpc" "$spec" --emit=mlir
