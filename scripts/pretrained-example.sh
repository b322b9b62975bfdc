#!/usr/bin/env bash
# The pretrained-backbone example end to end: set up (transformers in the
# project's venv), make a random 4-layer BERT directory where
# examples/pretrained/bert.mtp points (examples/pretrained/bert-mini, once),
# then check, plan, build and train the spec on the bundled data and export
# the trained backbone (build/examples/bert.export). Extra
# arguments go to the training binary.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
py=${MTPC_CACHE:-$HOME/.cache/mtpc}/venv/bin/python
dir="$root/examples/pretrained/bert-mini"
if [ ! -f "$dir/config.json" ]; then
  echo "[example] making a random BERT in $dir"
  "$py" "$root/scripts/make-hf-model.py" "$dir" --family bert --layers 4 \
    --hidden 128 --heads 4 --ffn 512 --vocab 32 --positions 64 --seed 1
fi
build=${MTPC_BUILD_DIR:-$root/build}
exec "$root/scripts/run-example.sh" "$root/examples/pretrained/bert.mtp" \
  --export "$build/examples/bert.export" "$@"
