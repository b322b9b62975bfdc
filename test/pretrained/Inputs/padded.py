#!/usr/bin/env python3
"""Writes N JSON Lines records of SEQ token ids below VOCAB, each padded
(token 0) after a random length, with token types (a sentence pair: the
second half of the real tokens is type 1), a class for task `topic` and
tags for task `pos` (-1, not scored, on the padding).

    padded.py OUT N SEQ VOCAB
"""
import json
import random
import sys

out, n, seq, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(7)
with open(out, "w") as f:
    for i in range(n):
        length = seq if i == 0 else rng.randint(3, seq - 1)
        tokens = [rng.randrange(1, vocab) for _ in range(length)] + [0] * (seq - length)
        types = [0] * (length // 2) + [1] * (length - length // 2) + [0] * (seq - length)
        f.write(json.dumps({"tokens": tokens, "length": length, "types": types,
                            "labels": {"topic": tokens[1] % 3,
                                       "pos": [t % 5 for t in tokens[:length]]
                                              + [-1] * (seq - length)}}) + "\n")
