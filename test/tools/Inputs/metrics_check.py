#!/usr/bin/env python3
"""metrics_check.py MTPRT_METRICS DIR: random and edge cases through
mtprt-metrics and through scikit-learn / scipy / seqeval / the SQuAD
formula; every value equal to 1e-9 (NaN where both are NaN)."""
import collections
import json
import math
import os
import random
import subprocess
import sys
import warnings

import numpy as np
import scipy.stats
import seqeval.metrics
import sklearn.metrics

warnings.filterwarnings("ignore")


class Batch:
    """Cases queued, then run through mtprt-metrics in one process (it links
    LibTorch: its start-up, not the metrics, is what a process costs)."""

    def __init__(self, tool, work):
        self.tool, self.work, self.cases, self.checks = tool, work, [], []

    def add(self, case, check):
        self.cases.append(case)
        self.checks.append(check)

    def run(self):
        path = os.path.join(self.work, "cases.json")
        with open(path, "w") as f:
            json.dump(self.cases, f)
        out = subprocess.run([self.tool, path], capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"mtprt-metrics failed: {out.stderr}")
        for got, check in zip(json.loads(out.stdout), self.checks):
            check(got)
        self.cases, self.checks = [], []


def same(a, b, what, case):
    a = float("nan") if a is None else a
    if (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-9:
        return
    sys.exit(f"{what}: mtprt {a!r}, reference {b!r}\ncase: {json.dumps(case)[:2000]}")


def squad_f1(gold, pred):
    # SQuAD v1.1's f1_score on token lists (here: token ids).
    common = collections.Counter(pred) & collections.Counter(gold)
    num_same = sum(common.values())
    if len(gold) == 0 or len(pred) == 0:
        return float(gold == pred)
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred)
    recall = num_same / len(gold)
    return 2 * precision * recall / (precision + recall)


def main(tool, work):
    rng = random.Random(5)
    batch = Batch(tool, work)
    # Classification.
    for i in range(200):
        n = rng.randint(1, 60)
        k = rng.randint(1, 6)
        gold = [rng.randrange(k) for _ in range(n)]
        pred = [g if rng.random() < 0.5 else rng.randrange(k + (i % 3)) for g in gold]
        case = {"classify": {"gold": gold, "pred": pred}}

        def check(got, gold=gold, pred=pred, case=case):
            same(got["accuracy"], sklearn.metrics.accuracy_score(gold, pred), "accuracy", case)
            same(got["macro_f1"], sklearn.metrics.f1_score(gold, pred, average="macro",
                                                            zero_division=0), "macro_f1", case)
        batch.add(case, check)
    batch.run()
    print("classification: 200 cases agree with scikit-learn")
    # Regression.
    nans = 0
    for i in range(200):
        n = rng.randint(2, 50)
        kind = i % 5
        if kind == 0:
            gold = [float(rng.randint(0, 3)) for _ in range(n)]  # ties
        elif kind == 1:
            gold = [1.5] * n  # constant: NaN correlations
        else:
            gold = [rng.gauss(0, 2) for _ in range(n)]
        pred = [g + rng.gauss(0, 1) if kind != 4 else float(rng.randint(0, 2)) for g in gold]
        case = {"regress": {"gold": gold, "pred": pred}}
        if np.std(gold) == 0 or np.std(pred) == 0:
            ref_p = ref_s = float("nan")
            nans += 1
        else:
            ref_p = scipy.stats.pearsonr(gold, pred)[0]
            ref_s = scipy.stats.spearmanr(gold, pred)[0]

        def check(got, gold=gold, pred=pred, case=case, ref_p=ref_p, ref_s=ref_s):
            same(got["mse"], sklearn.metrics.mean_squared_error(gold, pred), "mse", case)
            same(got["pearson"], float(ref_p), "pearson", case)
            same(got["spearman"], float(ref_s), "spearman", case)
        batch.add(case, check)
    batch.run()
    print(f"regression: 200 cases agree with scikit-learn and scipy (incl. {nans} NaN)")
    # Tagging: BIO, IOB2, IOBES, stray I-, types with dashes.
    schemes = [["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
               ["O", "I-PER", "I-LOC", "B-LOC"],
               ["O", "B-X", "I-X", "E-X", "S-X", "B-Y", "E-Y", "S-Y"],
               ["O", "B-MISC-A", "I-MISC-A", "B-ORG"]]
    for i in range(200):
        tags = schemes[i % len(schemes)]
        gold, pred = [], []
        for _ in range(rng.randint(1, 8)):
            n = rng.randint(1, 12)
            g = [rng.choice(tags) for _ in range(n)]
            p = [t if rng.random() < 0.6 else rng.choice(tags) for t in g]
            gold.append(g)
            pred.append(p)
        case = {"tags": {"gold": gold, "pred": pred}}

        def check(got, gold=gold, pred=pred, case=case):
            same(got["entity_precision"], seqeval.metrics.precision_score(gold, pred),
                 "entity precision", case)
            same(got["entity_recall"], seqeval.metrics.recall_score(gold, pred),
                 "entity recall", case)
            same(got["entity_f1"], seqeval.metrics.f1_score(gold, pred), "entity f1", case)
        batch.add(case, check)
    batch.run()
    print("tagging: 200 cases agree with seqeval")
    # Spans: the answer's token ids.
    for i in range(200):
        spans = []
        for _ in range(rng.randint(1, 10)):
            g = [rng.randrange(8) for _ in range(rng.randint(0 if i % 7 == 0 else 1, 5))]
            p = g if rng.random() < 0.3 else [rng.randrange(8) for _ in range(rng.randint(0, 5))]
            spans.append({"gold": g, "pred": p})
        em = sum(s["gold"] == s["pred"] for s in spans) / len(spans)
        f1 = sum(squad_f1(s["gold"], s["pred"]) for s in spans) / len(spans)

        def check(got, em=em, f1=f1, spans=spans):
            same(got["exact_match"], em, "exact match", spans)
            same(got["token_f1"], f1, "token f1", spans)
        batch.add({"spans": spans}, check)
    batch.run()
    print("spans: 200 cases agree with the SQuAD formula")


if __name__ == "__main__":
    main(*sys.argv[1:])
