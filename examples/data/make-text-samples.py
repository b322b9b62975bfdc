#!/usr/bin/env python3
"""Writes the text samples in examples/data/text/ (seeded, so the files are
reproducible): written by the project from templates, not downloaded.

  ner_pos.{train,dev}.conll  CoNLL-2003 format: WORD POS CHUNK NER, one
                             token per line, blank lines between sentences
  pairs.{train,dev}.tsv      GLUE-like sentence pairs: index, sentence1,
                             sentence2, label (entailment / contradiction /
                             neutral)
  spans.{train,dev}.jsonl    SQuAD-like: question, context, answer
                             {"text", "start"} (a character offset)
  tokenizer.json             a WordPiece tokenizer trained on all of them
                             (BERT's [CLS] A [SEP] B [SEP] template)

    make-text-samples.py [OUT_DIR]
"""
import collections
import json
import os
import random
import sys

FIRST = ["Anna", "Ben", "Carla", "David", "Elena", "Farid", "Greta", "Hugo",
         "Ines", "Jonas", "Kira", "Luca", "Maya", "Noah", "Olga", "Pavel"]
LAST = ["Smith", "Novak", "Garcia", "Kowalski", "Tanaka", "Moreau", "Rossi",
        "Fischer", "Silva", "Larsen", "Ivanova", "Brown"]
CITY = ["Paris", "Berlin", "Lisbon", "Oslo", "Prague", "Madrid", "Vienna",
        "Dublin", "Warsaw", "Athens", "Geneva", "Kyoto"]
CITY2 = [("New", "York"), ("San", "Diego"), ("Buenos", "Aires"), ("Hong", "Kong")]
ORG = [("Acme",), ("Globex",), ("Initech",), ("Umbrella",), ("Stark", "Industries"),
       ("Wayne", "Enterprises"), ("Hooli",), ("Vandelay", "Industries")]
DAY = ["Monday", "Tuesday", "Friday", "Sunday"]
VERB_PAST = ["visited", "left", "reached", "toured"]


def person(rng):
    return [rng.choice(FIRST)] + ([rng.choice(LAST)] if rng.random() < 0.6 else [])


def city(rng):
    return list(rng.choice(CITY2)) if rng.random() < 0.25 else [rng.choice(CITY)]


def org(rng):
    return list(rng.choice(ORG))


def entity(words, kind, pos="NNP"):
    return [(w, pos, "I-NP", ("B-" if i == 0 else "I-") + kind) for i, w in enumerate(words)]


def plain(pairs):
    return [(w, p, c, "O") for w, p, c in pairs]


def ner_sentence(rng):
    t = rng.randrange(5)
    if t == 0:
        s = entity(person(rng), "PER") + plain([(rng.choice(VERB_PAST), "VBD", "B-VP")]) + \
            entity(city(rng), "LOC") + plain([("on", "IN", "B-PP")]) + \
            plain([(rng.choice(DAY), "NNP", "B-NP")])
    elif t == 1:
        s = entity(person(rng), "PER") + plain([("works", "VBZ", "B-VP"), ("for", "IN", "B-PP")]) + \
            entity(org(rng), "ORG") + plain([("in", "IN", "B-PP")]) + entity(city(rng), "LOC")
    elif t == 2:
        s = plain([("The", "DT", "B-NP"), ("office", "NN", "I-NP"), ("of", "IN", "B-PP")]) + \
            entity(org(rng), "ORG") + plain([("is", "VBZ", "B-VP"), ("in", "IN", "B-PP")]) + \
            entity(city(rng), "LOC")
    elif t == 3:
        s = entity(person(rng), "PER") + plain([("met", "VBD", "B-VP")]) + \
            entity(person(rng), "PER") + plain([("at", "IN", "B-PP")]) + entity(org(rng), "ORG")
    else:
        s = plain([("Yesterday", "NN", "B-NP")]) + entity(person(rng), "PER") + \
            plain([("flew", "VBD", "B-VP"), ("to", "TO", "B-PP")]) + entity(city(rng), "LOC")
    return s + [(".", ".", "O", "O")]


def write_conll(path, rng, n):
    with open(path, "w") as f:
        f.write("-DOCSTART- -X- -X- O\n\n")
        for _ in range(n):
            for w, p, c, e in ner_sentence(rng):
                f.write(f"{w} {p} {c} {e}\n")
            f.write("\n")


