#!/usr/bin/env python3
"""The data-parallel PyTorch peer for ZeRO (docs/zero.md): peer.py's model on
N processes (gloo on loopback), in the four ways a PyTorch user shards it:

  --zero 0  plain data parallelism: the gradients averaged by one all-reduce of
            the flattened gradients, as mtpc's exchange does; AdamW whole on
            every rank
  --zero 1  the same all-reduce, then torch.distributed.optim.
            ZeroRedundancyOptimizer (ZeRO stage 1: each rank keeps and updates
            its share of AdamW's state, then broadcasts it)
  --zero 2  FSDP2 (torch.distributed.fsdp.fully_shard) with
            reshard_after_forward=False: parameters, gradients (FSDP's own
            reduce-scatter, averaged over the ranks) and AdamW's state sharded;
            a unit's parameters all-gathered for its forward and kept whole
            until its backward (ZeRO-2-like, FSDP's SHARD_GRAD_OP)
  --zero 3  the same with reshard_after_forward=True: a unit's parameters freed
            after its forward and gathered again for its backward (ZeRO-3,
            FSDP's FULL_SHARD)

For 2 and 3 the peer's parameters are held by modules: each transformer layer
(its attention and MLP) is one fully_shard unit, the embeddings and the heads
belong to the root unit. Every rank loads the whole --dump-init state before
sharding; AdamW (the same groups, learning rates, betas, eps, weight decay)
is built over the sharded DTensor parameters afterwards. Each rank trains on
its slice of the global batch and the loss is the same weighted sum in every
mode, so the four agree to the reduction order.

    peer_zero.py --init DIR --nproc N [--zero 0|1|2|3] [--steps S] [--threads T]

Prints one JSON object (rank 0's): step times, losses, the resident set's
peak and post-init level of every rank.
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402


class Held(nn.Module):
    """A set of the peer's parameters as a module's ('.' in a name -> '__')."""

    def __init__(self, named):
        super().__init__()
        for k, v in named:
            self.register_parameter(k.replace(".", "__"),
                                    nn.Parameter(v.detach(), requires_grad=v.requires_grad))


class Layer(Held):
    """One transformer layer (attention and MLP): one fully_shard unit."""

    def __init__(self, model, l, named):
        super().__init__(named)
        self.__dict__["model"] = model  # not a submodule
        self.l = l

    def forward(self, x):
        return self.model.layer(self.l, x)


class Root(Held):
    """The embeddings, the heads (and anything outside the layers) and the
    layers: the root unit, whose forward is the peer's per-task losses."""

    def __init__(self, model, named, layers):
        super().__init__(named)
        self.__dict__["model"] = model
        self.layers = nn.ModuleList(layers)

    def forward(self, tokens, labels):
        return self.model.losses(tokens, labels)


class Live:
    """model.p for the module-held peer: each name looked up on its module at
    the time, so the forward sees what FSDP has put there (the gathered
    parameter inside a unit's forward and backward, the shard outside)."""

    def __init__(self, where):
        self.where = where  # name -> (module, attribute)

    def __getitem__(self, name):
        module, attr = self.where[name]
        return getattr(module, attr)

    def items(self):
        return ((k, self[k]) for k in self.where)

    def values(self):
        return (self[k] for k in self.where)


class ShardedPeerModel(peer.PeerModel):
    """peer.PeerModel with its parameters in modules (Root, one Layer per
    transformer layer), each layer run through its module so FSDP's hooks
    gather and free it."""

    def __init__(self, config, params, device, nproc, reshard_after_forward):
        super().__init__(config, params, device, "none")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        layers, where = [], {}
        for l in range(1, self.c["layers"] + 1):
            named = [(k, v) for k, v in self.p.items() if k.startswith("layer%d." % l)]
            layers.append(Layer(self, l, named))
            where.update((k, (layers[-1], k.replace(".", "__"))) for k, _ in named)
        rest = [(k, v) for k, v in self.p.items() if k not in where]
        self.root = Root(self, rest, layers)
        where.update((k, (self.root, k.replace(".", "__"))) for k, _ in rest)
        self.p = Live(where)  # the plain tensors dropped: the shards replace them
        mesh = init_device_mesh(device.type, (nproc,))
        for layer in layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
        fully_shard(self.root, mesh=mesh, reshard_after_forward=reshard_after_forward)

    def run_layer(self, l, x):
        return self.root.layers[l - 1](x)


