#!/usr/bin/env python3
"""Checks that training kept frozen layers as they were and moved the rest.

    frozen_check.py BENCH_DIR SOURCE_DIR TRAINED_DIR FIRST LAST LAYERS

Compares SOURCE_DIR/model.safetensors with TRAINED_DIR/model.safetensors
(an --export) tensor by tensor: those of layers FIRST..LAST (0: the
embeddings, LAYERS: the last with the final norm; bench/peer.py's layer_of
reads the Hugging Face names) must be bit-equal, every other layer must have
moved.
"""
import sys

bench, src, out, first, last, layers = sys.argv[1:7]
sys.path.insert(0, bench)
from peer import layer_of  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
import torch  # noqa: E402

first, last, layers = int(first), int(last), int(layers)
a = load_file(src + "/model.safetensors")
b = load_file(out + "/model.safetensors")
moved = {}
bad = 0
for name, t in sorted(a.items()):
    if name not in b:
        continue
    layer = layer_of(name, layers)
    same = torch.equal(t.float(), b[name].float())
    if first <= layer <= last and not same:
        print("frozen %s (layer %d) changed" % (name, layer))
        bad += 1
    moved[layer] = moved.get(layer, False) or not same
for layer in sorted(moved):
    frozen = first <= layer <= last
    print("layer %d: %s" % (layer, "frozen, unchanged" if frozen else
                            ("trained, moved" if moved[layer] else "trained, NOT MOVED")))
    bad += not frozen and not moved[layer]
sys.exit(1 if bad else 0)