def pair(rng):
    p = " ".join(person(rng))
    c = " ".join(city(rng))
    day = rng.choice(DAY)
    s1 = f"{p} {rng.choice(VERB_PAST)} {c} on {day} ."
    kind = rng.randrange(3)
    if kind == 0:
        s2 = rng.choice([f"{p} was in {c} .", f"{p} went to {c} .", f"On {day} {p} was in {c} ."])
        label = "entailment"
    elif kind == 1:
        s2 = rng.choice([f"{p} was never in {c} .", f"{p} did not go to {c} .",
                         f"{p} has not seen {c} ."])
        label = "contradiction"
    else:
        o = " ".join(org(rng))
        s2 = rng.choice([f"{p} works for {o} .", f"{p} likes {o} .", f"{o} hired {p} ."])
        label = "neutral"
    return s1, s2, label


def write_pairs(path, rng, n):
    with open(path, "w") as f:
        f.write("index\tsentence1\tsentence2\tlabel\n")
        for i in range(n):
            s1, s2, label = pair(rng)
            f.write(f"{i}\t{s1}\t{s2}\t{label}\n")


def span(rng):
    p, c, o = " ".join(person(rng)), " ".join(city(rng)), " ".join(org(rng))
    order = rng.randrange(2)
    context = (f"{p} lives in {c} and works for {o} ." if order == 0
               else f"{p} works for {o} and lives in {c} .")
    q = rng.randrange(3)
    if q == 0:
        question, answer = f"Where does {p} live ?", c
    elif q == 1:
        question, answer = f"Who works for {o} ?", p
    else:
        question, answer = f"Which company employs {p} ?", o
    return {"question": question, "context": context,
            "answer": {"text": answer, "start": context.index(answer)}}


def write_spans(path, rng, n):
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps(span(rng)) + "\n")


def wordpiece_vocab(words, size, specials):
    """WordPiece's vocabulary learnt as its trainer does (BPE merges over the
    word counts, later pieces prefixed "##"), but with ties broken by the
    pieces' text: the tokenizers library's trainer breaks them by a hash map's
    order, so its vocabulary (and every id) changed from run to run."""
    split = {w: [w[0]] + ["##" + ch for ch in w[1:]] for w in words}
    vocab = list(specials)
    for piece in sorted({p for ps in split.values() for p in ps}, key=lambda p: (p.startswith("##"), p)):
        vocab.append(piece)
    while len(vocab) < size:
        pairs = collections.Counter()
        for w, ps in split.items():
            for a, b in zip(ps, ps[1:]):
                pairs[a, b] += words[w]
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merged = a + b[2:]
        for w, ps in split.items():
            i, out = 0, []
            while i < len(ps):
                if i + 1 < len(ps) and ps[i] == a and ps[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(ps[i])
                    i += 1
            split[w] = out
        if merged not in vocab:
            vocab.append(merged)
    return {p: i for i, p in enumerate(vocab)}


def write_tokenizer(out, corpus):
    import tokenizers
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    words = collections.Counter()
    for line in open(corpus):
        for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(line)):
            words[w] += 1
    # A small vocabulary, so names split into sub-tokens (the tag alignment
    # has later sub-tokens to leave unscored).
    vocab = wordpiece_vocab(words, 300, specials)
    tok = tokenizers.Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(specials)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.save(os.path.join(out, "tokenizer.json"))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "text")
    os.makedirs(out, exist_ok=True)
    rng = random.Random(2026)
    write_conll(os.path.join(out, "ner_pos.train.conll"), rng, 400)
    write_conll(os.path.join(out, "ner_pos.dev.conll"), rng, 100)
    write_pairs(os.path.join(out, "pairs.train.tsv"), rng, 400)
    write_pairs(os.path.join(out, "pairs.dev.tsv"), rng, 100)
    write_spans(os.path.join(out, "spans.train.jsonl"), rng, 400)
    write_spans(os.path.join(out, "spans.dev.jsonl"), rng, 100)
    # The tokenizer learns from plain text of every sample.
    corpus = os.path.join(out, ".corpus.txt")
    with open(corpus, "w") as f:
        for line in open(os.path.join(out, "ner_pos.train.conll")):
            if line.strip() and not line.startswith("-DOCSTART-"):
                f.write(line.split()[0] + " ")
        f.write("\n")
        for line in list(open(os.path.join(out, "pairs.train.tsv")))[1:]:
            f.write(" ".join(line.rstrip("\n").split("\t")[1:3]) + "\n")
        for line in open(os.path.join(out, "spans.train.jsonl")):
            r = json.loads(line)
            f.write(r["question"] + " " + r["context"] + "\n")
    write_tokenizer(out, corpus)
    os.remove(corpus)


if __name__ == "__main__":
    main()
