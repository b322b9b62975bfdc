#!/usr/bin/env python3
"""The PyTorch peer: mtpc's multi-task model written the way a user would in eager PyTorch.

The model is runtime/src/Model.cpp op for op (the same parameter names, pre-norm
blocks, q scaled before the score matmul, native dropout, GELU, classify pools
token 0 then norm -> pool linear -> tanh -> out, tag = norm -> out, cross
entropy), trained with AdamW in one group for the backbone and one per head,
each on its own schedule (runtime/src/Trainer.cpp scheduledLr). It starts from
the state an mtpc binary dumps with `--dump-init DIR` (parameters, first batch,
settings) and generates the later batches exactly as the runtime's synthetic
source does (runtime/src/Data.cpp), so the losses are comparable step by step.

Four ways to save memory, the ones a PyTorch user reaches for:
  none       keep everything
  uniform    torch.utils.checkpoint around every transformer layer
  selective  the same with a selective-checkpointing policy that saves the
             matmul outputs (aten.mm / addmm / bmm) and recomputes the rest
  offload    torch.autograd.graph.save_on_cpu around the forward

And the model as a PyTorch user writes it in 2026, attention by
F.scaled_dot_product_attention (q, k, v as views of the fused projection):
  sdpa              eager
  compile           torch.compile of the forward (AOTAutograd compiles the
                    backward with it; the optimizer stays eager)
  compile_budget50  the same with torch._functorch.config.activation_memory_budget
  compile_budget30  = 0.5 / 0.3 (the partitioner recomputes what it must to
                    keep that share of the saved activations)
And for a pretrained backbone (gpt2, llama, bert: the spec's `pretrained`
directory):
  hf                transformers.AutoModel.from_pretrained(DIR) (eager, SDPA
                    attention) with the same heads: Hugging Face fine-tuning.

The compiled variants run one forward and backward before the measured steps
(compilation; the gradients are dropped, so the parameters and losses are the
same), which the resource figures exclude.

The update equals mtpc's `features` gradient scope with uniform weights
(dgfg = none, gfm = none, clip = none): heads get their own loss's gradient, the
backbone the mean over the tasks present of the tap gradients.

Usage (prints one JSON object):

    peer.py --init DIR [--variant none] [--steps N] [--threads T] [--device cpu|cuda]
            [--resources] [--profile TRACE.json]
"""
import argparse
import re
import functools
import gc
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

VARIANTS = ("none", "uniform", "selective", "offload",
            "sdpa", "compile", "compile_budget50", "compile_budget30", "hf")
COMPILED = {"compile": None, "compile_budget50": 0.5, "compile_budget30": 0.3}


def layer_of(name, layers):
    """The layer a backbone parameter belongs to (0: the embeddings, layers:
    the last with the final norm), by mtprt's or Hugging Face's name; None
    for a head's."""
    if name.startswith("head."):
        return None
    m = re.match(r"layer(\d+)\.", name)  # mtprt's, 1-based
    if m:
        return int(m.group(1))
    m = re.search(r"(?:^|\.)(?:h|layers|layer)\.(\d+)\.", name)  # HF's, 0-based
    if m:
        return int(m.group(1)) + 1
    if name.startswith("final.") or "ln_f." in name or re.match(r"(model\.)?norm\.", name):
        return layers
    return 0


def load_init(path):
    """config.json, params.pt and batch.pt from an mtpc binary's --dump-init."""
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    import torch.jit._pickle as jit_pickle  # c10::Dict carries a type tag
    with torch.serialization.safe_globals([jit_pickle.restore_type_tag]):
        params = torch.load(os.path.join(path, "params.pt"))
        batch = torch.load(os.path.join(path, "batch.pt"))
    return config, params, batch


#===----------------------------------------------------------------------===#
# Data: runtime/src/Data.cpp's Synthetic, draw for draw
#===----------------------------------------------------------------------===#

class Synthetic:
    def __init__(self, config):
        self.m = config["model"]
        self.heads = config["heads"]
        self.seed = int(config["data_seed"])
        self.related = float(config["relatedness"])

    def batch(self, pos, b):
        seed = (self.seed * 0x9E3779B97F4A7C15 + pos) % (1 << 64)
        gen = torch.Generator().manual_seed(seed)
        s, vocab = self.m["seq"], self.m["vocab"]
        tokens = torch.randint(vocab, (b, s), generator=gen, dtype=torch.long)
        shared = tokens[:, 0]
        labels = []
        for t, c in enumerate(self.heads):
            use_shared = torch.rand(b, generator=gen) < self.related
            own = tokens[:, (1 + t) % s]
            key = torch.where(use_shared, shared, own)
            mapped = torch.where(use_shared.unsqueeze(1), tokens,
                                 tokens * (2 * t + 3) + t + 1)
            if c["kind"] == "classify":
                if c["loss"] == "mse":
                    labels.append(F.one_hot(key % c["classes"], c["classes"]).float())
                else:
                    labels.append(key % c["classes"])
            elif c["kind"] == "tag":
                left = torch.zeros_like(tokens)
                left[:, 1:] = tokens[:, :-1] >= (vocab + 1) // 2
                labels.append((mapped + left) % c["classes"])
            elif c["kind"] == "span":
                start = key % s
                end = torch.clamp_max(start + tokens[:, 1] % 3, s - 1)
                labels.append(torch.stack([start, end], 1))
            else:
                raise NotImplementedError("the peer has no decoder head")
        return tokens, labels


