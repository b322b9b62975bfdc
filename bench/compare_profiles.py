#!/usr/bin/env python3
"""Sums two Chrome traces (mtprt-run --profile, peer.py --profile) by op.

    bench/compare_profiles.py MTPC.json PEER.json [--steps N] [--top K]

For each CPU op (`cat` cpu_op) its self time — its duration less that of
the ops it called on the same thread — and its call count, per step (N: the
profiled steps, the same on both sides), side by side, largest difference
first: where one program spends time the other does not. Ops that only call
others (autograd's engine, mtprt's units) have little self time; the BLAS,
attention and pointwise kernels are where the time is.
"""
import argparse
import collections
import json
import sys


def self_times(path):
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    by_thread = collections.defaultdict(list)
    for e in events:
        by_thread[e["tid"]].append(e)
    total = collections.Counter()
    calls = collections.Counter()
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # [end, name, child time, duration]

        def close(entry):
            _, name, child, dur = entry
            total[name] += dur - child
            if stack:
                stack[-1][2] += dur

        for e in evs:
            while stack and stack[-1][0] <= e["ts"]:
                close(stack.pop())
            stack.append([e["ts"] + e["dur"], e["name"], 0.0, e["dur"]])
            calls[e["name"]] += 1
        while stack:
            close(stack.pop())
    return total, calls


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mtpc")
    ap.add_argument("peer")
    ap.add_argument("--steps", type=int, default=1, help="profiled steps on each side")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    (mt, mc), (pt, pc) = self_times(a.mtpc), self_times(a.peer)
    n = float(a.steps)
    # Largest difference first; among equal ones, the larger op.
    names = sorted(set(mt) | set(pt), key=lambda k: (-abs(mt[k] - pt[k]), -(mt[k] + pt[k]), k))
    print("| op | mtpc ms/step | calls | peer ms/step | calls | difference ms |")
    print("|---|---|---|---|---|---|")
    for k in names[:a.top]:
        print("| `%s` | %.1f | %d | %.1f | %d | %+.1f |" % (
            k, mt[k] / 1e3 / n, mc[k] / n, pt[k] / 1e3 / n, pc[k] / n, (mt[k] - pt[k]) / 1e3 / n))
    print("| all ops | %.1f | %d | %.1f | %d | %+.1f |" % (
        sum(mt.values()) / 1e3 / n, sum(mc.values()) / n, sum(pt.values()) / 1e3 / n,
        sum(pc.values()) / n, (sum(mt.values()) - sum(pt.values())) / 1e3 / n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
