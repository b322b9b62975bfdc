#!/usr/bin/env python3
"""sp_check.py NER.shard PAIRS.shard SP.model CONLL: the sentencepiece
shards against the text: each CoNLL word's first piece carries its tag (the
word's pieces re-encoded), the rest -1; pair records start with BOS."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools", "prepare"))
import mtpc_prepare  # noqa: E402
import sentencepiece  # noqa: E402


def main(ner, pairs, model, conll):
    sp = sentencepiece.SentencePieceProcessor(model_file=model)
    seq, tasks, tokens, lengths, types, present, labels = mtpc_prepare.read_shard(ner)
    names = {n: l for n, _, l in tasks}["ner"]
    sentences = [s for _, s in mtpc_prepare.read_conll(conll)]
    bad = 0
    for r, s in enumerate(sentences):
        pos = 1  # after BOS
        for word, tag in zip(s["0"], s["3"]):
            pieces = sp.encode(word)
            for k, p in enumerate(pieces):
                if pos >= seq:
                    break
                want = names.index(tag) if k == 0 else -1
                bad += int(tokens[r][pos] != p) + int(labels["ner"][r][pos] != want)
                pos += 1
    print(f"ner: every word's first piece tagged, {bad} mismatches")
    seq, tasks, tokens, lengths, types, present, labels = mtpc_prepare.read_shard(pairs)
    bad = sum(int(tokens[r][0] != sp.bos_id()) for r in range(len(tokens)))
    typed = int((types.sum(axis=1) > 0).sum())
    print(f"pairs: BOS first, segment 2 typed 1 in {typed} records, {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