#===----------------------------------------------------------------------===#
# The model: runtime/src/Model.cpp
#===----------------------------------------------------------------------===#

class PeerModel:
    def __init__(self, config, params, device, variant):
        self.c = config["model"]
        self.heads = config["heads"]
        self.p = {k: v.to(device).detach().requires_grad_(True) for k, v in params.items()}
        self.variant = variant
        self.fused = variant == "sdpa" or variant in COMPILED
        self.training = True
        if variant == "selective":
            from torch.utils.checkpoint import (CheckpointPolicy,
                                                create_selective_checkpoint_contexts)
            save = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                    torch.ops.aten.bmm.default}

            def policy(ctx, op, *args, **kwargs):
                return (CheckpointPolicy.MUST_SAVE if op in save
                        else CheckpointPolicy.PREFER_RECOMPUTE)
            self.context_fn = functools.partial(create_selective_checkpoint_contexts, policy)
        self.freeze(self.p.items())

    def backbone_parameters(self):
        return [v for k, v in self.p.items()
                if not k.startswith("head.") and v.requires_grad]

    def freeze(self, named):
        """The spec's freeze: the frozen layers' parameters get no gradient
        (and, left out of backbone_parameters, no optimizer state)."""
        f = self.c.get("freeze")
        if not f:
            return
        for name, p in named:
            layer = layer_of(name, self.c["layers"])
            if layer is not None and f[0] <= layer <= f[1]:
                p.requires_grad_(False)

    def no_grad_top(self):
        """The frozen run from the embeddings up (-1: none), whose taps carry
        no gradient."""
        f = self.c.get("freeze")
        return f[1] if f and f[0] == 0 else -1

    def head_parameters(self, name):
        prefix = "head." + name + "."
        return [v for k, v in self.p.items() if k.startswith(prefix)]

    def dropout(self, x):
        d = self.c["dropout"]
        if not self.training or d == 0.0:
            return x
        return torch.native_dropout(x, d, True)[0]

    def norm(self, name, x):
        return F.layer_norm(x, (x.size(-1),), self.p[name + ".weight"],
                            self.p[name + ".bias"], 1e-5)

    def linear(self, name, x):
        return F.linear(x, self.p[name + ".weight"], self.p[name + ".bias"])

    def embed(self, tokens):
        x = F.embedding(tokens, self.p["embed.tok"]) + self.p["embed.pos"][: tokens.size(1)]
        return self.dropout(x)

    def attention(self, l, x):
        n, h = f"layer{l}.attn", x.size(-1)
        heads = self.c["heads"]
        qkv = self.linear(n + ".qkv", self.norm(n + ".norm", x))

        def split(t):  # [B, S, H] -> [B, heads, S, d]
            t = t.view(t.size(0), t.size(1), heads, h // heads).transpose(1, 2)
            return t if self.fused else t.contiguous()
        q, k, v = split(qkv[..., :h]), split(qkv[..., h:2 * h]), split(qkv[..., 2 * h:])
        del qkv
        scale = 1.0 / math.sqrt(q.size(-1))
        if self.fused:
            d = self.c["dropout"] if self.training else 0.0
            ctx = F.scaled_dot_product_attention(q, k, v, dropout_p=d, scale=scale)
            ctx = ctx.transpose(1, 2).reshape(ctx.size(0), ctx.size(2), -1)
            return x + self.dropout(self.linear(n + ".out", ctx))
        probs = self.dropout(torch.softmax(torch.matmul(q * scale, k.transpose(-2, -1)), -1))
        ctx = torch.matmul(probs, v)
        ctx = ctx.transpose(1, 2).reshape(ctx.size(0), ctx.size(2), -1)
        return x + self.dropout(self.linear(n + ".out", ctx))

    def mlp(self, l, x):
        n = f"layer{l}.mlp"
        up = self.linear(n + ".up", self.norm(n + ".norm", x))
        return x + self.dropout(self.linear(n + ".down", F.gelu(up)))

    def layer(self, l, x):
        return self.mlp(l, self.attention(l, x))

    def run_layer(self, l, x):
        if self.variant == "uniform":
            return checkpoint(self.layer, l, x, use_reentrant=False)
        if self.variant == "selective":
            return checkpoint(self.layer, l, x, use_reentrant=False,
                              context_fn=self.context_fn)
        return self.layer(l, x)

    def head_loss(self, t, tap, labels):
        c = self.heads[t]
        n = "head." + c["name"]
        if c["kind"] == "classify":
            pooled = torch.tanh(self.linear(n + ".pool", self.norm(n + ".norm", tap[:, 0])))
            out = self.linear(n + ".out", pooled)
            if c["loss"] == "mse":
                return F.mse_loss(out.float(), labels.float())
            return F.cross_entropy(out.float(), labels)
        if c["kind"] == "tag":
            out = self.linear(n + ".out", self.norm(n + ".norm", tap))
            return F.cross_entropy(out.reshape(-1, out.size(-1)).float(), labels.reshape(-1))
        if c["kind"] == "span":
            out = self.linear(n + ".out", self.norm(n + ".norm", tap))
            return 0.5 * (F.cross_entropy(out[..., 0].float(), labels[:, 0]) +
                          F.cross_entropy(out[..., 1].float(), labels[:, 1]))
        raise NotImplementedError("the peer has no decoder head")

    def losses(self, tokens, labels):
        """Per-task losses (unweighted), heads evaluated at their tap layer."""
        taps = {}
        need = {c["tap"] for c in self.heads}
        x = self.embed(tokens)
        if 0 in need:
            taps[0] = x
        top = max(need)
        for l in range(1, top + 1):
            x = self.run_layer(l, x)
            if l in need:
                taps[l] = x
        return [self.head_loss(t, taps[c["tap"]], labels[t]) for t, c in enumerate(self.heads)]


class HfPeerModel(PeerModel):
    """The same heads on the transformers model the spec's pretrained
    directory holds (eager, SDPA attention): what a user fine-tuning with
    Hugging Face writes. BERT without its pooler (the heads pool themselves),
    every layer run (output_hidden_states), the final norm's output as the
    last layer's (as mtpc's)."""

    def __init__(self, config, params, device, variant):
        import transformers
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        super().__init__(config, {k: v for k, v in params.items()
                                  if k.startswith("head.")}, device, "sdpa")
        weights = self.c.get("weights")
        if not weights:
            raise SystemExit("peer.py: --variant hf needs a pretrained backbone")
        kwargs = {"attn_implementation": "sdpa", "dtype": torch.float32}
        if self.c.get("kind") == "bert":
            kwargs["add_pooling_layer"] = False
        self.hf = transformers.AutoModel.from_pretrained(weights, **kwargs).to(device)
        self.hf.train()
        self.freeze(self.hf.named_parameters())

    def backbone_parameters(self):
        return [p for p in self.hf.parameters() if p.requires_grad]

    def losses(self, tokens, labels):
        hidden = self.hf(input_ids=tokens, output_hidden_states=True).hidden_states
        return [self.head_loss(t, hidden[c["tap"]], labels[t])
                for t, c in enumerate(self.heads)]


def scheduled_lr(c, step):
    """runtime/src/Trainer.cpp scheduledLr."""
    lr, warmup, total = c["lr"], c["warmup"], c["total"]
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(max((step - warmup) / span, 0.0), 1.0)
    if c["schedule"] == "linear":
        return lr * (1.0 - progress)
    if c["schedule"] == "cosine":
        return lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr


def resident():
    """(VmRSS, VmHWM) in bytes."""
    rss = hwm = -1
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return rss, hwm


def reset_resident_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def run(init, variant="none", steps=10, threads=0, device="cpu", resources=False, profile=None):
    config, params, first = load_init(init)
    if threads > 0:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    tr = config["train"]
    if tr["precision"] not in ("fp32", "bf16"):
        raise SystemExit("peer.py: fp32 or bf16 only (the run's precision is %s: fp16 needs "
                         "a loss scaler)" % tr["precision"])
    # bf16 as mtpc runs it: autocast around the forward, fp32 weights.
    autocast = lambda: torch.autocast(dev.type, dtype=torch.bfloat16,
                                      enabled=tr["precision"] == "bf16")
    if tr["micro_batches"] != 1:
        raise SystemExit("peer.py: one micro-batch per step only")
    model = (HfPeerModel if variant == "hf" else PeerModel)(config, params, dev, variant)
    forward = model.losses
    if variant in COMPILED:
        import torch._functorch.config as functorch_config
        if COMPILED[variant] is not None:
            functorch_config.activation_memory_budget = COMPILED[variant]
        forward = torch.compile(model.losses)
    head_names = [c["name"] for c in config["heads"]]
    groups = [{"params": model.backbone_parameters(), "lr": tr["backbone_lr"]["lr"]}]
    head_lr = tr["head_lr"] or [tr["backbone_lr"]] * len(head_names)
    for name, c in zip(head_names, head_lr):
        groups.append({"params": model.head_parameters(name), "lr": c["lr"]})
    # The run's AdamW (config.json written before the betas and eps were
    # recorded: AdamW's defaults, which the runtime used then).
    opt = torch.optim.AdamW(groups, lr=tr["backbone_lr"]["lr"],
                            betas=(tr.get("beta1", 0.9), tr.get("beta2", 0.999)),
                            eps=tr.get("eps", 1e-8), weight_decay=tr["weight_decay"])
    # AdamW's moments up front, as mtpc allocates them: the post-init level
    # includes them on both sides.
    for g in opt.param_groups:
        for p in g["params"]:
            opt.state[p] = {"step": torch.tensor(0.0),
                            "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                            "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
    data = Synthetic(config)
    b = config["batch_size"]
    batches = []
    for pos in range(steps):
        tokens, labels = data.batch(pos, b)
        if pos == 0:  # the generator must reproduce what the binary drew
            same = torch.equal(tokens, first["tokens"]) and all(
                torch.equal(l, first["label." + n]) for n, l in zip(head_names, labels))
            if not same:
                raise SystemExit("peer.py: the synthetic batch differs from the dumped one")
        batches.append((tokens.to(dev), [l.to(dev) for l in labels]))
    weights = [c["weight"] for c in config["heads"]]
    lr_configs = [tr["backbone_lr"]] + list(head_lr)
    backbone = model.backbone_parameters()

    if variant in COMPILED:  # compile now, outside the measured steps
        tokens, labels = batches[0]
        with autocast():
            warm = forward(tokens, labels)
        sum(w * l for w, l in zip(weights, warm)).backward()
        del warm
        for p in model.p.values():
            p.grad = None
    gc.collect()
    base_rss = -1
    if resources and reset_resident_peak():
        base_rss = resident()[0]
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base_cuda = torch.cuda.memory_allocated()
    times, cpu, losses = [], [], []
    first_peak = warm_base = -1
    prof = None
    for step in range(steps):
        if profile and step == 1:  # as mtprt-run --profile: the steps after the first
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                          record_shapes=True)
            prof.start()
        tokens, labels = batches[step]
        if cuda:
            torch.cuda.synchronize()
        start, cpu_start = time.perf_counter(), time.process_time()
        if variant == "offload":
            with torch.autograd.graph.save_on_cpu(pin_memory=cuda), autocast():
                task_losses = model.losses(tokens, labels)
        else:
            with autocast():
                task_losses = forward(tokens, labels)
        total = sum(w * l for w, l in zip(weights, task_losses))
        total.backward()
        del total
        # Features scope, uniform α = 1/T over the tasks whose tap carries a
        # gradient (a tap in the frozen run from the embeddings has none).
        n = sum(1 for c in config["heads"] if c["tap"] > model.no_grad_top()) or 1
        for p in backbone:
            if p.grad is not None:
                p.grad.mul_(1.0 / n)
        for g, c in zip(opt.param_groups, lr_configs):
            g["lr"] = scheduled_lr(c, step)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step_losses = [l.item() for l in task_losses]
        del task_losses
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
        losses.append(step_losses)
        if step == 0 and base_rss >= 0 and steps > 1:
            # The warm window, as the binary's rss-warm: from the end of the
            # first step over the later ones.
            first_peak = resident()[1]
            if reset_resident_peak():
                warm_base = resident()[0]
    if prof is not None:
        prof.stop()
        prof.export_chrome_trace(profile)
    out = {"variant": variant, "tasks": head_names, "step_time_s": times, "loss": losses,
           "cpu_s": cpu,
           "threads": torch.get_num_threads(), "device": str(dev), "torch": torch.__version__}
    if base_rss >= 0:
        now, hwm_now = resident()
        hwm = max(hwm_now, first_peak)
        out.update(rss_base=base_rss, rss_peak=hwm, rss_above_base=hwm - base_rss)
        if warm_base >= 0:
            out.update(rss_warm_base=warm_base, rss_warm_above=hwm_now - warm_base)
    if cuda:
        out.update(device_peak_bytes=torch.cuda.max_memory_allocated(),
                   device_above_base=torch.cuda.max_memory_allocated() - base_cuda)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", required=True, help="an mtpc binary's --dump-init DIR")
    ap.add_argument("--variant", choices=VARIANTS, default="none")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--resources", action="store_true",
                    help="measure the resident set's peak above the post-init level")
    ap.add_argument("--profile", metavar="FILE",
                    help="profile the steps after the first (CPU ops, shapes): a Chrome trace")
    a = ap.parse_args()
    print(json.dumps(run(a.init, a.variant, a.steps, a.threads, a.device, a.resources,
                         a.profile)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
