#!/usr/bin/env bash
# Copies what the GPU machine lacks into .carry/ (git-ignored) for the device
# tool's `carry`: GoogleTest sources from Debian's googletest package.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rm -rf "$root/.carry/googletest"
mkdir -p "$root/.carry"
cp -r /usr/src/googletest "$root/.carry/googletest"
du -sh "$root/.carry"
