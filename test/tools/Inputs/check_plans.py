"""Runs `mtpc plan --format=json` on each spec and checks the plan against
the budget and the uniform-checkpointing baseline; prints one line per spec
(FAIL on a violation)."""
import json
import os
import subprocess
import sys

mtpc, specs = sys.argv[1], sys.argv[2:]
for spec in specs:
    out = subprocess.run([mtpc, "plan", spec, "--format=json"],
                         capture_output=True, text=True, check=True).stdout
    plan = json.loads(out)
    budget, p = plan["budget"], plan["plan"]
    name = os.path.basename(spec)
    problems = []
    if p["planned_peak_bytes"] > budget["usable_bytes"]:
        problems.append("planned peak over budget - headroom")
    if not budget["fits"]:
        problems.append("does not fit")
    if p["planned_peak_bytes"] <= p["uniform_peak_bytes"] and \
            p["added_seconds"] > p["uniform_added_seconds"]:
        problems.append("slower than uniform checkpointing at a lower peak")
    print(f"{name}: {'FAIL ' + '; '.join(problems) if problems else 'fits'}"
          f" (peak {p['planned_peak_bytes']}, added {p['added_seconds']:.6f} s,"
          f" uniform {p['uniform_added_seconds']:.6f} s)")
