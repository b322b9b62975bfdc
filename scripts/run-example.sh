#!/usr/bin/env bash
# The main job on the bundled example, as far as the pipeline goes today:
# build, check the spec, print its normalized IR.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh"
build=${MTPC_BUILD_DIR:-$root/build}
spec=${1:-$root/examples/glue_mt.mlir}
"$build/bin/mtpc" check "$spec"
"$build/bin/mtpc" "$spec" --emit=mlir
