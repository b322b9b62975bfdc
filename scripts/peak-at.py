#!/usr/bin/env python3
"""Where a profiled run peaked: the live allocations at the highest total.

    scripts/peak-at.py TRACE.json [--top N] [--within OP]

TRACE.json is `mtprt-run --profile TRACE.json --profile-memory` (or any
Kineto trace with memory events). Replays the `[memory]` events (allocations
and frees by address), finds the highest running total, and prints the ops
running then and the live allocations grouped by size and by the op that
made them — what to hold against the plan's breakdown (`mtpc plan`) when a
predicted peak misses the measured one. `--within OP`: only while an op of
that name runs (`mtprt::evaluate`: the held-out evaluation's peak), the
allocations made before it counted as a base.
"""
import argparse
import collections
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--within", help="only while an op of this name runs")
    a = ap.parse_args()
    try:
        with open(a.trace) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit("peak-at: %s: not a Chrome trace (%s)" % (a.trace, e))
    mem = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    if not mem:
        sys.exit("peak-at: %s has no [memory] events; profile with --profile-memory" % a.trace)
    ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
                 key=lambda e: e["ts"])

    def running(t):
        return [o["name"] for o in ops if o["ts"] <= t <= o["ts"] + o["dur"]]

    spans = [(o["ts"], o["ts"] + o["dur"]) for o in ops if o["name"] == a.within]
    if a.within and not spans:
        sys.exit("peak-at: %s has no op named %s" % (a.trace, a.within))

    def counted(t):
        return not a.within or any(s <= t <= e for s, e in spans)

    live, best = {}, None
    for e in mem:
        args = e["args"]
        if args["Bytes"] > 0:
            live[args["Addr"]] = (args["Bytes"], e["ts"])
        else:
            live.pop(args["Addr"], None)
        if counted(e["ts"]) and (best is None or args["Total Allocated"] > best[0]):
            best = (args["Total Allocated"], e["ts"], dict(live))
    if best is None:
        sys.exit("peak-at: no [memory] events within %s" % a.within)
    total, at, alive = best
    print("peak %d B (the profiler's count from its start) in: %s" % (
        total, " > ".join(running(at)[-5:]) or "-"))
    groups, counts = collections.Counter(), collections.Counter()
    for size, ts in alive.values():
        key = (size, " > ".join(running(ts)[-2:]) or "-")
        groups[key] += size
        counts[key] += 1
    print("| bytes | count x size | allocated in |")
    print("|---|---|---|")
    for key, b in sorted(groups.items(), key=lambda kv: -kv[1])[:a.top]:
        print("| %d | %d x %d | `%s` |" % (b, counts[key], key[0], key[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
