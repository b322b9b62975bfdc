#!/usr/bin/env python3
"""eval_check.py above METRICS.jsonl TASK.METRIC=MIN...
       the last "eval" record's metrics at least MIN each
   eval_check.py recompute PREDS.jsonl METRICS.jsonl STEP
       the metrics of --predict's records recomputed by scikit-learn, seqeval
       and the SQuAD formula equal the evaluation's at STEP to 1e-9
   eval_check.py perplexity METRICS.jsonl TASK
       every evaluation's TASK perplexity is exp of its loss (to 1e-9) and
       its token accuracy a fraction"""
import math
import collections
import json
import sys


def evals(path):
    return [r for r in map(json.loads, open(path)) if "eval" in r]


def above(argv):
    rows = evals(argv[0])
    ok = True
    for r in rows:
        parts = []
        for spec in argv[1:]:
            key, least = spec.split("=")
            task, metric = key.split(".")
            v = r["eval"][task][metric]
            parts.append(f"{key} {v:.3f}")
            if r is rows[-1] and not (v is not None and v >= float(least)):
                ok = False
        print(f"step {r['step']}: " + " ".join(parts) + (": above chance" if r is rows[-1] and ok else ""))
    return 0 if ok else 1


def perplexity(argv):
    rows = evals(argv[0])
    ok = bool(rows)
    for r in rows:
        m = r["eval"][argv[1]]
        same = abs(m["perplexity"] - math.exp(m["loss"])) <= 1e-9 * m["perplexity"]
        frac = 0 <= m["token_accuracy"] <= 1
        ok &= same and frac
        print(f"step {r['step']}: {argv[1]} perplexity {'= exp(loss)' if same else 'WRONG'}, "
              f"token_accuracy {'in [0, 1]' if frac else 'WRONG'}")
    return 0 if ok else 1


def squad_f1(gold, pred):
    common = collections.Counter(pred) & collections.Counter(gold)
    same = sum(common.values())
    if not gold or not pred:
        return float(gold == pred)
    if same == 0:
        return 0.0
    p, r = same / len(pred), same / len(gold)
    return 2 * p * r / (p + r)


def recompute(argv):
    import seqeval.metrics
    import sklearn.metrics
    preds = [json.loads(l) for l in open(argv[0])]
    want = {r["step"]: r["eval"] for r in evals(argv[1])}[int(argv[2])]
    bad = 0

    def same(task, metric, value):
        nonlocal bad
        got = want[task][metric]
        if abs(got - value) > 1e-9:
            print(f"{task}.{metric}: evaluation {got!r}, recomputed {value!r}")
            bad += 1

    for task in ("pos", "ner"):
        gold_seqs, pred_seqs, flat_g, flat_p = [], [], [], []
        for r in preds:
            if task not in r.get("gold", {}):
                continue
            g = [x for x in r["gold"][task] if x is not None]
            p = [y for x, y in zip(r["gold"][task], r[task]) if x is not None]
            gold_seqs.append(g)
            pred_seqs.append([y if isinstance(y, str) else "O" for y in p])
            flat_g += g
            flat_p += [str(y) for y in p]
        same(task, "token_accuracy", sklearn.metrics.accuracy_score(flat_g, flat_p))
        if task == "ner":
            same(task, "entity_precision", seqeval.metrics.precision_score(gold_seqs, pred_seqs))
            same(task, "entity_recall", seqeval.metrics.recall_score(gold_seqs, pred_seqs))
            same(task, "entity_f1", seqeval.metrics.f1_score(gold_seqs, pred_seqs))
            print("ner: token_accuracy, entity_precision, entity_recall, entity_f1 equal (seqeval)")
        else:
            print("pos: token_accuracy equal")
    g = [r["gold"]["nli"] for r in preds if "nli" in r.get("gold", {})]
    p = [r["nli"] for r in preds if "nli" in r.get("gold", {})]
    same("nli", "accuracy", sklearn.metrics.accuracy_score(g, p))
    same("nli", "macro_f1", sklearn.metrics.f1_score(g, p, average="macro", zero_division=0))
    print("nli: accuracy, macro_f1 equal (scikit-learn)")
    spans = [(r["gold"]["qa"]["tokens"], r["qa"]["tokens"]) for r in preds if "qa" in r.get("gold", {})]
    same("qa", "exact_match", sum(g == p for g, p in spans) / len(spans))
    same("qa", "token_f1", sum(squad_f1(g, p) for g, p in spans) / len(spans))
    print("qa: exact_match, token_f1 equal (SQuAD formula)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit({"above": above, "recompute": recompute,
              "perplexity": perplexity}[sys.argv[1]](sys.argv[2:]))
