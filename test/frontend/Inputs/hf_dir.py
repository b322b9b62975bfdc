#!/usr/bin/env python3
"""Writes a Hugging Face GPT-2 directory without torch (config.json and a
safetensors file of zeros, by the reference format) and optionally breaks
it, for mtpc's located errors on `backbone pretrained(...)`.

    hf_dir.py OUT [--break none|missing|shape|header|truncated|index|bin|type]
"""
import argparse
import json
import os
import struct

L, H, HEADS, F, V, P = 2, 32, 4, 48, 96, 40


def tensors():
    t = {"wte.weight": [V, H], "wpe.weight": [P, H]}
    for l in range(L):
        n = f"h.{l}."
        t.update({n + "ln_1.weight": [H], n + "ln_1.bias": [H],
                  n + "attn.c_attn.weight": [H, 3 * H],
                  n + "attn.c_attn.bias": [3 * H],
                  n + "attn.c_proj.weight": [H, H], n + "attn.c_proj.bias": [H],
                  n + "ln_2.weight": [H], n + "ln_2.bias": [H],
                  n + "mlp.c_fc.weight": [H, F], n + "mlp.c_fc.bias": [F],
                  n + "mlp.c_proj.weight": [F, H], n + "mlp.c_proj.bias": [H]})
    t.update({"ln_f.weight": [H], "ln_f.bias": [H]})
    return t


def write(path, shapes):
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = 4
        for d in shape:
            n *= d
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    data = struct.pack("<Q", len(text)) + text + bytes(offset)
    open(path, "wb").write(data)
    return data


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--break", dest="brk", default="none")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    config = {"model_type": "gpt2", "n_layer": L, "n_embd": H, "n_head": HEADS,
              "n_inner": F, "vocab_size": V, "n_positions": P,
              "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
              "resid_pdrop": 0.1}
    if a.brk == "type":
        config["model_type"] = "t5"
    json.dump(config, open(os.path.join(a.out, "config.json"), "w"))
    shapes = tensors()
    if a.brk == "missing":
        del shapes["h.1.mlp.c_fc.weight"]
    if a.brk == "shape":
        shapes["wpe.weight"] = [P + 1, H]
    path = os.path.join(a.out, "model.safetensors")
    if a.brk == "index":
        half = dict(list(shapes.items())[:10])
        write(os.path.join(a.out, "model-00001-of-00002.safetensors"), half)
        json.dump({"weight_map": {**{k: "model-00001-of-00002.safetensors"
                                     for k in half},
                                  "ln_f.weight": "../elsewhere.safetensors"}},
                  open(os.path.join(a.out, "model.safetensors.index.json"), "w"))
        return
    if a.brk == "bin":
        open(os.path.join(a.out, "pytorch_model.bin"), "wb").write(b"PK")
        return
    data = write(path, shapes)
    if a.brk == "header":
        open(path, "wb").write(data[:8] + b"{not json" + data[17:])
    if a.brk == "truncated":
        open(path, "wb").write(data[:100])


if __name__ == "__main__":
    main()
