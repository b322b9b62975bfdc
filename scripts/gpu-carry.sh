#!/usr/bin/env bash
# Copies what the GPU machine lacks into .carry/ (git-ignored) for the device
# tool's `carry`: GoogleTest sources from Debian's googletest package, and
# flatbuffers' headers and flatc (a plain C++ binary) for the plan schema.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rm -rf "$root/.carry/googletest"
mkdir -p "$root/.carry"
cp -r /usr/src/googletest "$root/.carry/googletest"
rm -rf "$root/.carry/flatbuffers"
mkdir -p "$root/.carry/flatbuffers/bin" "$root/.carry/flatbuffers/include"
cp /usr/bin/flatc "$root/.carry/flatbuffers/bin/"
cp -r /usr/include/flatbuffers "$root/.carry/flatbuffers/include/"
du -sh "$root/.carry"
