"""Checks a training binary's metrics (JSON Lines) end to end.

  e2e_check.py --losses-fall M.jsonl      each task's mean loss over the last
                                          5 records is below the first 5's
  e2e_check.py --predicted PLAN.json M.jsonl
                                          the metrics' predicted_peak_bytes is
                                          the planned peak `mtpc plan` printed
  e2e_check.py --patch-plan BINARY OUT [--fix-crc]
                                          OUT = BINARY with its embedded
                                          plan's root offset broken (and,
                                          with --fix-crc, its frame's CRC-32
                                          made to match: a forged plan)
Prints one line; exits 1 when the check fails.
"""
import json
import zlib
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
        # The embedded plan: "MTPCPLAN", the size (u64), then the plan file:
        # its 24-byte frame ("MTPPLAN\n", version, CRC-32, length) and the
        # flatbuffer, whose first 4 bytes are its root offset.
        data = bytearray(open(argv[1], "rb").read())
        at = data.find(b"MTPCPLAN")
        while at >= 0 and data[at + 16:at + 24] != b"MTPPLAN\n":
            at = data.find(b"MTPCPLAN", at + 1)
        if at < 0:
            print("no embedded plan")
            return 1
        frame = at + 16
        flat = frame + 24
        length = int.from_bytes(data[frame + 16:frame + 24], "little")
        data[flat:flat + 4] = b"\xff\xff\xff\x7f"
        if "--fix-crc" in argv[3:]:
            crc = zlib.crc32(bytes(data[flat:flat + length]))
            data[frame + 12:frame + 16] = crc.to_bytes(4, "little")
        open(argv[2], "wb").write(bytes(data))
        print(f"patched the plan at offset {flat}")
        return 0
    print("unknown mode", argv[0])
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
