#!/usr/bin/env python3
"""mtpc's benchmarks side by side with the PyTorch peer, as markdown tables with ratios.

Run it as `bench/run` (the project's own torch: the venv scripts/setup.sh makes).
Sections (all by default; `--only a,b`):

  agree     the peer's losses against the mtpc binary's, step by step, from the
            binary's --dump-init state (dropout 0, uniform weights)
  step      mtpc without a strategy against the peers a user writes today: eager
            with F.scaled_dot_product_attention, torch.compile, torch.compile with
            activation_memory_budget 0.5 and 0.3; model M (dropout 0) and the
            wider model W (hidden 256, seq 256)
  load      step time beside one other CPU-bound process, default threads and
            one: mtpc against eager SDPA
  memory    peak memory and step time: mtpc none / uniform / the planner at
            uniform's peak and at 50% / 33% / 25% of the no-checkpoint peak,
            task-granular (+ offload); the peer none / uniform / selective /
            offload. RSS above the post-init level with glibc's mmap threshold
            pinned (both sides), mtpc's tracking-allocator figure, step time
            median and spread over runs; the source's table at CPU scale; the
            runtime overhead of mtpc without a strategy against the eager peer
  plan      plan quality: the joint solver against the exhaustive optimum
            (gap distribution), solve time against size up to 1000 layers, 16 tasks
  compress  bytes per step and final loss with 2 processes: fp32 all-reduce, the
            source's GSC setting, stronger settings
  scope     step time and memory against the number of tasks, features vs params
  ablation  final per-task losses with GFM, DGFG, per-task clip, per-task LR each
            on and off beside the plain weighted sum, several seeds, two
            relatednesses
  dynbatch  the dynamic batch schedule (D15) against fixed batches of its
            smallest and largest size: held-out loss, records seen, time,
            peak against the plan
  saps      SAPS sparse updates (D12) against dense ones: memory on model M
            (and M with a 32k vocabulary), fine-tuning quality from a
            pre-trained backbone against dense and heads-only
  forgetting  two-phase continual learning (A, then B): A's held-out
            metric before and after B, plain, with EWC (D14), with adapters
            (D13) on a trainable and a frozen base
  search    mtpc search (C11) over a 1080-candidate family of model M: time,
            what fits, the choices, samples against the exhaustive choice,
            the chosen one's measured peak, proxy training

`--quick` runs a subset in under 3 minutes on the 2-core build machine; the
full run takes under 20. Nothing here is a test: the numbers depend on the
machine and on what else runs on it (the load average is printed).
"""
import argparse
import hashlib
import itertools
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import plan_scale  # noqa: E402  (the 1000-layer spec generator)

MMAP_THRESHOLD = "65536"  # glibc: tensors above 64 KiB are mmapped, so freeing returns them


def log(msg):
    sys.stderr.write("[bench] " + msg + "\n")
    sys.stderr.flush()


def run(cmd, env=None, timeout=600, check=True):
    e = dict(os.environ)
    if env:
        e.update(env)
    p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s%s" % (" ".join(cmd), p.returncode,
                                                      p.stdout[-2000:], p.stderr[-2000:]))
    return p


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt_bytes(b):
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return "—"
    return "%.1f MiB" % (b / 2**20)


def fmt_ratio(x):
    return "—" if x is None or math.isnan(x) else "%.2f×" % x


def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


#===----------------------------------------------------------------------===#
# Specs and binaries
#===----------------------------------------------------------------------===#