def worker(rank, a, port, out):
    torch.set_num_threads(max(1, a.threads))
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=rank, world_size=a.nproc)
    config, params, _ = peer.load_init(a.init)
    tr = config["train"]
    cpu = torch.device("cpu")
    if a.zero >= 2:
        model = ShardedPeerModel(config, params, cpu, a.nproc, a.zero == 3)
        forward = model.root  # through the root module: its hooks gather the root unit
    else:
        model = peer.PeerModel(config, params, cpu, "none")
        forward = model.losses
    del params  # with FSDP the whole tensors go once sharded
    heads = [c["name"] for c in config["heads"]]
    head_lr = tr["head_lr"] or [tr["backbone_lr"]] * len(heads)
    # By name after any sharding: the groups hold FSDP's DTensor shards.
    groups = [{"params": model.backbone_parameters(), "lr": tr["backbone_lr"]["lr"]}]
    groups += [{"params": model.head_parameters(n), "lr": c["lr"]}
               for n, c in zip(heads, head_lr)]
    kw = dict(betas=(tr.get("beta1", 0.9), tr.get("beta2", 0.999)),
              eps=tr.get("eps", 1e-8), weight_decay=tr["weight_decay"])
    if a.zero == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=torch.optim.AdamW,
                                      lr=groups[0]["lr"], **kw)
        for g in groups[1:]:
            opt.add_param_group(g)
    else:
        opt = torch.optim.AdamW(groups, lr=groups[0]["lr"], **kw)
    data = peer.Synthetic(config)
    b = config["batch_size"]
    local = b // a.nproc
    weights = [c["weight"] for c in config["heads"]]
    trainable = [p for g in groups for p in g["params"]]
    base = peer.resident()[0] if peer.reset_resident_peak() else -1
    times, losses = [], []
    for step in range(a.steps):
        tokens, labels = data.batch(step, b)
        rows = slice(rank * local, (rank + 1) * local)
        tokens, labels = tokens[rows], [l[rows] for l in labels]
        start = time.perf_counter()
        task_losses = forward(tokens, labels)
        sum(w * l for w, l in zip(weights, task_losses)).backward()
        if a.zero < 2:  # FSDP reduce-scatters (and averages) in the backward
            flat = torch.cat([p.grad.reshape(-1) if p.grad is not None
                              else torch.zeros(p.numel()) for p in trainable])
            dist.all_reduce(flat)
            flat.div_(a.nproc)
            off = 0
            for p in trainable:
                n = p.numel()
                if p.grad is not None:
                    p.grad.copy_(flat[off:off + n].view_as(p))
                off += n
            del flat
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        losses.append([l.item() for l in task_losses])
    rss = torch.tensor([base, peer.resident()[1]], dtype=torch.float64)
    every = [torch.zeros_like(rss) for _ in range(a.nproc)]
    dist.all_gather(every, rss)
    if rank == 0:
        with open(out + ".part", "w") as f:
            json.dump({"nproc": a.nproc, "zero": a.zero, "step_time_s": times, "loss": losses,
                       "rss_base": [int(x[0]) for x in every],
                       "rss_peak": [int(x[1]) for x in every]}, f)
        os.replace(out + ".part", out)  # whole or absent (see main)
    # Every rank done before any tears gloo down (one leaving while another
    # was still in a collective aborted the peer now and then).
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", required=True)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0,
                    help="0 data parallel, 1 ZeroRedundancyOptimizer, 2 fully_shard "
                         "(reshard_after_forward=False), 3 fully_shard (True)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(a.init, "peer-zero-%d.json" % os.getpid())
    try:
        mp.spawn(worker, args=(a, port, out), nprocs=a.nproc, join=True)
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as e:
        # Rank 0 writes the figures once every rank has finished its steps;
        # a rank dying after that, in gloo's teardown ("terminate called
        # without an active exception", seen at 4 processes), spoils nothing.
        if not os.path.exists(out):
            raise
        sys.stderr.write("peer_zero.py: after the figures were written: %s\n" % e)
    with open(out) as f:
        print(f.read())
    os.unlink(out)


if __name__ == "__main__":
    main()
