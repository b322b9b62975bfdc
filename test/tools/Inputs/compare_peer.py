#!/usr/bin/env python3
"""Runs every bench/peer.py variant (mtpc's own transformer's; with
VARIANT..., those) from a binary's --dump-init state and compares their
per-task losses with the binary's metrics, step by step.

    compare_peer.py BENCH_DIR INIT_DIR METRICS.jsonl STEPS TOL0 TOL [VARIANT...]
"""
import json
import sys

bench, init, metrics, steps, tol0, tol = sys.argv[1:7]
sys.path.insert(0, bench)
import peer  # noqa: E402

steps, tol0, tol = int(steps), float(tol0), float(tol)
mt = [json.loads(l) for l in open(metrics) if l.strip()]
bad = 0
# `hf` needs a pretrained backbone (test/pretrained/ runs it).
variants = sys.argv[7:] or [v for v in peer.VARIANTS if v != "hf"]
for variant in variants:
    out = peer.run(init, variant, steps, threads=1)
    for s in range(steps):
        rel = max(abs(out["loss"][s][i] - mt[s]["loss"][t]) / abs(mt[s]["loss"][t])
                  for i, t in enumerate(out["tasks"]))
        limit = tol0 if s == 0 else tol
        ok = rel <= limit
        bad += not ok
        print("%s step %d max rel diff %.1e %s" % (variant, s, rel, "ok" if ok else "OVER %g" % limit))
sys.exit(1 if bad else 0)
