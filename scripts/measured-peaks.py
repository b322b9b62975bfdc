#!/usr/bin/env python3
"""Measured peaks of every example, to compare before and after a change.

Each examples/*.mtp is resized to the CPU (hidden 64, 4 heads, ffn 256, vocab
512, seq 32, decoder vocab 96 over 16 tokens; budget `device = cpu`, micro
batch 8, fp16 as bf16), planned twice — with room for everything, and halfway
between that plan's smallest reachable peak and its keep peak — and trained 2 steps by `mtprt-run --threads 1`,
then evaluated on 256 held-out synthetic records (`--eval-data synthetic:256`:
forward only, the plan's evaluation peak). It prints two lines per run (the
step's predicted and measured peak, their gap; the evaluation's) and writes
them as JSON:

    scripts/measured-peaks.py [--build build] [-o peaks.json] [--compare old.json]
                              [--within TOL] [--mtpc PATH] [--runner PATH]

With --compare it exits 1 if any measured peak differs from the old file's
(the tracking allocator's figures are deterministic at one thread), and says
which. Run it before a change that should keep peaks (a refactoring), save
the file, and again after with --compare. With --within it exits 1 if any
measured peak is more than TOL (a fraction) off its prediction, or if a run
failed (test/tools/examples-peaks.test holds every example within 3%).
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def resize(text):
    """The spec at CPU size, its tasks, correlations and strategy unchanged."""
    def backbone(m):
        fields = dict(re.findall(r"(\w+)\s*=\s*([\w.]+)", m.group(1)))
        fields.update(hidden="64", heads="4", ffn="256", vocab="512", seq="32")
        return "backbone transformer { %s }" % "  ".join("%s = %s" % kv for kv in fields.items())
    text = re.sub(r"backbone\s+transformer\s*\{([^}]*)\}", backbone, text, flags=re.S)
    text = re.sub(r"decoder\(([^)]*)\)", "decoder(layers = 1, vocab = 96, target_seq = 16)", text)
    m = re.search(r"budget\s*\{([^}]*)\}", text, flags=re.S)
    precision = re.search(r"precision\s*=\s*(\w+)", m.group(1)) if m else None
    p = precision.group(1) if precision else "fp32"
    budget = "budget { device = cpu  memory = 4GiB  micro_batch = 8  precision = %s }" % (
        "bf16" if p == "fp16" else p)
    return re.sub(r"budget\s*\{[^}]*\}", budget, text, flags=re.S)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("measured-peaks: %s failed:\n%s%s" % (" ".join(cmd), p.stdout, p.stderr))
    return p.stdout


def measure(mtpc, runner, spec, work, name):
    plan = os.path.join(work, name + ".mtpplan")
    metrics = os.path.join(work, name + ".jsonl")
    run([mtpc, "plan", spec, "--format=fb", "-o", plan])
    if os.path.exists(metrics):
        os.unlink(metrics)
    run([runner, "--plan", plan, "--data", "synthetic", "--steps", "2", "--threads", "1",
         "--log-every", "1", "--progress", "off", "--metrics", metrics,
         "--eval-data", "synthetic:256", "--eval-every", "2"])
    with open(metrics) as f:
        lines = [json.loads(l) for l in f]
    recs = [r for r in lines if "step_time_s" in r]
    ev = [r for r in lines if "eval" in r][-1]
    return ({"predicted": recs[0]["predicted_peak_bytes"],
             "measured": max(r["measured_peak_bytes"] for r in recs)},
            {"predicted": ev["predicted_peak_bytes"], "measured": ev["peak_bytes"]})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("-o", "--output", help="write the peaks as JSON here")
    ap.add_argument("--compare", help="a file this script wrote before")
    ap.add_argument("--within", type=float, help="fail if a gap exceeds this fraction")
    ap.add_argument("--mtpc", help="the compiler (default BUILD/bin/mtpc)")
    ap.add_argument("--runner", help="mtprt-run (default BUILD/runtime/tools/mtprt-run)")
    a = ap.parse_args()
    mtpc = a.mtpc or os.path.join(a.build, "bin", "mtpc")
    runner = a.runner or os.path.join(a.build, "runtime", "tools", "mtprt-run")
    bad = 0
    out = {}
    with tempfile.TemporaryDirectory() as work:
        for path in sorted(glob.glob(os.path.join(ROOT, "examples", "*.mtp"))):
            stem = os.path.splitext(os.path.basename(path))[0]
            with open(path) as f:
                text = resize(f.read())
            spec = os.path.join(work, stem + ".mtp")
            with open(spec, "w") as f:
                f.write(text)
            keep = json.loads(run([mtpc, "plan", spec, "--format=json"]))
            keep_peak, least = keep["plan"]["keep_peak_bytes"], keep["plan"]["minimal_peak_bytes"]
            tight = os.path.join(work, stem + ".half.mtp")
            with open(tight, "w") as f:
                f.write(text.replace("memory = 4GiB",
                                     "memory = %dB" % ((keep_peak + least) // 2)))
            for name, s in ((stem, spec), (stem + " halfway", tight)):
                try:
                    out[name], out[name + " eval"] = measure(
                        mtpc, runner, s, work, name.replace(" ", "."))
                except SystemExit as e:  # a budget no plan meets is a result too
                    out[name] = {"error": str(e).splitlines()[-1][:160]}
                for name in (name, name + " eval"):
                  r = out.get(name)
                  if r is None:
                    continue
                  if "error" in r:
                    print("%-22s %s" % (name, r["error"]))
                    bad += 1
                  else:
                    # measured over predicted, as peak_gap.py and the metrics
                    # report it: + is an under-prediction
                    gap = r["measured"] / r["predicted"] - 1
                    ok = a.within is None or abs(gap) <= a.within
                    bad += not ok
                    print("%-27s predicted %10d measured %10d gap %+6.2f%%%s" % (
                        name, r["predicted"], r["measured"], 100.0 * gap,
                        "" if a.within is None else (" ok" if ok else " OVER")))
    if a.output:
        with open(a.output, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
    if a.compare:
        with open(a.compare) as f:
            old = json.load(f)
        changed = [n for n in sorted(set(old) | set(out))
                   if old.get(n, {}).get("measured") != out.get(n, {}).get("measured")]
        for n in changed:
            print("changed: %s measured %s -> %s" % (n, old.get(n, {}).get("measured"),
                                                     out.get(n, {}).get("measured")))
        print("measured peaks %s" % ("changed" if changed else "unchanged"))
        return 1 if changed or (a.within is not None and bad) else 0
    return 1 if a.within is not None and bad else 0


if __name__ == "__main__":
    sys.exit(main())
