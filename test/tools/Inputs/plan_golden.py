"""The plans of every example, at its own budget and at two tighter ones
(halfway and 10% of the way from its smallest reachable peak to its
keep-everything peak, where the planner must choose what to recompute and
offload), compared with the recorded ones in plans/ — so a refactoring that
should change nothing shows any plan it changed.

  plan_golden.py MTPC EXAMPLES_DIR GOLDEN_DIR WORK_DIR [--update]

Prints one line per plan; exits 1 when any differs (with a unified diff),
or, with --update, rewrites the recorded plans.
"""
import difflib
import json
import os
import re
import subprocess
import sys

mtpc, examples, golden, work = sys.argv[1:5]
update = "--update" in sys.argv[5:]
os.makedirs(work, exist_ok=True)


def plan(spec):
    run = subprocess.run([mtpc, "plan", spec, "--format=json"],
                         capture_output=True, text=True)
    # A refusal is a result too (an impossible budget): record its message.
    if run.returncode != 0:
        return {"refused": run.stderr.replace(os.path.dirname(spec) + "/", "")}
    out = json.loads(run.stdout)
    # The data path is absolute: the checkout's location is not the plan's.
    if isinstance(out.get("train"), dict) and "data" in out["train"]:
        out["train"]["data"] = os.path.basename(str(out["train"]["data"]))
    return out


def with_memory(text, kib):
    """The spec with its budget's memory set to `kib` KiB."""
    if re.search(r"\bmemory\s*=", text):
        return re.sub(r"\bmemory\s*=\s*\S+", f"memory = {kib}KiB", text, 1)
    return re.sub(r"\bbudget\s*\{", f"budget {{ memory = {kib}KiB ", text, 1)


failed = False
for name in sorted(os.listdir(examples)):
    if not name.endswith(".mtp"):
        continue
    path = os.path.join(examples, name)
    text = open(path).read()
    base = plan(path)
    cases = [("", base)]
    p, budget = base.get("plan", {}), base.get("budget", {})
    headroom = budget.get("memory_bytes", 0) - budget.get("usable_bytes", 0)
    for pct in (50, 10):
        if "keep_peak_bytes" not in p:
            break
        low, high = p["minimal_peak_bytes"], p["keep_peak_bytes"]
        target = headroom + low + (high - low) * pct // 100
        variant = os.path.join(work, f"{name[:-4]}.{pct}.mtp")
        with open(variant, "w") as f:
            f.write(with_memory(text, -(-target // 1024)))
        # Relative data paths resolve against the spec: keep the example's.
        cases.append((f".{pct}", plan(variant)))
    for suffix, result in cases:
        file = os.path.join(golden, f"{name[:-4]}{suffix}.json")
        got = json.dumps(result, indent=1, sort_keys=True) + "\n"
        label = name + (f" at {suffix[1:]}% from its smallest to its keep peak"
                        if suffix else "")
        if update:
            with open(file, "w") as f:
                f.write(got)
            print(f"{label}: recorded")
            continue
        want = open(file).read() if os.path.exists(file) else ""
        if got == want:
            print(f"{label}: same")
        else:
            failed = True
            print(f"{label}: CHANGED")
            sys.stdout.writelines(difflib.unified_diff(
                want.splitlines(True), got.splitlines(True),
                f"recorded/{os.path.basename(file)}", "now", n=2))
sys.exit(1 if failed else 0)
