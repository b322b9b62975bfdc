#!/usr/bin/env python3
"""Checks a shard `mtpc prepare` wrote against the text it came from.

    shard_check.py SHARD TOKENIZER.json conll TASK   one line per sentence's
        first words: each word's first sub-token carries its tag id, the
        rest and the specials -1
    shard_check.py SHARD TOKENIZER.json pairs        types 0 then 1, lengths
    shard_check.py SHARD TOKENIZER.json spans TASK   the span's tokens decode
        to the answer
Prints a summary; exits 1 on a mismatch.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools", "prepare"))
import mtpc_prepare  # noqa: E402
import tokenizers  # noqa: E402


def main(argv):
    path, tok_path, kind = argv[:3]
    seq, tasks, tokens, lengths, types, present, labels = mtpc_prepare.read_shard(path)
    tok = tokenizers.Tokenizer.from_file(tok_path)
    names = {n: l for n, _, l in tasks}
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    bad = 0
    if kind == "conll":
        task = argv[3]
        scored = ignored = 0
        for r in range(len(tokens)):
            if not present[task][r]:
                continue
            ids = tokens[r][:lengths[r]].tolist()
            row = labels[task][r]
            if ids[0] != cls or ids[-1] != sep:
                bad += 1
            for i, t in enumerate(ids):
                piece = tok.id_to_token(t)
                first = t not in (cls, sep) and not piece.startswith("##")
                if first != (row[i] >= 0):
                    bad += 1
                scored += first
                ignored += not first
            if (row[lengths[r]:] != -1).any():
                bad += 1
        print(f"{task}: {scored} first sub-tokens scored, {ignored} others not; "
              f"labels {names[task]}; mismatches {bad}")
    elif kind == "pairs":
        pairs = 0
        for r in range(len(tokens)):
            t = types[r][:lengths[r]].tolist()
            if 1 in t:
                pairs += 1
                k = t.index(1)
                if any(t[:k]) or not all(t[k:]) or tokens[r][k - 1] != sep:
                    bad += 1
            if (tokens[r][lengths[r]:] != 0).any():
                bad += 1
        print(f"pairs: {pairs} of {len(tokens)} records with a second segment; "
              f"padding {seq - int(lengths.min())} at most; mismatches {bad}")
    else:
        task = argv[3]
        n = 0
        answers = [json.loads(l)["answer"]["text"] for l in open(argv[4])]
        k = 0
        for r in range(len(tokens)):
            if not present[task][r]:
                continue
            s, e = labels[task][r].astype(int).tolist()
            text = tok.decode(tokens[r][s:e + 1].tolist())
            if text.replace(" ", "") != answers[k].lower().replace(" ", ""):
                bad += 1
            k += 1
            n += 1
        print(f"{task}: {n} spans decode to their answers; mismatches {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
