"""Checks a training binary's metrics (JSON Lines) end to end.

  e2e_check.py --losses-fall M.jsonl      each task's mean loss over the last
                                          5 records is below the first 5's
  e2e_check.py --predicted PLAN.json M.jsonl
                                          the metrics' predicted_peak_bytes is
                                          the planned peak `mtpc plan` printed
  e2e_check.py --patch-plan BINARY OUT    OUT = BINARY with its embedded
                                          plan's root offset broken
Prints one line; exits 1 when the check fails.
"""
import json
import sys


def records(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return [r for r in rows if "loss" in r]


def main(argv):
    if argv[0] == "--losses-fall":
        rows = records(argv[1])
        tasks = list(rows[0]["loss"].keys())
        ok = True
        parts = []
        for t in tasks:
            vals = [r["loss"][t] for r in rows if r["loss"].get(t) is not None]
            first = sum(vals[:5]) / len(vals[:5])
            last = sum(vals[-5:]) / len(vals[-5:])
            ok &= last < first
            parts.append(f"{t} {first:.3f} -> {last:.3f}")
        print(("losses fall: " if ok else "losses do not all fall: ") +
              ", ".join(parts))
        return 0 if ok else 1
    if argv[0] == "--predicted":
        plan = json.load(open(argv[1]))["plan"]["planned_peak_bytes"]
        got = {r["predicted_peak_bytes"] for r in records(argv[2])}
        print(f"predicted {plan} logged {sorted(got)}")
        return 0 if got == {plan} else 1
    if argv[0] == "--patch-plan":
        data = bytearray(open(argv[1], "rb").read())
        at = data.find(b"MTPCPLAN")
        while at >= 0 and data[at + 20:at + 24] != b"MTPP":
            at = data.find(b"MTPCPLAN", at + 1)
        if at < 0:
            print("no embedded plan")
            return 1
        data[at + 16:at + 20] = b"\xff\xff\xff\x7f"
        open(argv[2], "wb").write(bytes(data))
        print(f"patched the plan at offset {at + 16}")
        return 0
    print("unknown mode", argv[0])
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
