"""Compares mtprt-run's measured peaks with the plan's prediction.

  peak_gap.py TOL METRICS.jsonl          every step within TOL (a fraction),
                                         every rank's where the record has
                                         them (measured_peak_bytes_by_rank,
                                         against predicted_peak_bytes_by_rank
                                         where a pipeline has them);
                                         every evaluation too (its peak
                                         against the plan's eval peak)
  peak_gap.py --evals TOL METRICS.jsonl  the evaluations alone
  peak_gap.py --order A.jsonl B.jsonl .. measured and predicted peaks both
                                         strictly decreasing, A > B > ...
  peak_gap.py --fits BYTES M.jsonl       every measured peak <= BYTES
  peak_gap.py --same-losses A.jsonl B.jsonl  every step's task losses equal,
                                         bit for bit (the same training)
  peak_gap.py --close-losses TOL A.jsonl B.jsonl  every step's task losses
                                         equal to TOL, relative (the same
                                         training, rounded otherwise)
  peak_gap.py --continues TOL FULL.jsonl RESUMED.jsonl  each step RESUMED
                                         logged has FULL's losses to TOL,
                                         matched by step number
Prints one line per file; exits 1 on a violation.
"""
import json
import sys


def steps(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    rows = [r for r in rows if "measured_peak_bytes" in r]
    if not rows:
        sys.exit(f"{path}: no step records")
    return rows


def main(argv):
    if argv[0] == "--order":
        peaks = []
        for path in argv[1:]:
            rows = steps(path)
            peaks.append((max(r["measured_peak_bytes"] for r in rows),
                          rows[0]["predicted_peak_bytes"]))
        print("order measured", " > ".join(str(m) for m, _ in peaks),
              "predicted", " > ".join(str(p) for _, p in peaks))
        ok = all(a[0] > b[0] and a[1] > b[1] for a, b in zip(peaks, peaks[1:]))
        return 0 if ok else 1
    if argv[0] == "--close-losses":
        tol, a, b = float(argv[1]), steps(argv[2]), steps(argv[3])
        worst = max((abs(x["loss"][k] - y["loss"][k]) / max(abs(x["loss"][k]), 1e-30)
                     for x, y in zip(a, b) for k in x["loss"]
                     if x["loss"][k] is not None), default=0.0)
        close = len(a) == len(b) and worst <= tol
        print(f"losses within {tol:g} over {len(a)} steps: {close} (worst {worst:.1e})")
        return 0 if close else 1
    if argv[0] == "--continues":
        tol, a, b = float(argv[1]), steps(argv[2]), steps(argv[3])
        full = {r["step"]: r["loss"] for r in a}
        worst = max((abs(full[r["step"]][k] - r["loss"][k]) /
                     max(abs(full[r["step"]][k]), 1e-30)
                     for r in b if r["step"] in full for k in r["loss"]
                     if r["loss"][k] is not None), default=0.0)
        ok = all(r["step"] in full for r in b) and worst <= tol
        first, last = b[0]["step"], b[-1]["step"]
        print(f"continues steps {first}-{last} within {tol:g}: {ok} "
              f"({'same' if worst == 0 else f'worst {worst:.1e}'})")
        return 0 if ok else 1
    if argv[0] == "--same-losses":
        a, b = steps(argv[1]), steps(argv[2])
        same = len(a) == len(b) and all(x["loss"] == y["loss"] for x, y in zip(a, b))
        print(f"same losses over {len(a)} steps: {same}")
        return 0 if same else 1
    if argv[0] == "--fits":
        budget = int(argv[1])
        worst = max(r["measured_peak_bytes"] for r in steps(argv[2]))
        print(f"fits {worst} <= {budget}: {worst <= budget}")
        return 0 if worst <= budget else 1
    evals_only = argv[0] == "--evals"
    if evals_only:
        argv = argv[1:]
    tol = float(argv[0])
    bad = 0
    for r in [] if evals_only else steps(argv[1]):
        p, m = r["predicted_peak_bytes"], r["measured_peak_bytes"]
        gap = m / p - 1
        # More than one process: every rank's peak within TOL too.
        ranks = r.get("measured_peak_bytes_by_rank") or []
        # A pipeline: each rank against its own stage's prediction.
        preds = r.get("predicted_peak_bytes_by_rank") or [p] * len(ranks)
        worst = max((x / q - 1 for x, q in zip(ranks, preds)), key=abs,
                    default=gap)
        ok = abs(gap) <= tol and abs(worst) <= tol
        bad += not ok
        print(f"step {r['step']} predicted {p} measured {m} "
              f"gap {100 * gap:+.2f}% {'ok' if ok else 'OVER'}" +
              (f" ({len(ranks)} ranks, worst {100 * worst:+.2f}%)" if ranks else ""))
    evals = [r for r in (json.loads(l) for l in open(argv[1]) if l.strip())
             if "eval" in r]
    if evals_only and not evals:
        sys.exit(f"{argv[1]}: no evaluation records")
    for r in evals:
        p, m = r.get("predicted_peak_bytes"), r.get("peak_bytes")
        if p is None or m is None:
            print(f"eval at step {r['step']}: no predicted or measured peak")
            bad += 1
            continue
        gap = m / p - 1
        ok = abs(gap) <= tol
        bad += not ok
        print(f"eval at step {r['step']} predicted {p} measured {m} "
              f"gap {100 * gap:+.2f}% {'ok' if ok else 'OVER'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
