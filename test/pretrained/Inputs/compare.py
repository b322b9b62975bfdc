#!/usr/bin/env python3
"""Compares mtprt's --dump-hidden output with transformers' model from DIR:
the hidden state after every layer (eval mode, fp32) and the parameters'
gradients of sum_l (hidden_l * probe_l).sum(). Prints the worst errors;
exits 1 past the tolerances.

    compare.py DUMP DIR [--hidden-tol 1e-5] [--grad-tol 1e-4]
"""
import argparse
import sys

import safetensors.torch
import torch
import transformers


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dump")
    ap.add_argument("dir")
    ap.add_argument("--hidden-tol", type=float, default=1e-5)
    ap.add_argument("--grad-tol", type=float, default=1e-4)
    a = ap.parse_args()

    transformers.utils.logging.disable_progress_bar()
    d = safetensors.torch.load_file(a.dump)
    model = transformers.AutoModel.from_pretrained(a.dir, dtype=torch.float32)
    model.eval()
    extra = {k: d[k] for k in ("attention_mask", "token_type_ids") if k in d}
    out = model(input_ids=d["tokens"], output_hidden_states=True, **extra)
    hidden = out.hidden_states
    layers = sum(1 for k in d if k.startswith("hidden."))
    if layers != len(hidden):
        print(f"FAIL: {layers} hidden states dumped, transformers has {len(hidden)}")
        return 1
    ok = True
    worst_h = 0.0
    objective = 0.0
    for l in range(layers):
        e = rel_err(d[f"hidden.{l}"], hidden[l].detach())
        worst_h = max(worst_h, e)
        if e > a.hidden_tol:
            print(f"FAIL: hidden.{l}: relative error {e:.2e} > {a.hidden_tol:g}")
            ok = False
        objective = objective + (hidden[l] * d[f"probe.{l}"]).sum()
    objective.backward()
    worst_g, checked = 0.0, 0
    params = dict(model.named_parameters())
    # A gradient that is zero analytically (a key bias: softmax ignores a
    # per-query shift) is rounding noise on both sides: errors are relative
    # to the larger of its own scale and a thousandth of the largest.
    scale = max(p.grad.abs().max().item() for p in params.values()
                if p.grad is not None)
    for k, g in d.items():
        if not k.startswith("grad."):
            continue
        name = k[len("grad."):]
        if name not in params:
            print(f"FAIL: {k}: transformers has no parameter {name}")
            ok = False
            continue
        ref = params[name].grad
        e = ((g - ref).abs().max() /
             max(ref.abs().max().item(), 1e-3 * scale)).item()
        worst_g = max(worst_g, e)
        checked += 1
        if e > a.grad_tol:
            print(f"FAIL: {k}: relative error {e:.2e} > {a.grad_tol:g}")
            ok = False
    # The pooler is not on the way to any hidden state.
    missing = [n for n in params if f"grad.{n}" not in d
               and not n.startswith("pooler.")]
    if missing:
        print(f"FAIL: no gradient dumped for {missing[:5]}")
        ok = False
    print(f"hidden states: {layers} layers, worst relative error {worst_h:.1e}; "
          f"gradients: {checked} parameters, worst {worst_g:.1e}: "
          + ("agree" if ok else "DISAGREE"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
