#!/usr/bin/env python3
"""losses_fall.py METRICS.jsonl TASK...: each task's loss, the mean of its
last two logged steps, is below half the mean of its first two. Prints one
line per task; exits 1 when one does not fall."""
import json
import sys


def main(argv):
    rows = [json.loads(l) for l in open(argv[0]) if l.strip()]
    rows = [r for r in rows if "loss" in r]
    ok = True
    for task in argv[1:]:
        v = [r["loss"][task] for r in rows if r["loss"].get(task) is not None]
        if len(v) < 4:
            print(f"{task}: only {len(v)} logged losses")
            ok = False
            continue
        first, last = sum(v[:2]) / 2, sum(v[-2:]) / 2
        falls = last < 0.5 * first
        print(f"{task} {'falls' if falls else 'does not fall'}: {first:.3f} -> {last:.3f}")
        ok &= falls
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
