#!/usr/bin/env python3
"""The data-parallel PyTorch peer for ZeRO (docs/zero.md): peer.py's model on
N processes (gloo on loopback), the gradients averaged by one all-reduce of
the flattened gradients as mtpc's exchange does, and either AdamW whole on
every rank or torch.distributed.optim.ZeroRedundancyOptimizer (ZeRO stage 1:
each rank keeps and updates its share of AdamW's state, then broadcasts it).

    peer_zero.py --init DIR --nproc N [--zero 0|1] [--steps S] [--threads T]

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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402


def worker(rank, a, port, out):
    torch.set_num_threads(max(1, a.threads))
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=rank, world_size=a.nproc)
    config, params, _ = peer.load_init(a.init)
    tr = config["train"]
    model = peer.PeerModel(config, params, torch.device("cpu"), "none")
    heads = [c["name"] for c in config["heads"]]
    head_lr = tr["head_lr"] or [tr["backbone_lr"]] * len(heads)
    groups = [{"params": model.backbone_parameters(), "lr": tr["backbone_lr"]["lr"]}]
    groups += [{"params": model.head_parameters(n), "lr": c["lr"]}
               for n, c in zip(heads, head_lr)]
    kw = dict(betas=(tr.get("beta1", 0.9), tr.get("beta2", 0.999)),
              eps=tr.get("eps", 1e-8), weight_decay=tr["weight_decay"])
    if a.zero:
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
        task_losses = model.losses(tokens, labels)
        sum(w * l for w, l in zip(weights, task_losses)).backward()
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
        with open(out, "w") as f:
            json.dump({"nproc": a.nproc, "zero": a.zero, "step_time_s": times, "loss": losses,
                       "rss_base": [int(x[0]) for x in every],
                       "rss_peak": [int(x[1]) for x in every]}, f)
    # Every rank done before any tears gloo down (one leaving while another
    # was still in a collective aborted the peer now and then).
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", required=True)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--zero", type=int, choices=(0, 1), default=0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(a.init, "peer-zero-%d.json" % os.getpid())
    mp.spawn(worker, args=(a, port, out), nprocs=a.nproc, join=True)
    with open(out) as f:
        print(f.read())
    os.unlink(out)


if __name__ == "__main__":
    main()