def spec_text(name, m, tasks, strategy, budget, train, correlate=(), backbone_line=None):
    """A .mtp spec: m = backbone dict (or `backbone_line` as written), tasks =
    [(name, head, tap clause)]."""
    lines = ["model %s {" % name,
             "  " + backbone_line if backbone_line else
             "  backbone transformer { " + "  ".join("%s = %s" % kv for kv in m.items()) + " }"]
    for t, head, tap in tasks:
        lines.append("  task %s : %s %s" % (t, head, tap))
    for a, b, r in correlate:
        lines.append("  correlate %s ~ %s = %s" % (a, b, r))
    lines.append("  budget { " + "  ".join("%s = %s" % kv for kv in budget.items()) + " }")
    lines.append("  strategy { " + "  ".join("%s = %s" % kv for kv in strategy.items()) + " }")
    lines.append("  train { " + "  ".join("%s = %s" % kv for kv in train.items()) + " }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def search_gap(plan):
    """How far above the optimum's added time a plan the search did not
    prove is at most (its root bound), or None."""
    p = plan["plan"]
    bound = p.get("search", {}).get("lower_bound_seconds") or 0
    added = p.get("added_seconds")
    return added / bound - 1 if bound > 0 and added is not None else None


class Builder:
    """mtpc build with a cache under build/bench keyed by the spec's text; a
    binary older than mtpc or the runtime library is rebuilt."""

    def __init__(self, args):
        self.mtpc = args.mtpc
        self.device = args.device
        self.dir = os.path.join(args.work, "bin")
        os.makedirs(self.dir, exist_ok=True)
        deps = [self.mtpc, os.path.join(ROOT, "build", "runtime", "src", "libmtprt.a")]
        self.newest = max(os.path.getmtime(d) for d in deps if os.path.exists(d))
        self.build_seconds = []

    def path(self, text):
        return os.path.join(self.dir, hashlib.sha1(text.encode()).hexdigest()[:12])

    def plan(self, text, plan_args=()):
        """mtpc plan --format=json, or (None, error) when the budget cannot be met."""
        with tempfile.NamedTemporaryFile("w", suffix=".mtp", delete=False) as f:
            f.write(text)
        try:
            p = run([self.mtpc, "plan", f.name, "--format=json"] + self.device_flags() +
                    list(plan_args), check=False)
        finally:
            os.unlink(f.name)
        if p.returncode != 0:
            err = [l for l in p.stderr.splitlines() if "error" in l]
            return None, (err[0] if err else p.stderr.strip()[:200])
        return json.loads(p.stdout), None

    def device_flags(self):
        return ["--device", "cuda"] if self.device == "cuda" else []

    def build(self, text, plan_args=()):
        # Cached by the spec, the flags and the files they name (a costs file).
        out = self.path(text + "\n".join(plan_args) +
                        "".join(open(x).read() for x in plan_args if os.path.isfile(x)))
        if os.path.exists(out) and os.path.getmtime(out) >= self.newest:
            return out
        src = out + ".mtp"
        with open(src, "w") as f:
            f.write(text)
        start = time.perf_counter()
        run([self.mtpc, "build", src, "-o", out] + self.device_flags() + list(plan_args),
            timeout=900)
        self.build_seconds.append(time.perf_counter() - start)
        shutil.rmtree(out + ".project", ignore_errors=True)
        return out


def read_metrics(path):
    if not os.path.exists(path):  # --steps 0
        return []
    with open(path) as f:  # step records (not events such as a gate recalibration)
        return [r for r in (json.loads(l) for l in f if l.strip()) if "step_time_s" in r]


class Runner:
    def __init__(self, args):
        self.args = args
        self.n = 0

    def tmp(self, suffix):
        self.n += 1
        return os.path.join(self.args.work, "run%d%s" % (self.n, suffix))

    def threads(self):
        return ["--threads", str(self.args.threads)] if self.args.threads > 0 else []

    def mtpc(self, binary, steps, memory=False, extra=(), env=None):
        """One training run of an mtpc binary: its metrics records (+ rss)."""
        metrics = self.tmp(".jsonl")
        cmd = [binary, "--steps", str(steps), "--progress", "off", "--metrics", metrics,
               "--log-every", "1"] + self.threads() + list(extra)
        if self.args.device == "cuda":
            cmd += ["--device", "cuda"]
        e = dict(env or {})
        cmd.append("--resources")
        if memory:
            e["MALLOC_MMAP_THRESHOLD_"] = MMAP_THRESHOLD
        p = run(cmd, env=e)
        recs = read_metrics(metrics)
        evals = []
        if os.path.exists(metrics):
            with open(metrics) as f:
                evals = [e for e in (json.loads(l) for l in f if l.strip()) if "eval" in e]
            os.unlink(metrics)
        out = {"records": recs, "evals": evals}
        m = re.search(r"rss: post-init (\d+) B, peak (\d+) B, peak above post-init (-?\d+) B", p.stdout)
        if m:
            out.update(rss_base=int(m.group(1)), rss_peak=int(m.group(2)),
                       rss_above_base=int(m.group(3)))
        m = re.search(r"rss-warm: after the first step (\d+) B, later peak (\d+) B, above it "
                      r"(-?\d+) B", p.stdout)
        if m:
            out.update(rss_warm_base=int(m.group(1)), rss_warm_above=int(m.group(3)))
        m = re.search(r"cpu: first step ([\d.]+) s, (\d+) later steps ([\d.]+) s", p.stdout)
        if m and int(m.group(2)) > 0:
            out["cpu_step_s"] = float(m.group(3)) / int(m.group(2))
        return out

    def peer(self, init, variant, steps, memory=False):
        cmd = [sys.executable, os.path.join(ROOT, "bench", "peer.py"), "--init", init,
               "--variant", variant, "--steps", str(steps), "--device", self.args.device]
        cmd += self.threads() + ["--resources"]
        env = {}
        if memory:
            env["MALLOC_MMAP_THRESHOLD_"] = MMAP_THRESHOLD
        out = json.loads(run(cmd, env=env).stdout.strip().splitlines()[-1])
        if len(out["cpu_s"]) > 1:
            out["cpu_step_s"] = statistics.mean(out["cpu_s"][1:])
        return out


#===----------------------------------------------------------------------===#
# The models
#===----------------------------------------------------------------------===#

def budget_block(args, memory, micro_batch=8, global_batch=None):
    if args.device == "cuda":
        b = {"device": args.gpu_preset, "memory": "%dB" % memory, "headroom": "0B",
             "micro_batch": micro_batch, "precision": "fp32"}
    else:
        b = {"device": "cpu", "memory": "%dB" % memory, "micro_batch": micro_batch,
             "precision": "fp32"}
    if global_batch:
        b["global_batch"] = global_batch
    return b


def model_m(args, strategy, memory=16 << 30, dropout=0.1, backbone=None, precision="fp32"):
    """The memory/time model: 12 narrow layers over 128 tokens, four tasks at
    layers 3, 6, 9, 12 — activations (mostly attention probabilities) dominate.
    `backbone`: extra backbone keys (e.g. pointwise = aten)."""
    m = {"layers": 12, "hidden": 64, "heads": 4, "ffn": 256, "vocab": 512, "seq": 128,
         "dropout": dropout}
    m.update(backbone or {})
    tasks = [("topic", "classify(classes = 4)", "from pooled"),
             ("pos", "tag(labels = 12)", "from layer 3"),
             ("chunk", "tag(labels = 8)", "from layer 6"),
             ("ner", "tag(labels = 9)", "from layer 9")]
    base = {"checkpoint": "none", "offload": "none", "gfm": "none", "dgfg": "none",
            "clip": "none", "lr": "cosine(1e-3, warmup = 5)"}
    base.update(strategy)
    budget = budget_block(args, memory)
    budget["precision"] = precision
    return spec_text("bench_m", m, tasks, base, budget,
                     {"steps": 20, "seed": 1, "log_every": 1},
                     correlate=[("pos", "chunk", 0.8), ("chunk", "ner", 0.3)])


def model_w(args, strategy, memory=16 << 30, backbone=None):
    """The wider model: 6 layers of hidden 256 over 256 tokens, batch 4, four
    tasks at layers 2 and 6 — matmuls weigh as much as attention here."""
    m = {"layers": 6, "hidden": 256, "heads": 4, "ffn": 1024, "vocab": 512, "seq": 256,
         "dropout": 0.0}
    m.update(backbone or {})
    tasks = [("pos", "tag(labels = 12)", "from layer 2"),
             ("chunk", "tag(labels = 8)", "from layer 2"),
             ("ner", "tag(labels = 9)", "from layer 6"),
             ("topic", "classify(classes = 4)", "from pooled")]
    base = {"checkpoint": "none", "offload": "none", "gfm": "none", "dgfg": "none",
            "clip": "none", "lr": "cosine(1e-3, warmup = 5)"}
    base.update(strategy)
    return spec_text("bench_w", m, tasks, base, budget_block(args, memory, micro_batch=4),
                     {"steps": 20, "seed": 1, "log_every": 1},
                     correlate=[("pos", "chunk", 0.8)])


def model_s(args, strategy, steps=200, tasks=None, layers=4, seq=32, global_batch=None):
    """The small model (00_tiny's shape) for compression, scope and the ablation."""
    m = {"layers": layers, "hidden": 64, "heads": 4, "ffn": 256, "vocab": 512, "seq": seq,
         "dropout": 0.1}
    tasks = tasks or [("topic", "classify(classes = 4)", "from pooled"),
                      ("pos", "tag(labels = 12)", "from layer 2"),
                      ("chunk", "tag(labels = 8)", "from layer 2")]
    base = {"checkpoint": "none", "offload": "none", "gfm": "none", "dgfg": "none",
            "clip": "none", "lr": "cosine(1e-3, warmup = 20)"}
    base.update(strategy)
    names = [t[0] for t in tasks]
    corr = [("pos", "chunk", 0.8), ("topic", "pos", 0.1)] if {"pos", "chunk", "topic"} <= set(names) else []
    return spec_text("bench_s", m, tasks, base,
                     budget_block(args, 2 << 30, global_batch=global_batch),
                     {"steps": steps, "seed": 7, "log_every": 1}, correlate=corr)


#===----------------------------------------------------------------------===#
# Sections
#===----------------------------------------------------------------------===#

def section_agree(args, b, r, out):
    steps = 5
    binary = b.build(model_m(args, {}, dropout=0.0))
    init = os.path.join(args.work, "init-agree")
    shutil.rmtree(init, ignore_errors=True)
    mt = r.mtpc(binary, steps, extra=["--dump-init", init])["records"]
    pe = r.peer(init, "none", steps)
    rows, worst0, worst = [], 0.0, 0.0
    for s in range(steps):
        rel = max(abs(pe["loss"][s][i] - mt[s]["loss"][t]) / abs(mt[s]["loss"][t])
                  for i, t in enumerate(pe["tasks"]))
        worst = max(worst, rel)
        if s == 0:
            worst0 = rel
        rows.append([s, ", ".join("%s %.6f / %.6f" % (t, mt[s]["loss"][t], pe["loss"][s][i])
                                  for i, t in enumerate(pe["tasks"])), "%.1e" % rel])
    ok = worst0 <= 1e-5 and worst <= 1e-4
    out.append("### Agreement: the peer against the mtpc binary\n")
    out.append("Model M with dropout 0, `checkpoint = none`, `gfm = none`, `dgfg = none`, "
               "`clip = none` (uniform task weights); the peer starts from the binary's "
               "`--dump-init` state and generates the same synthetic batches. Tolerance: "
               "relative 1e-5 at step 0 (forward only), 1e-4 over %d steps (AdamW updates "
               "in a different summation order). **%s** (step 0: %.1e, worst: %.1e).\n"
               % (steps, "agree" if ok else "DISAGREE", worst0, worst))
    out.append(table(["step", "loss per task: mtpc / peer", "max rel. diff"], rows))
    return {"step0_rel": worst0, "worst_rel": worst, "ok": ok}


def cpu_time(args):
    """Whether step times are CPU times (one thread on a CPU: robust to other
    work on the machine) rather than wall times."""
    return args.device == "cpu" and args.threads == 1


def step_times(recs, skip=1):
    """A run's step times without its first (warm-up) steps."""
    ts = [x["step_time_s"] for x in recs]
    return ts[skip:] if len(ts) > skip else ts


def section_memory(args, b, r, out):
    quick = args.quick
    none_text = model_m(args, {})
    none_plan, _ = b.plan(none_text)
    keep_peak = none_plan["plan"]["planned_peak_bytes"]
    uni_text = model_m(args, {"checkpoint": "uniform(every = 1)"})
    uni_plan, _ = b.plan(uni_text)
    uni_peak = uni_plan["plan"]["planned_peak_bytes"]
    auto_plan, _ = b.plan(model_m(args, {"checkpoint": "auto"}))
    auto_min = auto_plan["plan"]["minimal_peak_bytes"]
    configs = [("mtpc none", none_text), ("mtpc uniform (every layer)", uni_text)]
    fractions = [0.33] if quick else [0.5, 0.33, 0.25]
    for f in fractions:
        configs.append(("mtpc planner @ %d%%" % round(100 * f),
                        model_m(args, {"checkpoint": "auto"}, memory=int(f * keep_peak))))
    configs.append(("mtpc planner @ its minimum (%d%%)" % round(100 * auto_min / keep_peak),
                    model_m(args, {"checkpoint": "auto"}, memory=auto_min)))
    if not quick:
        configs.append(("mtpc planner @ uniform's peak",
                        model_m(args, {"checkpoint": "auto"}, memory=uni_peak)))
        configs.append(("mtpc task_granular @ 50%",
                        model_m(args, {"checkpoint": "task_granular(threshold = 0.5)"},
                                memory=int(0.5 * keep_peak))))
        configs.append(("mtpc task_granular + offload @ 50%",
                        model_m(args, {"checkpoint": "task_granular(threshold = 0.5)",
                                       "offload": "cpu_pinned(max_latency = 1.2ms)"},
                                memory=int(0.5 * keep_peak))))
    # The same binaries without the per-step task-gradient cosine probe (it
    # feeds DGFG and the dashboard; with dgfg = none it changes no update).
    probe_off = ["mtpc none", "mtpc uniform (every layer)"] if quick else \
        [n for n, _ in configs if "planner @ 33" not in n and "planner @ 25" not in n
         and "uniform's peak" not in n]
    entries = []
    for name, text in configs:
        plan, err = b.plan(text)
        if plan is None:
            entries.append({"name": name, "error": err})
            continue
        e = {"name": name, "kind": "mtpc", "binary": b.build(text), "extra": [],
             "predicted": plan["plan"]["planned_peak_bytes"],
             "planned_added_s": plan["plan"]["added_seconds"],
             "regions": len(plan["plan"]["regions"]),
             "offloads": len(plan["plan"]["offloads"])}
        entries.append(e)
        if name in probe_off:
            entries.append(dict(e, name=name + ", --cosine-every 0", extra=["--cosine-every", "0"]))
    init = os.path.join(args.work, "init-m")
    shutil.rmtree(init, ignore_errors=True)
    r.mtpc(entries[0]["binary"], 0, extra=["--dump-init", init])
    for v in ("none", "uniform", "selective", "offload"):
        entries.append({"name": "peer " + v, "kind": "peer", "variant": v})
    live = [e for e in entries if "error" not in e]
    runs, steps, mem_steps = (2, 5, 2) if quick else (3, 7, 3)
    for e in live:
        e["wall"], e["cpu"] = [], []
    log("memory: %d configurations, %d timed runs of %d steps each, one memory run" %
        (len(live), runs, steps))
    # Interleaved, so a burst of load on the machine hits every configuration.
    for i in range(runs):
        for e in live:
            if e["kind"] == "mtpc":
                m = r.mtpc(e["binary"], steps, extra=e["extra"])
                recs = m["records"]
                e["wall"].append(median(step_times(recs)))
                e.setdefault("losses", [sum(x["loss"].values()) / len(x["loss"]) for x in recs])
            else:
                m = r.peer(init, e["variant"], steps)
                e["wall"].append(median(m["step_time_s"][1:]))
                e.setdefault("losses", [sum(l) / len(l) for l in m["loss"]])
            e["cpu"].append(m.get("cpu_step_s", float("nan")))
    for e in live:
        if e["kind"] == "mtpc":
            m = r.mtpc(e["binary"], mem_steps, memory=True, extra=e["extra"])
            e["tracked"] = max(x["measured_peak_bytes"] for x in m["records"])
            e["host_pool"] = max(x["host_pool_bytes"] for x in m["records"])
        else:
            m = r.peer(init, e["variant"], mem_steps, memory=True)
            e["tracked"] = m.get("device_peak_bytes")
            e["host_pool"] = None
        e["rss"] = m.get("rss_above_base")
        e["step"] = median(e["wall"])
        e["cpu_step"] = median(e["cpu"])
    by = {e["name"]: e for e in live}
    mn, pn = by["mtpc none"], by["peer none"]
    # With one thread the CPU time is the compute, whatever else runs on the
    # machine; the wall time is what a user waits (and what the GPU run shows).
    key = "cpu_step" if cpu_time(args) else "step"
    rows = []
    for e in entries:
        if "error" in e:
            msg = e["error"].split("error:")[-1].strip()
            m = re.search(r"smallest peak any plan reaches is ([\d.]+ \w+)", msg)
            rows.append([e["name"], "does not fit (smallest reachable: %s)" % m.group(1) if m
                         else "does not fit: " + msg[:80]] + [""] * 9)
            continue
        rows.append([e["name"],
                     fmt_bytes(e.get("predicted")),
                     fmt_bytes(e["tracked"]) if e["tracked"] is not None else "—",
                     fmt_bytes(e["rss"]),
                     fmt_ratio(e["rss"] / pn["rss"]) if e["rss"] and pn["rss"] else "—",
                     "%.0f (%.0f–%.0f)" % (1e3 * e["cpu_step"], 1e3 * min(e["cpu"]), 1e3 * max(e["cpu"])),
                     "%.0f (%.0f–%.0f)" % (1e3 * e["step"], 1e3 * min(e["wall"]), 1e3 * max(e["wall"])),
                     fmt_ratio(e[key] / mn[key]),
                     fmt_ratio(e[key] / pn[key]),
                     fmt_bytes(e["host_pool"]) if e.get("host_pool") else "—"])
    out.append("### Peak memory and step time (model M)\n")
    out.append("Model M: 12 layers, hidden 64, 4 heads, ffn 256, seq 128, vocab 512, batch 8, "
               "fp32, dropout 0.1, four tasks at layers 3, 6, 9, 12 (pos~chunk 0.8, chunk~ner "
               "0.3). Budgets are fractions of mtpc's predicted no-checkpoint peak (%s); "
               "uniform's predicted peak is %s, the planner's smallest reachable %s. "
               "RSS: the process's peak resident set above its level after initialization "
               "(parameters, AdamW state, LibTorch), glibc `MALLOC_MMAP_THRESHOLD_=%s` for "
               "both sides, %d steps. Step time: %d interleaved runs of %d steps (first step "
               "dropped); CPU = the process's user+system time per step, wall = median of the "
               "steps' wall time; median of the runs (their range); %s thread(s). Ratios use %s "
               "time.\n" % (fmt_bytes(keep_peak), fmt_bytes(uni_peak), fmt_bytes(auto_min),
                            MMAP_THRESHOLD, mem_steps, runs, steps, args.threads or "LibTorch's",
                            "CPU" if key == "cpu_step" else "wall"))
    out.append(table(["configuration", "predicted peak", "tracked peak (mtpc) / device (peer)",
                      "RSS above post-init", "RSS / peer none", "CPU ms/step", "wall ms/step",
                      "time / mtpc none", "time / peer none", "host pool"], rows))
    # The source's table at CPU scale.
    src = [("baseline (no checkpointing)", "mtpc none"),
           ("task-granular checkpointing", "mtpc task_granular @ 50%"),
           ("+ activation offload", "mtpc task_granular + offload @ 50%")]
    fixed = (none_plan["peak"]["parameters"] + none_plan["peak"]["optimizer"]
             + none_plan["peak"]["gradients"])
    srows = []
    for label, name in src:
        for suffix, what in (("", ""), (", --cosine-every 0", " (no cosine probe)")):
            e = by.get(name + suffix)
            if not e:
                continue
            tail = e["losses"][len(e["losses"]) // 2:]
            srows.append([label + what, fmt_bytes(e["tracked"] - fixed), "%.1f" % (8 / e[key]),
                          "±%.3f" % (statistics.pstdev(tail) if len(tail) > 1 else 0.0)])
    if len(srows) > 1:
        out.append("\nThe source's table (docs/techniques.md A4) at CPU scale: peak activations = the "
                   "tracked peak less parameters, gradients and optimizer state as planned; "
                   "throughput from the %s time; loss std = standard deviation of the mean task "
                   "loss over the last half of a timed run.\n" % ("CPU" if key == "cpu_step" else "wall"))
        out.append(table(["strategy", "peak activations", "throughput (seq/s)", "loss std"], srows))
    m0 = by.get("mtpc none, --cosine-every 0")
    out.append("\nRuntime overhead, no strategy: mtpc none / peer none = **%s** step time "
               "(%s), **%s** RSS above post-init%s.\n"
               % (fmt_ratio(mn[key] / pn[key]), "CPU" if key == "cpu_step" else "wall",
                  fmt_ratio(mn["rss"] / pn["rss"]) if pn["rss"] else "—",
                  "; without the cosine probe (`--cosine-every 0`) **%s** step time, **%s** RSS"
                  % (fmt_ratio(m0[key] / pn[key]), fmt_ratio(m0["rss"] / pn["rss"]))
                  if m0 and pn["rss"] else ""))
    return {e["name"]: {k: v for k, v in e.items() if k not in ("binary",)} for e in entries}


STEP_PEERS = [("peer none (explicit S×S)", "none"), ("peer sdpa (eager)", "sdpa"),
              ("peer torch.compile", "compile"),
              ("peer torch.compile, budget 0.5", "compile_budget50"),
              ("peer torch.compile, budget 0.3", "compile_budget30")]


def planned_peak(plan):
    return plan["plan"]["planned_peak_bytes"] if "plan" in plan else plan["peak"]["bytes"]


def measure(r, entries, init, runs, steps, mem_steps, rss_key):
    """Interleaved timed runs of every entry (a burst of load on the machine
    hits each), then one memory run of each entry not measured yet: its
    per-run wall and CPU step times and their medians, its tracked peak and
    `rss_key`'s figure as "rss". mtpc entries run their "binary" with their
    runtime flags "extra"; peers their "variant" from `init`."""
    for e in entries:
        e["wall"], e["cpu"] = [], []
    for _ in range(runs):
        for e in entries:
            if e["kind"] == "mtpc":
                m = r.mtpc(e["binary"], steps, extra=e.get("extra", ()))
                e["wall"].append(median(step_times(m["records"])))
            else:
                m = r.peer(init, e["variant"], steps)
                e["wall"].append(median(m["step_time_s"][1:]))
            e["cpu"].append(m.get("cpu_step_s", float("nan")))
    for e in entries:
        if "rss" not in e:
            if e["kind"] == "mtpc":
                m = r.mtpc(e["binary"], mem_steps, memory=True, extra=e.get("extra", ()))
                e["tracked"] = max(x["measured_peak_bytes"] for x in m["records"])
            else:
                m = r.peer(init, e["variant"], mem_steps, memory=True)
                e["tracked"] = m.get("device_peak_bytes")
            e["rss"] = m.get(rss_key)
        e["step"], e["cpu_step"] = median(e["wall"]), median(e["cpu"])


def section_step(args, b, r, out):
    """mtpc without a strategy against the model as a PyTorch user writes it
    today: eager with SDPA, torch.compile, torch.compile with the activation
    memory budget; model M (dropout 0) and the wider model W."""
    quick = args.quick
    key = "cpu_step" if cpu_time(args) else "step"
    aten = {"pointwise": "aten"}
    models = [("M", model_m(args, {}, dropout=0.0), model_m(args, {}, dropout=0.0, backbone=aten)),
              ("W", model_w(args, {}), model_w(args, {}, backbone=aten))]
    results = {}
    out.append("### The step program against the 2026 PyTorch peers\n")
    out.append("No strategy (`checkpoint = none`, `gfm = none`, `dgfg = none`, `clip = none`), "
               "dropout 0, fp32. Model M: 12 layers, hidden 64, seq 128, batch 8, tasks at 3, 6, "
               "9, 12. Model W: 6 layers, hidden 256, ffn 1024, seq 256, batch 4, tasks at 2, 2, "
               "6, 6. The peers start from the binary's `--dump-init` state; `budget` is "
               "`torch._functorch.config.activation_memory_budget`; compilation runs before the "
               "measured steps. mtpc's attention kind: %s. RSS above post-init with glibc "
               "`MALLOC_MMAP_THRESHOLD_=%s` (both sides); step time as in the memory section "
               "(%s time, %s thread(s)).\n"
               % (", ".join("%s %s" % (n, b.plan(t)[0]["attention"]) for n, t, _ in models),
                  MMAP_THRESHOLD, "CPU" if key == "cpu_step" else "wall",
                  args.threads or "LibTorch's"))
    for label, text, aten_text in models:
        binary = b.build(text)
        aten_binary = b.build(aten_text)
        plan, _ = b.plan(text)
        init = os.path.join(args.work, "init-step-" + label)
        shutil.rmtree(init, ignore_errors=True)
        r.mtpc(binary, 0, extra=["--dump-init", init])
        entries = [{"name": "mtpc none", "kind": "mtpc", "binary": binary, "extra": [],
                    "predicted": plan["plan"]["planned_peak_bytes"] if "plan" in plan
                    else plan["peak"]["bytes"]},
                   {"name": "mtpc none, --cosine-every 0", "kind": "mtpc", "binary": binary,
                    "extra": ["--cosine-every", "0"], "predicted": None},
                   # The fused pointwise kernels off: ATen's norm, GELU and linear.
                   {"name": "mtpc none, pointwise aten", "kind": "mtpc", "binary": aten_binary,
                    "extra": [], "predicted": planned_peak(b.plan(aten_text)[0])}]
        entries += [{"name": n, "kind": "peer", "variant": v} for n, v in STEP_PEERS]
        runs, steps, mem_steps = (2, 4, 2) if quick else (3, 6, 3)
        log("step %s: %d configurations, %d runs of %d steps" % (label, len(entries), runs, steps))
        measure(r, entries, init, runs, steps, mem_steps, "rss_above_base")
        by = {e["name"]: e for e in entries}
        sd, co = by["peer sdpa (eager)"], by["peer torch.compile"]
        rows = []
        for e in entries:
            rows.append([e["name"], fmt_bytes(e.get("predicted")),
                         fmt_bytes(e["tracked"]) if e.get("tracked") is not None else "—",
                         fmt_bytes(e["rss"]),
                         fmt_ratio(e["rss"] / sd["rss"]) if e["rss"] and sd["rss"] else "—",
                         "%.0f (%.0f–%.0f)" % (1e3 * e["cpu_step"], 1e3 * min(e["cpu"]),
                                               1e3 * max(e["cpu"])),
                         "%.0f" % (1e3 * e["step"]),
                         fmt_ratio(e[key] / sd[key]), fmt_ratio(e[key] / co[key])])
        out.append("\n#### Model %s\n" % label)
        out.append(table(["configuration", "predicted peak", "tracked peak (mtpc)",
                          "RSS above post-init", "RSS / sdpa", "CPU ms/step", "wall ms/step",
                          "time / sdpa", "time / compile"], rows))
        mn = by["mtpc none"]
        out.append("\nmtpc none against eager SDPA: **%s** RSS, **%s** step time; against "
                   "torch.compile: **%s** step time (targets: ≤ 1.0×, ≤ 0.9×, ≤ 1.0×).\n"
                   % (fmt_ratio(mn["rss"] / sd["rss"]) if sd["rss"] else "—",
                      fmt_ratio(mn[key] / sd[key]), fmt_ratio(mn[key] / co[key])))
        results[label] = {e["name"]: {k: v for k, v in e.items() if k != "binary"}
                          for e in entries}
    return results


def section_load(args, b, r, out):
    """Step time beside one other CPU-bound process: mtpc at its default
    (--threads auto), at LibTorch's count pinned and at one thread, against
    eager SDPA at LibTorch's default and at one thread; model M."""
    text = model_m(args, {}, dropout=0.0)
    binary = b.build(text)
    init = os.path.join(args.work, "init-load")
    shutil.rmtree(init, ignore_errors=True)
    r.mtpc(binary, 0, extra=["--dump-init", init])
    # Enough steps that auto's probes (the warm-up, then 2 steps at each
    # count) are a minority: the median is its settled count.
    steps = 16 if args.quick else 24
    cores = os.cpu_count()
    runs = [("mtpc none", 0), ("mtpc none", cores), ("mtpc none", 1),
            ("peer sdpa (eager)", 0), ("peer sdpa (eager)", 1)]
    wall = {}
    saved = args.threads
    try:
        for loaded in (False, True):
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if loaded else None
            try:
                time.sleep(0.5)
                for who, threads in runs:
                    args.threads = threads
                    if who.startswith("mtpc"):
                        m = r.mtpc(binary, steps)
                        wall[(who, threads, loaded)] = median(step_times(m["records"]))
                    else:
                        p = r.peer(init, "sdpa", steps)
                        wall[(who, threads, loaded)] = median(p["step_time_s"][1:])
            finally:
                if hog:
                    hog.kill()
                    hog.wait()
    finally:
        args.threads = saved
    rows = []
    for who, threads in runs:
        quiet, busy = wall[(who, threads, False)], wall[(who, threads, True)]
        label = ("auto (the default)" if who.startswith("mtpc") else "LibTorch's (%d)" % cores) \
            if threads == 0 else ("%d, pinned" % threads if threads > 1 else "1")
        rows.append([who, label, "%.1f" % (1e3 * quiet), "%.1f" % (1e3 * busy),
                     fmt_ratio(busy / quiet)])
    out.append("### Under load: one other CPU-bound process\n")
    out.append("Model M, dropout 0, no strategy; wall ms per step (median of %d steps, the first "
               "dropped), quiet and beside a Python busy loop; mtpc at its default thread count "
               "(`--threads auto`), at LibTorch's pinned and at one thread, the peer at "
               "LibTorch's default and at one thread.\n" % steps)
    out.append(table(["configuration", "threads", "quiet ms/step", "loaded ms/step", "slowdown"],
                     rows))
    return {"%s/%s/%s" % k: v for k, v in wall.items()}


def section_plan(args, b, r, out):
    res = {}
    test = os.path.join(ROOT, "build", "unittests", "compiler", "MTPCCompilerTests")
    if os.path.exists(test):
        p = run([test, "--gtest_filter=PlanMemory.GapSurvey"], timeout=900,
                env={"MTPC_PLAN_SURVEY": "1"})
        gaps, solve_us, nodes, proven = [], [], [], 0
        summary = [l for l in p.stdout.splitlines()
                   if l.startswith("gap survey:") or l.startswith("the heuristic alone:")]
        for line in p.stdout.splitlines():
            if not line.startswith("gap-survey"):
                continue
            kv = dict(x.split("=", 1) for x in line.split()[1:] if "=" in x)
            s, x = float(kv["solver_s"]), float(kv["exact_s"])
            gaps.append(s / x - 1 if x > 0 else (0.0 if s == 0 else float("inf")))
            solve_us.append(float(kv["solve_us"]))
            nodes.append(int(kv["nodes"]))
            proven += kv["optimal"] == "1"
        gaps.sort()
        n = len(gaps)

        def pct(q):
            return gaps[min(n - 1, int(q * n))] if n else float("nan")
        exact_hits = sum(1 for g in gaps if g <= 1e-9)
        out.append("### Plan quality: the joint solver against the exhaustive optimum\n")
        out.append("`unittests/compiler/PlanMemoryTest.cpp` `GapSurvey`: 2–6-layer "
                   "two-task models (every keep / recompute / offload assignment enumerated "
                   "once per model, up to 3^14), budgets every 5% of the reachable range from "
                   "the smallest peak any plan has, a 40 GB/s and a 4 GB/s host link. Gap = "
                   "solver's added time / optimum's − 1. The solver: the heuristic, then the "
                   "branch and bound from it (proven = it searched its whole tree).\n")
        out.append(table(["instances", "solver optimal", "proven by the search", "median gap",
                          "worst gap", "solve time (median / worst)", "nodes (median / worst)"],
                         [[n, "%d (%.0f%%)" % (exact_hits, 100 * exact_hits / max(n, 1)), proven,
                           "%.2f%%" % (100 * pct(0.5)),
                           "%.2f%%" % (100 * gaps[-1]) if n else "—",
                           "%.1f / %.1f ms" % (median(solve_us) / 1e3, max(solve_us) / 1e3)
                           if n else "—",
                           "%d / %d" % (median(nodes), max(nodes)) if n else "—"]]))
        for l in summary:
            out.append("\n`%s`\n" % l)
        res["gap"] = {"n": n, "optimal": exact_hits, "median": pct(0.5), "p90": pct(0.9),
                      "worst": gaps[-1] if n else None}
    else:
        out.append("(the compiler's unit tests are not built: no solver/oracle survey)")
    sizes = [(125, 4), (1000, 16)] if args.quick else [(125, 4), (250, 4), (500, 8), (1000, 4), (1000, 16)]
    runs = 2 if args.quick else 3
    rows = []
    for layers, tasks in sizes:
        with tempfile.NamedTemporaryFile("w", suffix=".mtp", delete=False) as f:
            f.write(plan_scale.spec(layers, tasks))
        ts = []
        for _ in range(runs):
            start = time.perf_counter()
            p = run([args.mtpc, "plan", f.name, "--format=json"])
            ts.append(time.perf_counter() - start)
        os.unlink(f.name)
        pl = json.loads(p.stdout)["plan"]
        rows.append([layers, tasks, "%.3f s" % median(ts), "%.3f–%.3f" % (min(ts), max(ts)),
                     fmt_bytes(pl["keep_peak_bytes"]), fmt_bytes(pl["planned_peak_bytes"]),
                     "%.1f ms" % (1e3 * pl["added_seconds"]),
                     "%.1f ms" % (1e3 * pl["uniform_added_seconds"]),
                     fmt_ratio(pl["added_seconds"] / pl["uniform_added_seconds"])
                     if pl["uniform_added_seconds"] else "—"])
        res["plan_%d_%d" % (layers, tasks)] = median(ts)
    out.append("\n### Compile (plan) time against size\n")
    out.append("`mtpc plan --format=json` (parse, Sema, MLIRGen, step expansion, the joint plan, "
               "memory analysis) on bench/plan_scale.py's generated spec (A100 40 GB, bf16, "
               "seq 512, activations far over the budget), median of %d runs. Added time is the "
               "cost model's per-step estimate.\n" % runs)
    out.append(table(["layers", "tasks", "plan time", "range", "keep-everything peak",
                      "planned peak", "plan's added time", "uniform's added time",
                      "plan / uniform"], rows))
    if b.build_seconds:
        out.append("\n`mtpc build` (plan, EmitC, C++ compile and link of the generated project) "
                   "took %.1f s median over the %d binaries built in this run.\n"
                   % (median(b.build_seconds), len(b.build_seconds)))
    return res


def final_loss(recs, last=10):
    tail = recs[-last:]
    tasks = list(tail[0]["loss"].keys())
    per = {t: statistics.mean(x["loss"][t] for x in tail) for t in tasks}
    return per, statistics.mean(per.values())


def section_compress(args, b, r, out):
    steps = 60 if args.quick else 200
    seeds = [0] if args.quick else [0, 1]
    binary = b.build(model_s(args, {}, steps=steps))
    settings = [("fp32 all-reduce", ["--no-compress"]),
                ("GSC: top-k 15%, 8-bit, block 256, residual 0.8 (the source's)",
                 ["--compress", "--compress-topk", "0.15", "--compress-block", "256",
                  "--compress-decay", "0.8"])]
    if not args.quick:
        settings += [("top-k 5%, block 256", ["--compress", "--compress-topk", "0.05"]),
                     ("top-k 1%, block 256", ["--compress", "--compress-topk", "0.01"]),
                     ("top-k 1%, block 1024", ["--compress", "--compress-topk", "0.01",
                                               "--compress-block", "1024"]),
                     ("top-k 0.1%, block 1024", ["--compress", "--compress-topk", "0.001",
                                                 "--compress-block", "1024"])]
    res, rows = {}, []
    for name, flags in settings:
        sent, unc, finals = [], [], []
        for seed in seeds:
            recs = r.mtpc(binary, steps, extra=["--nproc", "2", "--batch-size", "16",
                                                "--seed", str(seed)] + flags)["records"]
            sent.append(statistics.mean(x["bytes_sent"] for x in recs))
            unc.append(statistics.mean(x["bytes_sent_uncompressed"] for x in recs))
            finals.append(final_loss(recs)[1])
        res[name] = {"bytes": statistics.mean(sent), "uncompressed": statistics.mean(unc),
                     "final": statistics.mean(finals), "finals": finals}
    base = res[settings[0][0]]
    for name, _ in settings:
        e = res[name]
        rows.append([name, "%.0f" % e["bytes"], "%.1f%%" % (100 * (1 - e["bytes"] / base["bytes"])),
                     "%.4f" % e["final"], "%+.2f%%" % (100 * (e["final"] / base["final"] - 1)),
                     " ".join("%.4f" % f for f in e["finals"])])
    out.append("### Compressed gradient exchange (2 processes, loopback)\n")
    out.append("Model S (4 layers, hidden 64, seq 32, three tasks), global batch 16 (8 per rank), "
               "%d steps, seeds %s. Bytes: what rank 0 hands to the collectives per step (mean); "
               "final loss: mean task loss over the last 10 steps, averaged over the seeds.\n"
               % (steps, ", ".join(map(str, seeds))))
    out.append(table(["setting", "bytes / step", "fewer bytes than fp32", "final loss",
                      "vs fp32", "per seed"], rows))
    return res


def section_scope(args, b, r, out):
    counts = [1, 2, 4, 8]
    res, rows = {}, []
    for scope in ("features", "params(layers = 1)"):
        for n in counts:
            tasks = [("t%d" % i, "tag(labels = %d)" % (5 + i), "from layer %d" % (8 - i % 4))
                     for i in range(n)]
            binary = b.build(model_s(args, {"gradient_scope": scope}, steps=20, tasks=tasks,
                                     layers=8, seq=64))
            m = r.mtpc(binary, 6)
            recs = m["records"]
            t = m["cpu_step_s"] if cpu_time(args) else median(step_times(recs))
            res[(scope, n)] = (t, max(x["measured_peak_bytes"] for x in recs))
    f1 = res[("features", 1)]
    for scope in ("features", "params(layers = 1)"):
        for n in counts:
            t, m = res[(scope, n)]
            rows.append([scope, n, "%.1f" % (1e3 * t), fmt_ratio(t / f1[0]), fmt_bytes(m),
                         fmt_ratio(m / f1[1])])
    out.append("### Cost against the number of tasks, per gradient scope\n")
    out.append("8 layers, hidden 64, seq 64, batch 8; n tag tasks at layers 8, 7, 6, 5, …; "
               "GFM, DGFG, clip off; the tracking allocator's peak; step time: %s over 5 steps "
               "after the first.\n" % ("CPU time" if cpu_time(args) else "median wall time"))
    out.append(table(["scope", "tasks", "step ms", "time / features×1", "tracked peak",
                      "peak / features×1"], rows))
    return {"%s/%d" % k: v for k, v in res.items()}


ABLATION = [
    ("plain weighted sum", {}),
    ("+ GFM (keep 0.3)", {"gfm": "{ keep = 0.3 }"}),
    ("+ DGFG (hidden 16)", {"dgfg": "{ hidden = 16 }"}),
    ("+ per-task clip (1.0)", {"clip": "per_task(max_norm = 1.0)"}),
    ("+ per-task LR", {"lr": "per_task { default = cosine(1e-3, warmup = 20)  "
                              "topic = cosine(3e-3, warmup = 20) }"}),
    ("all four", {"gfm": "{ keep = 0.3 }", "dgfg": "{ hidden = 16 }",
                  "clip": "per_task(max_norm = 1.0)",
                  "lr": "per_task { default = cosine(1e-3, warmup = 20)  "
                        "topic = cosine(3e-3, warmup = 20) }"}),
]


def section_ablation(args, b, r, out):
    steps = 200
    seeds = [0, 1, 2] if not args.quick else [0]
    related = [0.2, 0.8] if not args.quick else [0.5]
    variants = ABLATION if not args.quick else [ABLATION[0], ABLATION[-1]]
    res = {}
    for name, strat in variants:
        binary = b.build(model_s(args, strat, steps=steps))
        for rel in related:
            finals = []
            for seed in seeds:
                recs = r.mtpc(binary, steps, extra=["--seed", str(seed),
                                                    "--relatedness", str(rel)])["records"]
                finals.append(final_loss(recs))
            res[(name, rel)] = finals
    tasks = list(res[(variants[0][0], related[0])][0][0].keys())
    out.append("### Quality ablation: the gradient pipeline's parts against the plain sum\n")
    out.append("Model S, %d steps, seeds %s, synthetic relatedness %s (the share of records "
               "whose labels all derive from one shared feature). Final loss = mean over the last "
               "10 steps; ± the standard deviation over the seeds; Δ = change of the mean task "
               "loss against the plain weighted sum at the same relatedness (negative is better).\n"
               % (steps, ", ".join(map(str, seeds)), " and ".join(map(str, related))))
    rows = []
    for rel in related:
        plain = statistics.mean(f[1] for f in res[(variants[0][0], rel)])
        for name, _ in variants:
            finals = res[(name, rel)]
            cells = []
            for t in tasks:
                v = [f[0][t] for f in finals]
                cells.append("%.3f ± %.3f" % (statistics.mean(v), statistics.pstdev(v)))
            mean = statistics.mean(f[1] for f in finals)
            rows.append([rel, name] + cells + ["%.4f" % mean, "%+.2f%%" % (100 * (mean / plain - 1))])
    out.append(table(["relatedness", "variant"] + tasks + ["mean", "Δ vs plain"], rows))
    return {"%s@%s" % k: v for k, v in res.items()}


DYNBATCH = "schedule(start = 8, max = 64, rate = 0.05, ramp = 150, decay = 0.98, every = 25, floor = 8)"


def section_dynbatch(args, b, r, out):
    """D15: the dynamic batch (the source's shape at a small scale: ×8 over
    140 steps, then ×0.98 every 25) against fixed batches of its smallest and
    largest size, on model S: held-out loss at the end, records seen, time,
    the measured peak against the plan's."""
    steps = 100 if args.quick else 250
    seeds = [0] if args.quick else [0, 1, 2]
    # The dynamic run first: a fixed batch of 64 over as many records as it
    # read (its metrics' batch_size) is the fair comparison.
    rows, res = [], {}

    def measure(name, strat, gb, n):
        binary = b.build(model_s(args, strat, steps=n, global_batch=gb))
        runs = []
        for seed in seeds:
            o = r.mtpc(binary, n, extra=["--seed", str(seed), "--eval-data", "synthetic:512"])
            recs, ev = o["records"], o["evals"][-1]
            losses = [v["loss"] for v in ev["eval"].values()]
            runs.append({"eval_loss": statistics.mean(losses),
                         "records": sum(x.get("batch_size", 0) for x in recs),
                         "seconds": sum(x["step_time_s"] for x in recs),
                         "peak": max(x["measured_peak_bytes"] for x in recs),
                         "predicted": recs[0]["predicted_peak_bytes"]})
        res[name] = runs
        mean = lambda k: statistics.mean(x[k] for x in runs)
        rows.append([name, "%.4f ± %.4f" % (mean("eval_loss"),
                                             statistics.pstdev(x["eval_loss"] for x in runs)),
                     "%d" % mean("records"), "%.1f s" % mean("seconds"),
                     fmt_bytes(mean("peak")), "%+.1f%%" % (100 * (mean("peak") / mean("predicted") - 1))])
        return runs

    dynamic = measure("dynamic 8 → 64 → ×0.98/25 steps", {"dynamic_batch": DYNBATCH}, None, steps)
    same = round(dynamic[0]["records"] / 64)
    measure("fixed batch 8", {}, None, steps)
    measure("fixed batch 64 (8 micro-batches)", {}, 64, steps)
    measure("fixed batch 64, the dynamic run's records (%d steps)" % same, {}, 64, same)
    out.append("### Dynamic batch (D15)\n")
    out.append("Model S, %d steps, seeds %s; `dynamic_batch = %s` (micro batch 8). Held-out "
               "loss: the mean task loss on 512 held-out synthetic records after the last step "
               "(`--eval-data synthetic:512`); records seen and time summed over the steps; "
               "peak: the tracked peak over the steps against the plan's prediction.\n"
               % (steps, ", ".join(map(str, seeds)), DYNBATCH))
    out.append(table(["configuration", "held-out loss", "records seen", "time", "tracked peak",
                      "vs predicted"], rows))
    return res


def section_saps(args, b, r, out):
    """D12: SAPS's sparse updates against dense ones. Memory: model M (and M
    with a 32k vocabulary, where the embeddings weigh) dense, at 3% and 10%:
    the tracked peak against the plan's, the plan's parameter state, the step
    time. Quality: a GPT-2-shaped backbone pre-trained densely, exported,
    then fine-tuned on other tasks densely, with SAPS at 3% and 10%, and
    with the backbone frozen (heads only), several seeds: held-out loss."""
    key_steps = 4 if args.quick else 6
    mem_rows, res = [], {"memory": {}, "finetune": {}}
    variants = [("M", {}), ("M, vocab 32768", {"vocab": 32768})]
    for label, bb in variants:
        dense = None
        for name, strat in [("dense", {}), ("saps 3% (source)", {"saps": "source"}),
                            ("saps 10%", {"saps": "top(fraction = 0.1)"})]:
            text = model_m(args, strat, dropout=0.0, backbone=bb)
            plan, _ = b.plan(text)
            o = r.mtpc(b.build(text), key_steps)
            recs = o["records"]
            peak = max(x["measured_peak_bytes"] for x in recs)
            pred = max(x["predicted_peak_bytes"] for x in recs)
            step = median([x["step_time_s"] for x in recs[1:]])
            state = plan["peak"]["optimizer"]
            e = {"peak": peak, "predicted": pred, "step_s": step, "optimizer": state,
                 "params": plan["peak"]["parameters"]}
            if dense is None:
                dense = e
            res["memory"]["%s / %s" % (label, name)] = e
            mem_rows.append(["%s, %s" % (label, name), fmt_bytes(e["params"]),
                             fmt_bytes(state), fmt_bytes(peak),
                             "%+.1f%%" % (100 * (peak / pred - 1)),
                             fmt_ratio(peak / dense["peak"]),
                             "%.1f ms" % (1e3 * step), fmt_ratio(step / dense["step_s"])])
    out.append("### SAPS (D12)\n")
    out.append("Memory: model M (dropout 0, fp32, batch 8) and M with a 32 768-token vocabulary, "
               "%d steps each (step 0 re-ranks: the run's peak is a re-ranking step's). "
               "`optimizer state`: the plan's — AdamW's moments, or SAPS's compact state (index, "
               "gradient, moments and step count per selected entry, 24 B) for the backbone plus "
               "the heads' moments; the backbone's dense gradients are folded away as autograd "
               "makes them. `tracked peak`: the runtime's tracking allocator over the steps; "
               "`vs dense`: against the same model's dense run; step time: the median after "
               "the first step.\n" % key_steps)
    out.append(table(["model, updates", "weights", "optimizer state", "tracked peak",
                      "vs predicted", "peak vs dense", "step", "step vs dense"], mem_rows))

    # Fine-tuning: pre-train a GPT-2-shaped backbone densely, export it, then
    # fine-tune it on other tasks.
    seeds = [0] if args.quick else [0, 1, 2]
    pre_steps, ft_steps = (150, 80) if args.quick else (300, 150)
    m = {"layers": 4, "hidden": 64, "heads": 4, "ffn": 256, "vocab": 512, "seq": 32,
         "positions": 32, "dropout": 0.1}
    base = {"checkpoint": "none", "offload": "none", "gfm": "none", "dgfg": "none",
            "clip": "none", "lr": "cosine(1e-3, warmup = 20)"}
    pre_text = spec_text("bench_pre", m, [("pos", "tag(labels = 12)", "from layer 2"),
                                          ("topic", "classify(classes = 4)", "from pooled")],
                         base, budget_block(args, 2 << 30),
                         {"steps": pre_steps, "seed": 3, "log_every": 1},
                         backbone_line="backbone gpt2 { " + "  ".join(
                             "%s = %s" % kv for kv in m.items()) + " }")
    pretrained = os.path.join(args.work, "saps-pretrained")
    shutil.rmtree(pretrained, ignore_errors=True)
    r.mtpc(b.build(pre_text), pre_steps, extra=["--export", pretrained])
    ft_tasks = [("chunk", "tag(labels = 8)", "from layer 4"),
                ("ner", "tag(labels = 9)", "from layer 3"),
                ("mood", "classify(classes = 3)", "from pooled")]
    ft_rows = []
    configs = [("dense", {}, ""), ("saps 3%", {"saps": "top(fraction = 0.03, every = 50)"}, ""),
               ("saps 10%", {"saps": "top(fraction = 0.1, every = 50)"}, ""),
               ("backbone frozen (heads only)", {}, "  freeze = all")]
    for name, strat, extra in configs:
        s = dict(base, lr="cosine(5e-4, warmup = 10)")
        s.update(strat)
        text = spec_text("bench_ft", {}, ft_tasks, s, budget_block(args, 2 << 30),
                         {"steps": ft_steps, "seed": 5, "log_every": 1},
                         backbone_line='backbone pretrained("%s") { seq = 32  dropout = 0.1%s }'
                         % (pretrained, extra))
        binary = b.build(text)
        runs = []
        for seed in seeds:
            o = r.mtpc(binary, ft_steps, extra=["--seed", str(seed), "--eval-data",
                                                "synthetic:512"])
            ev = o["evals"][-1]["eval"]
            runs.append({"eval_loss": statistics.mean(v["loss"] for v in ev.values()),
                         "peak": max(x["measured_peak_bytes"] for x in o["records"])})
        res["finetune"][name] = runs
        mean = statistics.mean(x["eval_loss"] for x in runs)
        ft_rows.append([name, "%.4f ± %.4f" % (mean, statistics.pstdev(
            x["eval_loss"] for x in runs)), fmt_bytes(statistics.mean(x["peak"] for x in runs))])
    dense_loss = statistics.mean(x["eval_loss"] for x in res["finetune"]["dense"])
    for row, (name, _, _) in zip(ft_rows, configs):
        row.append(fmt_ratio(statistics.mean(x["eval_loss"] for x in res["finetune"][name])
                             / dense_loss))
    out.append("\nFine-tuning: a GPT-2-shaped backbone (4 layers, hidden 64, vocab 512, seq 32) "
               "pre-trained densely for %d steps on `pos` (tag, 12) and `topic` (classify, 4), "
               "exported (`--export`), then fine-tuned from `pretrained(DIR)` for %d steps on "
               "other tasks — `chunk` (tag, 8) at layer 4, `ner` (tag, 9) at layer 3, `mood` "
               "(classify, 3), fresh heads — seeds %s. Held-out loss: the mean task loss on 512 "
               "held-out synthetic records after the last step. SAPS re-ranks every 50 steps. "
               "The source claims the top 3%% keeps 99.2%% of quality at 12%% of the memory.\n"
               % (pre_steps, ft_steps, ", ".join(map(str, seeds))))
    out.append(table(["fine-tuning", "held-out loss", "tracked peak", "loss vs dense"],
                     ft_rows))
    return res


def section_forgetting(args, b, r, out):
    """D14: two-phase continual learning on synthetic tasks — phase A trains
    `pos` and `topic`, phase B `chunk` and `ner` — and A's held-out metrics
    before and after B (forgetting), plain and with EWC at several λ, seeds.
    The source: forgetting 38% → 4.7% with its adapters (D13): the
    'adapters' rows (a trainable base; both, with EWC; a frozen base)."""
    steps = 150 if args.quick else 300
    seeds = [0] if args.quick else [0, 1, 2]
    m = {"layers": 4, "hidden": 64, "heads": 4, "ffn": 256, "vocab": 512, "seq": 32,
         "dropout": 0.1}
    tasks = [("pos", "tag(labels = 12)", "from layer 2"),
             ("topic", "classify(classes = 4)", "from pooled"),
             ("chunk", "tag(labels = 8)", "from layer 4"),
             ("ner", "tag(labels = 9)", "from layer 3")]
    metric = {"pos": "token_accuracy", "topic": "accuracy", "chunk": "token_accuracy",
              "ner": "token_accuracy"}
    first, second = ["pos", "topic"], ["chunk", "ner"]
    adapters = "npd(bottleneck = 16, separation = 0.1)"
    configs = [("plain", None, None, ""), ("ewc λ 1e4 (source)", "source", None, ""),
               ("ewc λ 1e6", "on(lambda = 1e6, batches = 8)", None, ""),
               ("ewc λ 1e8", "on(lambda = 1e8, batches = 8)", None, ""),
               ("adapters (bottleneck 16)", None, adapters, ""),
               ("adapters + ewc λ 1e6", "on(lambda = 1e6, batches = 8)", adapters, ""),
               ("adapters, base frozen", None, adapters, "  freeze = all")]
    # One adapter for every task (declared related), fixed or split where
    # the tasks' gradients on it are measured in conflict (D14's isolated
    # groups): every 50 steps and at phase A's end.
    configs = [c + ((),) for c in configs]
    related = [("pos", t, 0.9) for t in ("topic", "chunk", "ner")]
    for name, rg in (("one shared adapter", ""), ("one shared adapter, regroup 50",
                                                  ", regroup = 50")):
        configs.append((name, None, "npd(bottleneck = 16, separation = 0.1, share = 0.5%s)"
                        % rg, "", related))
    rows, res = [], {}
    for name, ewc, adapt, extra, corr in configs:
        strat = {"checkpoint": "none", "offload": "none", "gfm": "none", "dgfg": "none",
                 "clip": "none", "lr": "constant(3e-3)"}
        if ewc:
            strat["ewc"] = ewc
        if adapt:
            strat["adapters"] = adapt
        train = {"seed": 7, "log_every": 1,
                 "phases": "sequence(phase(%s, steps = %d), phase(%s, steps = %d))"
                           % (", ".join(first), steps, ", ".join(second), steps)}
        text = spec_text("bench_cl", m, tasks, strat, budget_block(args, 2 << 30), train,
                         correlate=corr, backbone_line="backbone transformer { " + "  ".join(
                             "%s = %s" % kv for kv in m.items()) + extra + " }")
        binary = b.build(text)
        runs = []
        for seed in seeds:
            # Unrelated tasks (each its own token map): what B learns is no
            # use to A, so B's updates can undo A's.
            o = r.mtpc(binary, 2 * steps, extra=["--seed", str(seed), "--eval-data",
                                                 "synthetic:512", "--relatedness", "0"])
            ev = {e["step"]: e["eval"] for e in o["evals"]}
            before, after = ev[steps], ev[2 * steps]
            drops = [(before[t][metric[t]] - after[t][metric[t]]) / before[t][metric[t]]
                     for t in first]
            runs.append({"forgetting": statistics.mean(drops),
                         "a_before": statistics.mean(before[t][metric[t]] for t in first),
                         "a_after": statistics.mean(after[t][metric[t]] for t in first),
                         "b_after": statistics.mean(after[t][metric[t]] for t in second),
                         "peak": max(x["measured_peak_bytes"] for x in o["records"]),
                         "predicted": max(x["predicted_peak_bytes"] for x in o["records"])})
        res[name] = runs
        mean = lambda k: statistics.mean(x[k] for x in runs)
        rows.append([name, "%.3f → %.3f" % (mean("a_before"), mean("a_after")),
                     "%.1f%% ± %.1f" % (100 * mean("forgetting"),
                                        100 * statistics.pstdev(x["forgetting"] for x in runs)),
                     "%.3f" % mean("b_after"), fmt_bytes(mean("peak")),
                     "%+.1f%%" % (100 * (mean("peak") / mean("predicted") - 1))])
    out.append("### Forgetting: two phases, EWC (D14) and adapters (D13)\n")
    out.append("A transformer (4 layers, hidden 64, vocab 512, seq 32, dropout 0.1), %d steps of "
               "phase A (`pos` tag 12 at layer 2, `topic` classify 4 pooled), then %d of phase B "
               "(`chunk` tag 8 at layer 4, `ner` tag 9 at layer 3), constant lr 3e-3, unrelated tasks "
               "(`--relatedness 0`: each task its own token map), seeds %s. "
               "A's metric: the mean of pos's token accuracy and topic's accuracy on 512 "
               "held-out records, at the end of phase A and of phase B; forgetting: its "
               "relative drop. B's metric: chunk's and ner's token accuracy at the end. EWC's "
               "Fisher on 8 batches at phase A's end. Adapters: bottleneck 16 per task at its "
               "tap, gate separation 0.1; 'base frozen' trains heads and adapters alone "
               "(`freeze = all`) on the random initial backbone. 'One shared adapter': every "
               "task declared related (`correlate pos ~ X = 0.9`, `share = 0.5`), so all four "
               "read pos's adapter; with `regroup = 50` the group splits where the tasks' "
               "gradients on it, measured every 50 steps and at phase A's end, fall below 0.5. "
               "The source claims forgetting 38%% → 4.7%% with its adapters.\n"
               % (steps, steps, ", ".join(map(str, seeds))))
    out.append(table(["configuration", "A's metric (before → after B)", "forgetting",
                      "B's metric", "tracked peak", "vs predicted"], rows))
    return res


def partial_blocks(plan):
    """Blocks the plan runs at tensor grain: projection units planned
    recompute outside every checkpoint region."""
    inside = set()
    for first, last in plan["plan"]["regions"]:
        inside.update(range(first, last + 1))
    blocks = set()
    for u in plan["units"]:
        if u["decision"] == "recompute" and u["unit"] in ("qkv", "mlp_up"):
            block = 2 * u["layer"] - (1 if u["unit"] == "qkv" else 0)
            if block not in inside:
                blocks.add(block)
    return len(blocks)


PARETO_PEERS = [("peer sdpa (eager)", "sdpa"), ("peer torch.compile", "compile"),
                ("peer torch.compile, budget 0.5", "compile_budget50"),
                ("peer torch.compile, budget 0.3", "compile_budget30")]


def section_pareto16(args, b, r, out):
    """section_pareto at bf16 (autocast on both sides), model M: the
    planner's tensor grain under autocast against torch.compile's budget."""
    return section_pareto(args, b, r, out, precision="bf16")


def section_pareto(args, b, r, out, precision="fp32"):
    """The planner against torch.compile's activation memory budget: each
    compile peer is measured, then mtpc is planned to that peer's measured
    peak (RSS above post-init: the activations and gradients both sides add
    to the parameters and AdamW state they allocate up front) and measured
    beside it. Also mtpc keeping everything, uniform(every = 1), a plan at
    uniform's peak and one at a third of keep-everything's activations."""
    quick = args.quick
    key = "cpu_step" if cpu_time(args) else "step"
    models = [("M", lambda strategy, mem=16 << 30: model_m(args, strategy, memory=mem,
                                                          dropout=0.0, precision=precision))]
    if precision == "fp32":
        models.append(("W", lambda strategy, mem=16 << 30: model_w(args, strategy, memory=mem)))
    results = {}
    out.append("### Pareto: memory against time, mtpc's plans and the PyTorch peers%s\n"
               % (" (bf16)" if precision != "fp32" else ""))
    out.append("Dropout 0, " + precision + ", %s time per step, %s intra-op thread(s). `mtpc @ X` is "
               "planned (`checkpoint = auto`, offload off: on a CPU the host is the same "
               "memory) to a budget of the parameters and AdamW state plus X's measured peak: "
               "the RSS above the level after a first step (every kernel paged in, the "
               "allocators grown, gradients freed with the update — on both sides), over the "
               "later steps; mtpc's is measured the same way. Targets "
               "(issue #17): at each compile peer's peak, ≤ 0.9× its step time; at uniform's "
               "peak, at most half of uniform's added time; at ⅓ of the activations, ≤ 1.15× "
               "the no-strategy step. `(measured costs)`: planned with `--costs` from the "
               "binary's `--profile-units` on this machine (`mtpc profile`), not the roofline. "
               "`predicted step`: the plan's predicted step (roofline or measured costs) against "
               "the measured one.\n"
               % ("CPU" if key == "cpu_step" else "wall", args.threads or "LibTorch's"))
    for label, make in models:
        keep_text = make({})
        keep_plan, _ = b.plan(keep_text)
        resident = keep_plan["peak"]["parameters"] + keep_plan["peak"]["optimizer"]
        keep_peak = keep_plan["peak"]["bytes"]
        binary = b.build(keep_text)
        init = os.path.join(args.work, "init-pareto-%s-%s" % (label, precision))
        shutil.rmtree(init, ignore_errors=True)
        r.mtpc(binary, 0, extra=["--dump-init", init])
        runs, steps, mem_steps = (2, 4, 3) if quick else (3, 6, 4)
        # The segments timed on this machine (mtpc profile's figures), for
        # the plans made with measured costs.
        costs = os.path.join(args.work, "costs-%s-%s.json" % (label, precision))
        run([binary, "--steps", "0", "--profile-units", costs] + r.threads())
        peers = [{"name": n, "kind": "peer", "variant": v} for n, v in PARETO_PEERS]
        for e in peers:
            m = r.peer(init, e["variant"], mem_steps, memory=True)
            e["rss"] = m.get("rss_warm_above")
        uni_text = make({"checkpoint": "uniform(every = 1)"})
        uni_plan, _ = b.plan(uni_text)
        mtpc = [{"name": "mtpc none", "text": keep_text},
                {"name": "mtpc uniform (every layer)", "text": uni_text},
                {"name": "mtpc @ uniform's peak",
                 "text": make({"checkpoint": "auto"}, uni_plan["plan"]["planned_peak_bytes"])},
                {"name": "mtpc @ ⅓ of the activations",
                 "text": make({"checkpoint": "auto"},
                              resident + (keep_peak - resident) // 3)}]
        for e in peers:
            if e["rss"]:
                mtpc.append({"name": "mtpc @ " + e["name"][5:] + "'s peak", "peer": e["name"],
                             "text": make({"checkpoint": "auto"}, resident + e["rss"])})
        # Each planned configuration again, planned with the measured costs.
        mtpc += [dict(e, name=e["name"] + " (measured costs)", plan_args=["--costs", costs])
                 for e in mtpc if e["name"].startswith("mtpc @")]
        entries = []
        for e in mtpc:
            plan, err = b.plan(e["text"], e.get("plan_args", ()))
            if plan is None:
                entries.append(dict(e, error=err))
                continue
            # The step each cost source predicts for this plan: its own, and
            # where the decisions do not depend on the costs (none, uniform)
            # the other source's too.
            preds = {plan["plan"].get("step_costs"): plan["plan"].get("step_seconds")}
            if not e["name"].startswith("mtpc @"):
                other, _ = b.plan(e["text"], ["--costs", costs])
                if other:
                    preds[other["plan"].get("step_costs")] = other["plan"].get("step_seconds")
            entries.append(dict(e, kind="mtpc", binary=b.build(e["text"], e.get("plan_args", ())),
                                budget=plan["budget"]["memory_bytes"],
                                predicted=plan["plan"]["planned_peak_bytes"],
                                step_pred=preds,
                                optimal=plan["plan"].get("search", {}).get("optimal"),
                                bound_gap=search_gap(plan),
                                partial=partial_blocks(plan),
                                regions=len(plan["plan"]["regions"])))
        live = [e for e in entries if "error" not in e] + peers
        log("pareto %s: %d configurations, %d runs of %d steps" % (label, len(live), runs, steps))
        measure(r, live, init, runs, steps, mem_steps, "rss_warm_above")
        by = {e["name"]: e for e in live}
        none, uni = by["mtpc none"], by.get("mtpc uniform (every layer)")
        rows = []
        errors = {"roofline": [], "measured": []}
        for e in entries + peers:
            if "error" in e:
                rows.append([e["name"], "does not fit"] + [""] * 8)
                continue
            step_cell = ""
            if e["kind"] == "mtpc":
                cells = []
                for src in ("roofline", "measured"):
                    p = e["step_pred"].get(src)
                    if p:
                        err = p / e[key] - 1
                        errors[src].append(err)
                        cells.append("%s %.0f (%+.0f%%)" % (src, 1e3 * p, 100 * err))
                step_cell = "; ".join(cells)
            vs = by.get(e.get("peer", ""))
            gap = (e["tracked"] / e["predicted"] - 1) if e.get("predicted") else None
            rows.append([e["name"],
                         fmt_bytes(e.get("predicted")) if e["kind"] == "mtpc" else "—",
                         "%+.1f%%" % (100 * gap) if gap is not None else "—",
                         fmt_bytes(e["rss"]),
                         "%.0f" % (1e3 * e[key]),
                         fmt_ratio(e[key] / none[key]),
                         ("%s RSS, %s time" % (fmt_ratio(e["rss"] / vs["rss"]),
                                               fmt_ratio(e[key] / vs[key]))) if vs else "—",
                         step_cell,
                         "%d partial, %d regions%s" % (
                             e["partial"], e["regions"],
                             "" if e["optimal"] else
                             " (not proven%s)" % ("; ≤ %.1f%% above the optimum" % (100 * e["bound_gap"])
                                                  if e["bound_gap"] is not None else ""))
                         if e["kind"] == "mtpc" else ""])
        out.append("\n#### Model %s\n" % label)
        out.append(table(["configuration", "predicted peak", "tracked vs predicted",
                          "RSS above the first step", "ms/step", "time / mtpc none",
                          "against the peer it is planned to",
                          "predicted step, ms (vs measured)", "plan"], rows))
        for src, errs in errors.items():
            if errs:
                out.append("\nStep predicted by the %s: %+.0f%% to %+.0f%% of the measured step "
                           "over %d configurations (target: within 10%%).\n"
                           % ({"roofline": "roofline (no profile)",
                               "measured": "measured costs"}[src],
                              100 * min(errs), 100 * max(errs), len(errs)))
        if uni and "mtpc @ uniform's peak" in by:
            at = by["mtpc @ uniform's peak"]
            added_uni, added_at = uni[key] - none[key], at[key] - none[key]
            out.append("\nAt uniform's peak: the plan adds %.0f ms, uniform %.0f ms (%s of "
                       "uniform's added time; target ≤ 0.5×).\n"
                       % (1e3 * added_at, 1e3 * added_uni,
                          fmt_ratio(added_at / added_uni) if added_uni > 0 else "—"))
        results[label] = {e["name"]: {k: v for k, v in e.items() if k not in ("binary", "text")}
                          for e in entries + peers}
    return results


def section_search(args, b, r, out):
    """C11: mtpc search over model M's family — layers 4..12, hidden
    64..256 by 64, the chunk task's tap 2..6, micro batch 4..24 by 4 (1080
    candidates) at 64 MiB: the time to plan all of it (both cores, one core,
    every plan at mtpc plan's node budget), what fits, the choice by
    throughput and by capacity, seeded samples of 100 against the exhaustive
    choice, the capacity choice built and run (measured peak against the
    plan's), and proxy training's choice."""
    m = {"layers": "4..12", "hidden": "64..256 by 64", "heads": 4, "ffn": 256, "vocab": 512,
         "seq": 128, "dropout": 0.0}
    tasks = [("topic", "classify(classes = 4)", "from pooled"),
             ("pos", "tag(labels = 12)", "from layer 3"),
             ("chunk", "tag(labels = 8)", "from layer 2..6"),
             ("ner", "tag(labels = 9)", "from layer 4")]
    strategy = {"checkpoint": "auto", "offload": "none", "gfm": "none", "dgfg": "none",
                "clip": "none", "lr": "cosine(1e-3, warmup = 5)"}
    budget = budget_block(args, 64 << 20, micro_batch="4..24 by 4")
    text = spec_text("search_m", m, tasks, strategy, budget,
                     {"steps": 20, "seed": 1, "log_every": 1},
                     correlate=[("pos", "chunk", 0.8)])
    spec = os.path.join(args.work, "search_m.mtp")
    with open(spec, "w") as f:
        f.write(text)
    res, rows = {}, []

    def search(name, extra, runs=1):
        ts, p = [], None
        for _ in range(runs):
            start = time.perf_counter()
            p = run([args.mtpc, "search", spec, "--max-candidates", "2000"] + list(extra),
                    timeout=1800)
            ts.append(time.perf_counter() - start)
        o = p.stdout
        fit = re.search(r"(\d+) fit the budget", o)
        chosen = re.search(r"chosen: (.*)\n\s+(.*)", o)
        sps = re.search(r"([\d.]+) samples/s, peak ([\d.]+ \w+) \((\d+)% of the usable budget\), "
                        r"([\d.]+ ?\w?) parameters", o)
        again = re.search(r"; (\d+) planned again", o)
        planned = re.search(r"(\d+) planned \(a sample", o)
        row = {"seconds": median(ts), "fit": int(fit.group(1)) if fit else 0,
               "chosen": chosen.group(1) if chosen else "—",
               "samples_s": float(sps.group(1)) if sps else 0.0,
               "peak": sps.group(2) if sps else "—", "params": sps.group(4) if sps else "—",
               "replanned": int(again.group(1)) if again else 0,
               "planned": int(planned.group(1)) if planned else 1080, "stdout": o}
        res[name] = {k: v for k, v in row.items() if k != "stdout"}
        rows.append([name, "%.2f s" % row["seconds"], row["planned"], row["replanned"],
                     row["fit"], row["chosen"].replace("backbone.", "").replace("budget.", ""),
                     "%.1f" % row["samples_s"], row["peak"], row["params"]])
        return row

    runs = 1 if args.quick else 2
    best = search("throughput, exhaustive (both cores)", [], runs)
    search("throughput, exhaustive, --jobs 1", ["--jobs", "1"], 1)
    full = search("throughput, every plan at 40000 nodes", ["--plan-nodes", "-1"], 1)
    cap = search("capacity, exhaustive", ["--objective=capacity", "-o",
                                          os.path.join(args.work, "search_best.mtp")], 1)
    seeds = [0] if args.quick else [0, 1, 2]
    for seed in seeds:
        search("throughput, a sample of 100 (seed %d)" % seed,
               ["--max-candidates", "100", "--seed", str(seed)], 1)
    out.append("### Search (C11)\n")
    out.append("`mtpc search` over model M's family: layers 4..12, hidden 64..256 by 64, the chunk "
               "task's tap 2..6, micro batch 4..24 by 4 (1080 candidates; a tap above the top "
               "layer does not check), `checkpoint = auto`, 64 MiB. Each candidate is parsed, "
               "checked and planned by the full pipeline; planned first with a branch and bound of "
               "1000 nodes, then the best and those it did not fit with `mtpc plan`'s 40000. "
               "Wall time of the whole command, median of %d run(s) for the first row. Samples/s "
               "and the peak are the plan's prediction for the chosen candidate.\n" % runs)
    out.append(table(["search", "time", "planned", "re-planned", "fit", "chosen",
                      "samples/s", "peak", "params"], rows))
    same = best["chosen"] == full["chosen"] and best["fit"] == full["fit"]
    out.append("\nQuick plans against every plan at 40000 nodes: %s.\n"
               % ("the same fitting set and the same choice" if same else
                  "they differ (%d against %d fit)" % (best["fit"], full["fit"])))
    samples = [res["throughput, a sample of 100 (seed %d)" % s]["samples_s"] for s in seeds]
    out.append("A seeded sample of 100 reaches %s of the exhaustive choice's throughput.\n"
               % ", ".join("%.1f%%" % (100 * x / best["samples_s"]) for x in samples))
    res["sample_ratio"] = [x / best["samples_s"] for x in samples]
    # The capacity choice built and run: its tracked peak against the plan.
    with open(os.path.join(args.work, "search_best.mtp")) as f:
        chosen_text = f.read()
    binary = b.build(chosen_text)
    o = r.mtpc(binary, 3, memory=True)
    recs = o["records"]
    peak = max(x["measured_peak_bytes"] for x in recs)
    predicted = recs[0]["predicted_peak_bytes"]
    res["capacity_peak_gap"] = peak / predicted - 1
    out.append("The capacity choice built and run 3 steps: tracked peak %s against the plan's %s "
               "(%+.2f%%).\n" % (fmt_bytes(peak), fmt_bytes(predicted), 100 * (peak / predicted - 1)))
    # Proxy training: the front of throughput against parameters, by held-out loss.
    steps = 10 if args.quick else 40
    start = time.perf_counter()
    p = run([args.mtpc, "search", spec, "--max-candidates", "2000", "--train-steps", str(steps),
             "--train-candidates", "4", "--top", "1"], timeout=3600)
    secs = time.perf_counter() - start
    trained = [l for l in p.stdout.splitlines() if re.search(r"\s[\d.]+\s+%d\s*$" % steps, l)]
    chosen = re.search(r"chosen: (.*)\n\s+(.*)", p.stdout)
    out.append("\nWith proxy training (`--train-steps %d --train-candidates 4`, synthetic held-out "
               "data), %.0f s; the candidates that trained the last round:\n" % (steps, secs))
    out.append("```\n" + "\n".join(l.rstrip() for l in p.stdout.splitlines()
                                   if "layers hidden" in l or l in trained) + "\n```\n")
    out.append("Chosen: %s — %s\n" % (chosen.group(1), chosen.group(2)) if chosen else "")
    res["train_seconds"] = secs
    return res


def signed_bytes(d):
    return ("+" if d > 0 else "−") + fmt_bytes(abs(d))


def run_planned(args, b, r, name, m, tasks, strategy, budget, steps, world):
    """The spec planned by mtpc, run by mtprt-run on `world` processes: its
    metrics records."""
    text = spec_text(name, m, tasks, strategy, budget,
                     {"steps": steps, "seed": 1, "log_every": 1})
    src = r.tmp(".mtp")
    plan = src + ".mtpplan"
    with open(src, "w") as f:
        f.write(text)
    run([args.mtpc, "plan", src, "--format=fb", "-o", plan] + b.device_flags())
    runner = os.path.join(ROOT, "build", "runtime", "tools", "mtprt-run")
    extra = ["--plan", plan] + (["--nproc", str(world)] if world > 1 else [])
    return r.mtpc(runner, steps, extra=extra)["records"]


def planned_json(args, r, name, m, tasks, strategy, budget, steps, flags=()):
    """`mtpc plan --format=json` of the spec, parsed."""
    src = r.tmp(".mtp")
    with open(src, "w") as f:
        f.write(spec_text(name, m, tasks, strategy, budget,
                          {"steps": steps, "seed": 1, "log_every": 1}))
    return json.loads(run([args.mtpc, "plan", src, "--format=json"] + list(flags)).stdout)


def planned_communication(args, r, name, m, tasks, strategy, budget, steps):
    """`mtpc plan`'s communication per step for the spec (seconds; 0 at one
    process)."""
    return planned_json(args, r, name, m, tasks, strategy, budget,
                        steps).get("communication", {}).get("seconds", 0.0)


def section_zero(args, b, r, out):
    """ZeRO stages 1 to 3 (docs/zero.md): memory per rank and step time at
    1, 2 and 4 processes (gloo on loopback), on a model whose parameters
    outweigh its activations, each plan beside what it measured."""
    steps = 8 if args.quick else 20
    runner = os.path.join(ROOT, "build", "runtime", "tools", "mtprt-run")
    m = {"layers": 4, "hidden": 256, "heads": 4, "ffn": 1024, "vocab": 8192, "seq": 16,
         "dropout": 0.0}
    tasks = [("topic", "classify(classes = 4)", "from pooled"),
             ("pos", "tag(labels = 12)", "from layer 2")]
    strategy = {"checkpoint": "none", "offload": "none", "gfm": "none", "dgfg": "none",
                "clip": "none", "lr": "cosine(1e-3, warmup = 5)", "collective": "none"}
    res, rows = {}, []
    # (stage, offload, precision): bf16 with the offload holds the
    # projections bf16 on the device and their fp32 masters on the host
    # (ZeRO-Offload's 16-bit weights), beside bf16 with the update on the
    # device.
    settings = [(0, False, "fp32"), (1, False, "fp32"), (2, False, "fp32"),
                (3, False, "fp32"), (0, True, "fp32"), (2, True, "fp32"), (3, True, "fp32"),
                (0, False, "bf16"), (1, True, "bf16")]
    for world in (1, 2, 4):
        for stage, offload, precision in settings:
            budget = budget_block(args, 2 << 30, micro_batch=2, global_batch=2 * world)
            budget["gpus"] = world
            budget["precision"] = precision
            if stage:
                budget["zero"] = stage
            st = dict(strategy)
            if offload:
                st["optimizer_offload"] = "cpu"
            recs = run_planned(args, b, r, "bench_z", m, tasks, st, budget, steps, world)
            later = recs[1:] or recs
            e = {"measured": max(x["measured_peak_bytes"] for x in later),
                 "predicted": later[0]["predicted_peak_bytes"],
                 "host": max(x.get("host_pool_bytes", 0) for x in later),
                 "step_s": median([x["step_time_s"] for x in later]),
                 "sent": median([x["bytes_sent"] for x in later]),
                 "comm_plan": planned_communication(args, r, "bench_z", m, tasks, st, budget,
                                                    steps),
                 "comm_s": median([x.get("comm_s", 0.0) for x in later])}
            name = ("%d %s %s" % (stage, "+ offload" if offload else "",
                                  "bf16" if precision == "bf16" else "")).replace("  ", " ")
            res["%d/%s" % (world, name.strip())] = e
            base = res["%d/0" % world]
            rows.append([str(world), name, fmt_bytes(e["predicted"]),
                         fmt_bytes(e["measured"]),
                         "%+.2f%%" % (100 * (e["measured"] / e["predicted"] - 1)),
                         fmt_ratio(e["measured"] / base["measured"]),
                         fmt_bytes(e["host"]),
                         "%.1f ms" % (1000 * e["step_s"]),
                         fmt_ratio(e["step_s"] / base["step_s"]), fmt_bytes(e["sent"]),
                         "—" if world == 1 else "%.1f / %.1f ms" % (1000 * e["comm_plan"],
                                                                   1000 * e["comm_s"])])
    # The peers a PyTorch user reaches for, same model and init, against
    # their own plain data parallelism (0): torch's ZeroRedundancyOptimizer
    # (1), FSDP2's fully_shard with reshard_after_forward False (2) and True
    # (3). Each twice: as the binary runs (the step times), then a few steps
    # with glibc's mmap threshold pinned so a freed tensor leaves the
    # resident set (the memory; without it glibc keeps the freed pages of
    # FSDP's gathers and buckets, which read as growth, and the pinned
    # threshold's page faults slow every step).
    peer_rows, fsdp_rows = [], []
    for world in (2, 4):
        budget = budget_block(args, 2 << 30, micro_batch=2, global_batch=2 * world)
        budget["gpus"] = world
        text = spec_text("bench_z", m, tasks, strategy, budget,
                         {"steps": steps, "seed": 1, "log_every": 1})
        src = r.tmp(".mtp")
        with open(src, "w") as f:
            f.write(text)
        run([args.mtpc, "plan", src, "--format=fb", "-o", src + ".mtpplan"])
        init = os.path.join(args.work, "init-zero-%d" % world)
        shutil.rmtree(init, ignore_errors=True)
        r.mtpc(runner, 0, extra=["--plan", src + ".mtpplan", "--dump-init", init])
        peer = {}
        for z in (0, 1, 2, 3):
            cmd = [sys.executable, os.path.join(ROOT, "bench", "peer_zero.py"), "--init", init,
                   "--nproc", str(world), "--zero", str(z),
                   "--threads", str(max(1, args.threads))]
            d = json.loads(run(cmd + ["--steps", str(steps)]).stdout.strip().splitlines()[-1])
            mem = json.loads(run(cmd + ["--steps", "3"], env={"MALLOC_MMAP_THRESHOLD_":
                                                           MMAP_THRESHOLD}
                                 ).stdout.strip().splitlines()[-1])
            peer[z] = {"step_s": median(d["step_time_s"][1:]), "rss": max(d["rss_peak"]),
                       "rss_pinned": max(mem["rss_peak"]), "loss": d["loss"][-1]}
        res["peer/%d" % world] = peer
        mt0, mt1 = res["%d/0" % world], res["%d/1" % world]
        peer_rows.append([str(world),
                          "%.1f → %.1f ms (%s)" % (1000 * mt0["step_s"], 1000 * mt1["step_s"],
                                                   fmt_ratio(mt1["step_s"] / mt0["step_s"])),
                          "%.1f → %.1f ms (%s)" % (1000 * peer[0]["step_s"], 1000 * peer[1]["step_s"],
                                                   fmt_ratio(peer[1]["step_s"] / peer[0]["step_s"])),
                          fmt_ratio(mt1["step_s"] / peer[1]["step_s"]),
                          signed_bytes(mt1["measured"] - mt0["measured"]),
                          signed_bytes(peer[1]["rss_pinned"] - peer[0]["rss_pinned"])])
        for z, reshard in ((2, "False"), (3, "True")):
            mt, pz = res["%d/%d" % (world, z)], peer[z]
            fsdp_rows.append([str(world), "%d / %s" % (z, reshard),
                              "%.1f ms (%s)" % (1000 * mt["step_s"],
                                                fmt_ratio(mt["step_s"] / mt0["step_s"])),
                              "%.1f ms (%s)" % (1000 * pz["step_s"],
                                                fmt_ratio(pz["step_s"] / peer[0]["step_s"])),
                              fmt_ratio(mt["step_s"] / pz["step_s"]),
                              signed_bytes(mt["measured"] - mt0["measured"]),
                              signed_bytes(pz["rss_pinned"] - peer[0]["rss_pinned"])])
    out.append("### ZeRO: memory per rank and step time (docs/zero.md)\n")
    out.append("A parameter-heavy model (4 layers, hidden 256, ffn 1024, vocab 8192, seq 16; "
               "5.3 M parameters), micro batch 2 per rank, collective none, %d steps "
               "(the first left out), gloo on loopback on this machine's cores. Memory: "
               "rank 0's tracked peak per step against the plan's; time: median step; sent: "
               "bytes rank 0 hands to the collectives per step; host: the host pool (the offloaded "
               "state and the update's buckets); comm: `mtpc plan`'s communication per step "
               "(docs/cost-model.md) / rank 0's measured `comm_s` (blocked on the others: "
               "the transfers and the wait for a slower rank).\n" % steps)
    out.append(table(["processes", "zero", "predicted", "measured", "gap", "vs zero 0",
                      "host", "step", "vs zero 0", "sent / step", "comm plan / measured"], rows))
    out.append("\nBeside torch's `ZeroRedundancyOptimizer` (stage 1; bench/peer_zero.py: "
               "the same model from the binary's `--dump-init`, gloo, the gradients averaged "
               "by one flattened all-reduce, AdamW whole or sharded). Memory stage 1 changes: "
               "mtpc's tracked peak; the peer's resident-set peak (the largest rank's), from a "
               "3-step run with glibc's mmap threshold at 64 KiB so freed tensors leave it — "
               "still a coarse reading (LibTorch's and Python's own pages move it too).\n")
    out.append(table(["processes", "mtpc zero 0 → 1", "torch DP → ZeRO-1", "mtpc / torch at 1",
                      "mtpc memory", "torch memory (RSS)"], peer_rows))
    out.append("\nStages 2 and 3 beside FSDP2 (`fully_shard`, `peer_zero.py --zero 2|3`): each "
               "transformer layer one unit, the embeddings and heads in the root's, AdamW over the "
               "DTensor shards, FSDP's own gradient reduce-scatter. `reshard_after_forward=False` "
               "keeps a unit's gathered parameters from its forward to its backward (ZeRO-2-like, "
               "but the parameters stay sharded between steps, which mtpc's stage 2 keeps whole); "
               "`True` frees them and gathers again for the backward (ZeRO-3; mtpc's stage 3 "
               "keeps the heads whole). Step: median, in brackets against each side's zero 0 "
               "(torch: its data parallelism above); memory: the change against each side's zero "
               "0, mtpc's tracked peak and the peer's pinned-threshold RSS peak as above (coarse: "
               "a few MiB either way are noise).\n")
    out.append(table(["processes", "zero / reshard_after_forward", "mtpc step",
                      "torch FSDP step", "mtpc / torch", "mtpc memory", "torch memory (RSS)"],
                     fsdp_rows))
    return res


def section_pipeline(args, b, r, out):
    """Pipeline stages (docs/pipeline.md): throughput and per-rank memory at
    1, 2 and 4 stages against data parallelism over as many processes, the
    same global batch and micro batch, gloo on loopback; the wait share (idle
    for a neighbour: bubble and transfers) beside the theoretical bubble."""
    steps = 8 if args.quick else 20
    m = {"layers": 8, "hidden": 128, "heads": 4, "ffn": 512, "vocab": 1024, "seq": 32,
         "dropout": 0.0}
    tasks = [("topic", "classify(classes = 4)", "from pooled"),
             ("pos", "tag(labels = 12)", "from layer 2"),
             ("chunk", "tag(labels = 8)", "from layer 5")]
    strategy = {"checkpoint": "none", "offload": "none", "gfm": "{ keep = 0.5 }",
                "dgfg": "{ hidden = 16 }", "clip": "per_task(max_norm = 1.0)",
                "lr": "cosine(1e-3, warmup = 5)", "collective": "none"}
    micro, global_batch = 4, 32
    res, rows = {}, []
    for world in (1, 2, 4):
        for kind in (("dp",) if world == 1 else
                     ("dp", "1f1b", "gpipe", "1f1b+recompute", "1f1b+offload")):
            memory = 2 << 30
            if kind in ("1f1b+recompute", "1f1b+offload"):
                # 85% of the largest stage's plan kept whole: the stages over
                # it recompute (checkpoint = auto) or offload (offload =
                # auto) blocks.
                memory = int(0.85 * max(res["%d/1f1b" % world]["predicted"]))
            budget = budget_block(args, memory, micro_batch=micro, global_batch=global_batch)
            budget["gpus"] = world
            st = dict(strategy)
            if kind != "dp":
                budget["pipeline"] = world
                st["pipeline_schedule"] = kind.split("+")[0]
            if kind == "1f1b+recompute":
                st["checkpoint"] = "auto"
            if kind == "1f1b+offload":
                st["offload"] = "auto"
            recs = run_planned(args, b, r, "bench_p", m, tasks, st, budget, steps, world)
            later = recs[1:] or recs
            ranks = later[-1].get("measured_peak_bytes_by_rank") or [later[-1]["measured_peak_bytes"]]
            preds = later[-1].get("predicted_peak_bytes_by_rank") or [later[-1]["predicted_peak_bytes"]] * len(ranks)
            step_s = median([x["step_time_s"] for x in later])
            wait = median([x.get("pipeline_wait_s", 0.0) for x in later])
            mb = global_batch // micro
            e = {"samples_per_s": global_batch / step_s, "step_s": step_s,
                 "peak_max": max(max(x.get("measured_peak_bytes_by_rank") or
                                     [x["measured_peak_bytes"]]) for x in later),
                 "ranks": ranks, "predicted": preds,
                 "worst_gap": max((m_ / p_ - 1 for m_, p_ in zip(ranks, preds)), key=abs),
                 "wait_share": wait / step_s if kind != "dp" else None,
                 "bubble": (world - 1) / (mb + world - 1) if kind != "dp" else None}
            res["%d/%s" % (world, kind)] = e
            base = res["%d/dp" % world]
            rows.append([str(world), kind if kind != "dp" else "data parallel",
                         "%.0f" % e["samples_per_s"],
                         fmt_ratio(e["samples_per_s"] / base["samples_per_s"]),
                         " / ".join(fmt_bytes(x) for x in ranks),
                         fmt_ratio(max(ranks) / max(base["ranks"])),
                         "%+.1f%%" % (100 * e["worst_gap"]),
                         "—" if e["bubble"] is None else "%.3f" % e["bubble"],
                         "—" if e["wait_share"] is None else "%.3f" % e["wait_share"]])
    # pipeline = auto on the same spec: what the planner would choose at
    # each process count, beside what was measured.
    auto_rows = []
    for world in (2, 4):
        budget = budget_block(args, 2 << 30, micro_batch=micro, global_batch=global_batch)
        budget["gpus"] = world
        budget["pipeline"] = "auto"
        a = planned_json(args, r, "bench_p", m, tasks, strategy, budget, steps,
                         b.device_flags())["pipeline_auto"]
        res["%d/auto" % world] = a
        measured = {"1": res["%d/dp" % world]["samples_per_s"],
                    str(world): res["%d/1f1b" % world]["samples_per_s"]}
        fastest = max(measured, key=measured.get)
        auto_rows.append([str(world), str(a["chosen"]),
                          ", ".join("%d: %s" % (t["stages"], "%.1f ms" % (1e3 * t["step_s"])
                                                if t["fits"] else "refused")
                                    for t in a["tried"]),
                          ", ".join("%s: %.0f/s" % kv for kv in measured.items()),
                          fastest])
    out.append("### Pipeline stages against data parallelism (docs/pipeline.md)\n")
    out.append("8 layers, hidden 128, ffn 512, seq 32, three tasks (layers 2, 5, 8), global "
               "batch 32 in micro-batches of 4 (a pipeline runs 8 through its stages, data "
               "parallelism 8 / N per rank), GFM + DGFG + per-task clip, collective none, %d "
               "steps (the first left out), gloo on loopback on this machine's cores (4 "
               "processes share 2 cores). Memory: every rank's tracked peak at the last step; "
               "gap: the worst rank against its own prediction; wait: rank 0's share of the "
               "step spent waiting for a neighbour (bubble and transfer), beside the "
               "theoretical bubble (S − 1)/(M + S − 1). 1f1b+recompute: the budget at 85%% "
               "of the 1F1B plan's largest stage, `checkpoint = auto` (an over-budget stage "
               "recomputes blocks); 1f1b+offload: the same budget, `offload = auto` (it "
               "offloads them to the host pool instead).\n" % steps)
    out.append(table(["processes", "run", "samples/s", "vs DP", "peak per rank",
                      "largest vs DP", "worst gap", "bubble", "wait share"], rows))
    out.append("\n`pipeline = auto` on the same spec (2 GiB, everything fits): the stages it "
               "chooses, its predicted step per number of stages, and the measured throughput "
               "of data parallelism (1) and of the 1F1B pipeline over every process.\n")
    out.append(table(["processes", "auto chose", "predicted step by stages",
                      "measured by stages", "measured fastest"], auto_rows))
    return res


SECTIONS = {"agree": section_agree, "step": section_step, "load": section_load,
            "pareto": section_pareto, "pareto16": section_pareto16,
            "memory": section_memory,
            "plan": section_plan,
            "compress": section_compress, "scope": section_scope, "ablation": section_ablation,
            "dynbatch": section_dynbatch, "saps": section_saps,
            "forgetting": section_forgetting, "search": section_search,
            "zero": section_zero, "pipeline": section_pipeline}
QUICK = ["agree", "memory", "plan", "compress"]


def section_pretrained(args, b, r, out):
    """Pretrained backbones (issue #18): a random GPT-2, Llama and BERT
    directory (scripts/make-hf-model.py), fine-tuned by mtpc and by
    transformers + torch (eager, SDPA) with the same heads, in the same run."""
    key = "cpu_step" if cpu_time(args) else "step"
    dims = ["--layers", "4", "--hidden", "256", "--heads", "4", "--ffn", "1024",
            "--vocab", "1024", "--positions", "256"]
    families = [("gpt2", []), ("llama", ["--kv-heads", "2", "--rope-scaling"]),
                ("bert", [])]
    out.append("### Pretrained backbones against transformers\n")
    out.append("A random 4-layer model of each family (hidden 256, 4 heads — Llama over 2 "
               "key/value heads with llama3 rotary scaling —, ffn 1024, vocab 1024) from "
               "`scripts/make-hf-model.py`, seq 128, batch 8, dropout 0, fp32, no strategy; "
               "tasks: classify (pooled) at layer 4, tag at layer 2; each also with the "
               "embeddings and layers 1-2 frozen (`freeze = layers(0, 2)`: the peer sets "
               "their `requires_grad` off). The peer is "
               "`AutoModel.from_pretrained(DIR, attn_implementation=\"sdpa\")` with the same "
               "heads and AdamW (bench/peer.py `hf`). RSS: the peak above the level after a "
               "first step (both sides); %s time, %s thread(s).\n"
               % ("CPU" if key == "cpu_step" else "wall", args.threads or "LibTorch's"))
    py = sys.executable
    rows, results = [], {}
    # The usual fine-tune too: the embeddings and the lower half frozen
    # (the tag head on layer 2 then trains alone on a no-grad backbone run).
    freezes = ["none", "layers(0, 2)"]
    for (family, extra), freeze in itertools.product(families, freezes):
        d = os.path.join(args.work, "hf-" + family)
        if not os.path.exists(os.path.join(d, "config.json")):
            run([py, os.path.join(ROOT, "scripts", "make-hf-model.py"), d, "--family",
                 family, "--seed", "3"] + dims + extra)
        tasks = [("topic", "classify(classes = 4)", "from pooled"),
                 ("pos", "tag(labels = 12)", "from layer 2")]
        strategy = {"checkpoint": "none", "offload": "none", "gfm": "none", "dgfg": "none",
                    "clip": "none", "lr": "cosine(1e-3, warmup = 5)"}
        text = spec_text("bench_" + family, None, tasks, strategy,
                         budget_block(args, 16 << 30),
                         {"steps": 20, "seed": 1, "log_every": 1},
                         backbone_line='backbone pretrained("%s") { seq = 128  dropout = 0  '
                                       'freeze = %s }' % (d, freeze))
        binary = b.build(text)
        plan, _ = b.plan(text)
        name = family if freeze == "none" else "%s, freeze %s" % (family, freeze)
        init = os.path.join(args.work, "init-hf-" + family + ("" if freeze == "none" else "-frozen"))
        shutil.rmtree(init, ignore_errors=True)
        r.mtpc(binary, 0, extra=["--dump-init", init])
        entries = [{"name": "mtpc", "kind": "mtpc", "binary": binary, "extra": []},
                   {"name": "transformers", "kind": "peer", "variant": "hf"}]
        runs, steps, mem_steps = (2, 4, 3) if args.quick else (3, 6, 3)
        log("pretrained %s: %d runs of %d steps" % (name, runs, steps))
        measure(r, entries, init, runs, steps, mem_steps, "rss_warm_above")
        m, p = entries
        rows.append([name, fmt_bytes(planned_peak(plan)), fmt_bytes(m.get("tracked")),
                     fmt_bytes(m["rss"]), fmt_bytes(p["rss"]),
                     fmt_ratio(m["rss"] / p["rss"]) if m["rss"] and p["rss"] else "—",
                     "%.0f" % (1e3 * m[key]), "%.0f" % (1e3 * p[key]),
                     fmt_ratio(m[key] / p[key])])
        results[name] = {e["name"]: {k: v for k, v in e.items() if k != "binary"}
                           for e in entries}
    out.append(table(["family", "predicted peak", "tracked peak", "mtpc RSS",
                      "transformers RSS", "RSS ratio", "mtpc ms/step", "transformers ms/step",
                      "time ratio"], rows))
    return results


SECTIONS["pretrained"] = section_pretrained


def machine(args):
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import torch
    commit = run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], check=False).stdout.strip()
    dirty = run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                check=False).stdout.strip()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu, "torch": torch.__version__,
            "python": platform.python_version(), "commit": commit + ("+dirty" if dirty else ""),
            "load": "%.2f %.2f %.2f" % os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M %Z")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a subset, under 3 minutes here")
    ap.add_argument("--only", help="comma-separated sections: " + ", ".join(SECTIONS))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--gpu-preset", default="H100_80GB", help="budget preset with --device cuda")
    ap.add_argument("--threads", type=int, default=None,
                    help="intra-op threads for both sides (default: 1 on cpu — stable beside "
                         "other work on a 2-core machine; LibTorch's on cuda)")
    ap.add_argument("--mtpc", default=os.path.join(ROOT, "build", "bin", "mtpc"))
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench"),
                    help="binaries (cached by spec), dumps, results.json")
    ap.add_argument("--out", help="also write the markdown here")
    args = ap.parse_args()
    if args.threads is None:
        args.threads = 1 if args.device == "cpu" else 0
    if not os.path.exists(args.mtpc):
        sys.exit("bench: %s not found; run scripts/build.sh first" % args.mtpc)
    os.makedirs(args.work, exist_ok=True)
    names = args.only.split(",") if args.only else (QUICK if args.quick else list(SECTIONS))
    for n in names:
        if n not in SECTIONS:
            sys.exit("bench: unknown section '%s' (%s)" % (n, ", ".join(SECTIONS)))
    start = time.perf_counter()
    info = machine(args)
    b, r = Builder(args), Runner(args)
    out = ["## mtpc benchmarks%s\n" % (" (--quick)" if args.quick else ""),
           "Machine: %s, %d cores, GPU %s; torch %s (both sides), Python %s; mtpc %s; %s; "
           "device %s, %s intra-op thread(s); load average at the start %s.\n"
           % (info["cpu"], info["cores"], info["gpu"], info["torch"], info["python"],
              info["commit"], info["date"], args.device, args.threads or "default", info["load"])]
    results = {"machine": info, "quick": args.quick}
    for n in names:
        t0 = time.perf_counter()
        log("section %s" % n)
        section = []
        results[n] = SECTIONS[n](args, b, r, section)
        section.append("\n_(%s: %.0f s)_\n" % (n, time.perf_counter() - t0))
        text = "\n".join(section)
        print(text)
        sys.stdout.flush()
        out.append(text)
    total = time.perf_counter() - start
    tail = "Total %.0f s; load average at the end %.2f %.2f %.2f." % ((total,) + os.getloadavg())
    print(tail)
    out.append(tail)
    results["seconds"] = total
    with open(os.path.join(args.work, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
