#!/usr/bin/env python3
"""mtpc prepare: text in, the binary shard the runtime reads out.

`mtpc prepare SPEC INPUT -o OUT.shard [options]` runs this with the spec's
model and tasks (a request file mtpc writes); see docs/data.md. It reads JSON
Lines, CSV/TSV (a header row) or CoNLL (a token per line, tags in columns,
blank lines between sentences), tokenizes with a Hugging Face
`tokenizer.json` or a sentencepiece `.model` (by default the pretrained
backbone's), aligns word-level tags to sub-tokens (the first sub-token
labelled, the rest not scored), maps label strings to ids, pads/truncates to
the spec's `seq` and writes shard version 2 (docs/runtime-services.md §4)
plus the label vocabulary beside it (OUT.labels.json, to reuse for held-out
data with --label-vocab).

Errors name FILE:LINE and the column; --skip-bad counts bad records and goes
on. Exit codes: 0 ok, 1 bad data, 2 wrong usage.
"""
import argparse
import csv
import json
import os
import struct
import sys

MAGIC = b"MTPRTSHD"
VERSION = 2
HAS_LENGTHS, HAS_TYPES = 1, 2
IGNORE = -1
MAX_NAME = 4096


class Bad(Exception):
    """A record the shard cannot take: `where` is FILE:LINE."""

    def __init__(self, where, what):
        super().__init__(f"{where}: {what}")
        self.where, self.what = where, what


class Usage(Exception):
    pass


# --------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------

class HfTokenizer:
    """A Hugging Face tokenizer.json: its own special tokens and pair
    template, offsets and word ids."""

    def __init__(self, path, seq):
        import tokenizers
        try:
            self.full = tokenizers.Tokenizer.from_file(path)
            self.cut = tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # the library's message names what is wrong
            raise Usage(f"{path}: not a tokenizer.json this tokenizers reads: {e}")
        self.path = path
        for t in (self.full, self.cut):
            t.no_padding()
            t.no_truncation()
        self.cut.enable_truncation(max_length=seq, strategy="longest_first")
        self.pad = None
        if self.full.padding:
            self.pad = self.full.padding.get("pad_id")
        for name in ("[PAD]", "<pad>", "<|endoftext|>", "</s>"):
            if self.pad is None:
                self.pad = self.full.token_to_id(name)
        if self.pad is None:
            self.pad = 0
        self.offsets = True

    def encode(self, a, b=None, words=False):
        """(ids, type ids, word ids, sequence ids, offsets, truncated)."""
        e = self.cut.encode(a, b, is_pretokenized=words)
        truncated = bool(e.overflowing)
        return (list(e.ids), list(e.type_ids), list(e.word_ids),
                list(e.sequence_ids), list(e.offsets), truncated)

    def plain(self, text):
        return self.full.encode(text, add_special_tokens=False).ids


class SpTokenizer:
    """A sentencepiece model: no pair template of its own; BOS first where
    the model has one, a pair's second text after the first with type 1."""

    def __init__(self, path, seq):
        try:
            import sentencepiece
        except ImportError:
            raise Usage("a sentencepiece .model needs the sentencepiece package "
                        "(scripts/setup.sh installs it into the project's venv)")
        try:
            self.sp = sentencepiece.SentencePieceProcessor(model_file=path)
        except Exception as e:
            raise Usage(f"{path}: not a sentencepiece model: {e}")
        self.path, self.seq = path, seq
        self.pad = max(self.sp.pad_id(), 0)
        self.offsets = False

    def encode(self, a, b=None, words=False):
        ids, types, wids, sids = [], [], [], []
        if self.sp.bos_id() >= 0:
            ids, types, wids, sids = [self.sp.bos_id()], [0], [None], [None]
        for s, text in enumerate([a] if b is None else [a, b]):
            pieces = ([self.sp.encode(w) for w in text] if words
                      else [self.sp.encode(text)])
            for w, p in enumerate(pieces):
                ids += p
                types += [s] * len(p)
                wids += [w if words else None] * len(p)
                sids += [s] * len(p)
        truncated = len(ids) > self.seq
        n = self.seq
        return ids[:n], types[:n], wids[:n], sids[:n], [None] * min(n, len(ids)), truncated

    def plain(self, text):
        return self.sp.encode(text)


def load_tokenizer(path, seq):
    if os.path.isdir(path):
        for name in ("tokenizer.json", "tokenizer.model", "spiece.model",
                     "sentencepiece.bpe.model"):
            if os.path.exists(os.path.join(path, name)):
                return load_tokenizer(os.path.join(path, name), seq)
        raise Usage(f"{path}: no tokenizer.json or sentencepiece .model in it; "
                    "give one with --tokenizer")
    if not os.path.exists(path):
        raise Usage(f"{path}: no such tokenizer file")
    if path.endswith(".json"):
        return HfTokenizer(path, seq)
    return SpTokenizer(path, seq)


# --------------------------------------------------------------------------
# Readers: each yields (line, record) with record a dict column -> value
# --------------------------------------------------------------------------

def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                yield n, Bad(f"{path}:{n}", f"malformed JSON at column {e.colno}: {e.msg}")
                continue
            except RecursionError:
                yield n, Bad(f"{path}:{n}", "JSON nested too deeply for a record")
                continue
            if not isinstance(rec, dict):
                yield n, Bad(f"{path}:{n}", "a record must be a JSON object")
                continue
            yield n, rec


def read_table(path, delimiter, check_header=None):
    """Rows as dicts by the header's names; `check_header(header)` sees the
    header first. The file is opened once (a pipe can be read once)."""
    with open(path, encoding="utf-8", newline="") as f:
        quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
        # strict: a quote left open is an error at the line it opened on,
        # not a short row (it swallowed the rest of the file) further on.
        reader = csv.reader(f, delimiter=delimiter, quoting=quoting, strict=True)
        header = None
        rows = iter(reader)
        while True:
            start = reader.line_num + 1
            try:
                row = next(rows)
            except StopIteration:
                break
            except csv.Error as e:
                raise Bad(f"{path}:{start}", f"{e}: a quoted field opened on this line is "
                                             "not closed, or text follows its closing quote")
            n = reader.line_num
            if header is None:
                if not row:
                    raise Bad(f"{path}:{n}", "the first line must be a header naming the columns")
                header = row
                if check_header:
                    check_header(header)
                continue
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != len(header):
                yield n, Bad(f"{path}:{n}", f"{len(row)} columns, the header has {len(header)}")
                continue
            yield n, dict(zip(header, row))


def read_conll(path):
    """Sentences: (first line, {column index: [values]})."""
    with open(path, encoding="utf-8") as f:
        rows, first, width = [], None, None
        for n, line in enumerate(f, 1):
            cols = line.split()
            if not cols or cols[0] == "-DOCSTART-":
                if rows:
                    yield first, conll_sentence(rows)
                rows, first, width = [], None, None
                continue
            if first is None:
                first, width = n, len(cols)
            elif len(cols) != width:
                # The sentence is bad; skip to its end.
                rows.append((n, Bad(f"{path}:{n}", f"{len(cols)} columns, the sentence's "
                                                   f"first token (line {first}) has {width}")))
                continue
            rows.append((n, cols))
        if rows:
            yield first, conll_sentence(rows)


def conll_sentence(rows):
    for _, cols in rows:
        if isinstance(cols, Bad):
            return cols
    width = len(rows[0][1])
    rec = {str(i): [cols[i] for _, cols in rows] for i in range(width)}
    rec["_lines"] = [n for n, _ in rows]
    return rec


# --------------------------------------------------------------------------
# Labels
# --------------------------------------------------------------------------

class Vocab:
    """A task's label strings -> ids: given (--label-vocab, fixed) or grown
    from the data (then sorted: numerically where every label is a number)."""

    def __init__(self, task, limit, names=None, source=None):
        self.task, self.limit, self.source = task, limit, source
        self.fixed = names is not None
        self.names = list(names or [])
        self.ids = {s: i for i, s in enumerate(self.names)}

    def id(self, label, where):
        label = label.strip()
        if not label:
            raise Bad(where, f"task '{self.task}': empty label")
        if len(label.encode()) > MAX_NAME or any(ord(c) < 0x20 or ord(c) == 0x7f for c in label):
            raise Bad(where, f"task '{self.task}': label {label[:40]!r} has a control "
                             f"character or is over {MAX_NAME} bytes")
        if label in self.ids:
            return self.ids[label]
        if self.fixed:
            shown = ", ".join(self.names[:12]) + (" ..." if len(self.names) > 12 else "")
            raise Bad(where, f"task '{self.task}': unknown label '{label}' (the vocabulary "
                             f"from {self.source} has {shown})")
        if len(self.names) >= self.limit:
            raise Bad(where, f"task '{self.task}': label '{label}' would be label number "
                             f"{len(self.names) + 1}, but the spec gives the task {self.limit}")
        self.ids[label] = len(self.names)
        self.names.append(label)
        return self.ids[label]

    def order(self):
        """Final ids: sorted unless fixed. Returns old id -> new id."""
        if self.fixed:
            return list(range(len(self.names)))
        def key(s):
            try:
                return (0, float(s), s)
            except ValueError:
                return (1, 0.0, s)
        ordered = sorted(self.names, key=key)
        remap = [ordered.index(s) for s in self.names]
        self.names = ordered
        self.ids = {s: i for i, s in enumerate(ordered)}
        return remap


# --------------------------------------------------------------------------
# The preparation
# --------------------------------------------------------------------------

def width_of(task, seq):
    kind = task["head"]
    if kind == "classify":
        return task["classes"] if task["loss"] == "mse" else 1
    if kind == "tag":
        return seq
    if kind == "span":
        return 2
    return task["target_seq"]


class Prepared:
    def __init__(self, model, tasks):
        self.model, self.tasks = model, tasks
        self.seq = model["seq"]
        self.tokens, self.lengths, self.types = [], [], []
        self.present = {t["name"]: [] for t in tasks}
        self.labels = {t["name"]: [] for t in tasks}

    def add(self, ids, types, labels):
        seq = self.seq
        self.lengths.append(len(ids))
        self.tokens.append(ids + [self.pad] * (seq - len(ids)))
        self.types.append(types + [0] * (seq - len(types)))
        for t in self.tasks:
            name = t["name"]
            w = width_of(t, seq)
            if name in labels:
                self.present[name].append(1)
                self.labels[name].append(labels[name])
            else:
                self.present[name].append(0)
                self.labels[name].append([0.0] * w)


def text_of(rec, col, where, conll=False):
    if col not in rec:
        raise Bad(where, f"no column '{col}' (the record has: {', '.join(sorted(k for k in rec if not k.startswith('_')))})")
    v = rec[col]
    if isinstance(v, list):
        if not v or not all(isinstance(w, str) and w for w in v):
            raise Bad(where, f"column '{col}': expected a non-empty list of words")
        return v
    if not isinstance(v, str):
        raise Bad(where, f"column '{col}': expected text, got {type(v).__name__}")
    if not v.strip():
        raise Bad(where, f"column '{col}' is empty")
    return v


def missing(v):
    return v is None or (isinstance(v, str) and not v.strip())


def prepare(args, req):
    model, tasks = req["backbone"], req["tasks"]
    seq, vocab = model["seq"], model["vocab"]
    by_name = {t["name"]: t for t in tasks}

    # Which column holds each task's labels (default: the task's name).
    columns = {}
    for spec in args.task or []:
        if "=" not in spec:
            raise Usage(f"--task {spec}: expected TASK=COLUMN")
        name, col = spec.split("=", 1)
        if name not in by_name:
            raise Usage(f"--task {spec}: the spec has no task '{name}' "
                        f"(it has: {', '.join(by_name)})")
        columns[name] = col
    fmt = args.format
    if fmt == "auto":
        ext = os.path.splitext(args.input)[1].lower()
        fmt = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv",
               ".conll": "conll", ".txt": "conll"}.get(ext)
        if fmt is None:
            raise Usage(f"{args.input}: cannot tell the format from '{ext}'; "
                        "give --format jsonl|csv|tsv|conll")
    if not os.path.exists(args.input):
        raise Usage(f"{args.input}: no such file")
    if fmt == "conll":
        text_cols = (args.text or "0").split(",")
        if len(text_cols) != 1:
            raise Usage("--text: CoNLL has one word column")
        if not columns:
            raise Usage("CoNLL: name each task's tag column, e.g. --task ner=3 --task pos=1")
    else:
        text_cols = (args.text or "text").split(",")
        if len(text_cols) > 2:
            raise Usage("--text: one column, or two for a sentence pair")
        for t in tasks:
            columns.setdefault(t["name"], t["name"])

    tok_path = args.tokenizer or model.get("weights")
    if not tok_path:
        raise Usage("no tokenizer: give --tokenizer tokenizer.json|.model|DIR "
                    "(a pretrained backbone's directory is the default)")
    tok = load_tokenizer(tok_path, seq)

    given = {}
    if args.label_vocab:
        try:
            with open(args.label_vocab, encoding="utf-8") as f:
                given = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise Usage(f"{args.label_vocab}: cannot read the label vocabulary: {e}")
        if not isinstance(given, dict):
            raise Usage(f"{args.label_vocab}: expected an object task -> [labels]")
    vocabs = {}
    for t in tasks:
        if t["head"] in ("tag",) or (t["head"] == "classify" and t["loss"] != "mse"):
            names = given.get(t["name"])
            if names is not None and (not isinstance(names, list) or
                                      not all(isinstance(s, str) for s in names)):
                raise Usage(f"{args.label_vocab}: task {t['name']}: expected a list of strings")
            if names is not None and len(names) > t["classes"]:
                raise Usage(f"{args.label_vocab}: task {t['name']} has {len(names)} labels, "
                            f"the spec {t['classes']}")
            vocabs[t["name"]] = Vocab(t["name"], t["classes"], names,
                                      args.label_vocab if names is not None else None)

    out = Prepared(model, [t for t in tasks if t["name"] in columns])
    out.pad = tok.pad
    if not 0 <= tok.pad < vocab:
        raise Usage(f"{tok.path}: its padding id {tok.pad} is not in the model's vocab [0, {vocab})")
    stats = {"records": 0, "truncated": 0, "skipped": 0, "answers_lost": 0,
             "words_lost": 0, "words_empty": 0}
    first_bad = []

    def check_ids(ids, where):
        for i in ids:
            if not 0 <= i < vocab:
                raise Bad(where, f"the tokenizer gives id {i}, outside the model's vocab "
                                 f"[0, {vocab}): a tokenizer for another model? ({tok.path})")

    def record(n, rec):
        where = f"{args.input}:{n}"
        if fmt == "conll":
            words = rec[text_cols[0]] if text_cols[0] in rec else None
            if words is None:
                raise Bad(where, f"no column {text_cols[0]}")
            ids, types, wids, _, _, cut = tok.encode(words, words=True)
        else:
            texts = [text_of(rec, c, where) for c in text_cols]
            words = texts[0] if isinstance(texts[0], list) else None
            if words is not None and len(texts) > 1:
                raise Bad(where, "a pre-split word list takes one text column")
            ids, types, wids, sids, offsets, cut = tok.encode(
                texts[0], texts[1] if len(texts) > 1 else None, words=words is not None)
        if not ids:
            raise Bad(where, "the text gives no tokens")
        if len(ids) > seq:
            raise Usage(f"the backbone's seq {seq} is shorter than the tokenizer's own "
                        f"tokens around a text ({len(ids)} at the least): raise seq")
        check_ids(ids, where)
        if model.get("type_vocab", 0) <= 1:
            types = [0] * len(ids)
        labels = {}
        for t in out.tasks:
            name, col = t["name"], columns[t["name"]]
            if fmt == "conll":
                if col not in rec:
                    raise Bad(where, f"task '{name}': no column {col} (the sentence has "
                                     f"{len([k for k in rec if not k.startswith('_')])})")
                value = rec[col]
            else:
                value = rec.get(col)
                if missing(value):
                    continue  # the record has no label for this task
            kind = t["head"]
            if kind == "classify" and t["loss"] == "mse":
                vals = value if isinstance(value, list) else str(value).replace(",", " ").split()
                try:
                    vals = [float(v) for v in vals]
                except (TypeError, ValueError):
                    raise Bad(where, f"task '{name}': expected {t['classes']} number(s), got {value!r}")
                if len(vals) != t["classes"] or not all(abs(v) < 3.4e38 for v in vals):
                    raise Bad(where, f"task '{name}': expected {t['classes']} finite number(s), got {value!r}")
                labels[name] = vals
            elif kind == "classify":
                if isinstance(value, (dict, list, bool)):
                    raise Bad(where, f"task '{name}': a label is text or a number, "
                                     f"got {json.dumps(value)[:40]}")
                labels[name] = [float(vocabs[name].id(str(value), where))]
            elif kind == "tag":
                tags = value if isinstance(value, list) else None
                if tags is None or words is None:
                    raise Bad(where, f"task '{name}': tags need words (CoNLL, or a JSON "
                                     "list of words in the text column and of tags here)")
                if len(tags) != len(words):
                    raise Bad(where, f"task '{name}': {len(tags)} tags for {len(words)} words")
                if fmt == "conll":
                    lines = rec["_lines"]
                    tag_ids = [vocabs[name].id(str(g), f"{args.input}:{lines[i]}")
                               for i, g in enumerate(tags)]
                else:
                    tag_ids = [vocabs[name].id(str(g), where) for g in tags]
                row, seen = [float(IGNORE)] * seq, set()
                for pos, w in enumerate(wids):
                    if w is not None and w not in seen:
                        seen.add(w)
                        row[pos] = float(tag_ids[w])
                # Words past the cut are truncation's; a word the tokenizer
                # gives no token (a lone zero-width space) is not.
                last = max(seen) if seen else -1
                stats["words_lost"] += len(words) - 1 - last if cut else 0
                upto = last + 1 if cut else len(words)
                stats["words_empty"] += sum(1 for w in range(upto) if w not in seen)
                labels[name] = row
            elif kind == "span":
                if not tok.offsets:
                    raise Usage(f"task '{name}': span labels need a tokenizer.json (offsets)")
                labels_span = span_of(value, texts[-1], ids, sids, offsets,
                                      len(texts) - 1, where, name)
                if labels_span is None:
                    stats["answers_lost"] += 1
                    continue
                labels[name] = labels_span
            else:  # decoder
                target = tok.plain(str(value))
                check_ids(target, where)
                tv = t["target_vocab"] or vocab
                if any(i >= tv for i in target):
                    raise Bad(where, f"task '{name}': target id outside its vocab [0, {tv})")
                target = target[:t["target_seq"]]
                labels[name] = [float(i) for i in target] + [float(IGNORE)] * (t["target_seq"] - len(target))
        if cut:
            stats["truncated"] += 1
        out.add(ids, types, labels)
        stats["records"] += 1

    explicit = {name: col for name, col in columns.items()
                if any(spec.split("=", 1)[0] == name for spec in args.task or [])}
    if fmt == "conll":
        for name in columns:
            if by_name[name]["head"] != "tag":
                raise Usage(f"--task {name}: CoNLL columns hold tags; task '{name}' is a "
                            f"{by_name[name]['head']} task")
    def check_header(header):
        for col in text_cols + list(explicit.values()):
            if col not in header:
                raise Bad(f"{args.input}:1", f"no column '{col}' in the header "
                                             f"(it has: {', '.join(header)})")
    seen_columns = set()

    reader = {"jsonl": lambda: read_jsonl(args.input),
              "csv": lambda: read_table(args.input, ",", check_header),
              "tsv": lambda: read_table(args.input, "\t", check_header),
              "conll": lambda: read_conll(args.input)}[fmt]()
    last = 0
    try:
        for n, rec in reader:
            last = n
            try:
                if isinstance(rec, Bad):  # the reader's (malformed JSON, wrong width)
                    raise rec
                seen_columns.update(rec)
                record(n, rec)
            except Bad as e:
                if not args.skip_bad:
                    raise
                stats["skipped"] += 1
                first_bad.append(str(e))
    except UnicodeDecodeError as e:
        raise Bad(f"{args.input}:{last + 1}", f"not UTF-8 text ({e.reason} at byte "
                                             f"{e.start} of a read block); save it as UTF-8")
    for name, col in explicit.items():
        if col not in seen_columns:
            raise Bad(args.input, f"task '{name}': no record has column '{col}'")
    if stats["records"] == 0:
        raise Bad(args.input, "no records" + (f" ({stats['skipped']} bad, skipped)" if stats["skipped"] else ""))

    # Final label ids (sorted), applied to what was recorded.
    for name, v in vocabs.items():
        if name not in out.labels:
            continue
        remap = v.order()
        for r, row in enumerate(out.labels[name]):
            if out.present[name][r]:
                out.labels[name][r] = [float(remap[int(x)]) if x >= 0 else x for x in row]
    names = {n: v.names for n, v in vocabs.items() if n in out.labels and v.names}
    return out, names, stats, first_bad


def span_of(value, context, ids, sids, offsets, ctx_seq, where, name):
    """[start, end] token positions of the answer, or None where truncation
    took it. value: {"text": str, "start": char} (or SQuAD's lists)."""
    if not isinstance(value, dict):
        raise Bad(where, f"task '{name}': expected {{\"text\": ..., \"start\": character}}")
    text, start = value.get("text"), value.get("start", value.get("answer_start"))
    if isinstance(text, list):
        text = text[0] if text else None
    if isinstance(start, list):
        start = start[0] if start else None
    if not isinstance(text, str) or not text or not isinstance(start, int) or start < 0:
        raise Bad(where, f"task '{name}': expected {{\"text\": non-empty, \"start\": character >= 0}}")
    if context[start:start + len(text)] != text:
        raise Bad(where, f"task '{name}': the answer {text[:40]!r} is not at character {start} of the context")
    end = start + len(text)
    first = last = None
    for i, (s, off) in enumerate(zip(sids, offsets)):
        if s != ctx_seq or off is None or off[1] <= off[0]:
            continue
        if first is None and off[1] > start:
            first = i
        if off[0] < end:
            last = i
    if first is None or last is None or last < first or offsets[last][1] < end:
        return None
    return [float(first), float(last)]


# --------------------------------------------------------------------------
# Shards
# --------------------------------------------------------------------------

def write_shard(path, prep, names):
    import numpy as np
    seq = prep.seq
    n = len(prep.tokens)
    lengths = np.asarray(prep.lengths, dtype=np.int32)
    types = np.asarray(prep.types, dtype=np.uint8).reshape(n, seq)
    flags = (HAS_LENGTHS if (lengths < seq).any() else 0) | \
            (HAS_TYPES if types.any() else 0)
    tmp = path + ".tmp"
    try:
        write_shard_to(tmp, prep, names, lengths, types, flags)
        os.replace(tmp, path)
    except BaseException:
        # Nothing half-written stays behind.
        if os.path.isfile(tmp):
            os.remove(tmp)
        raise


def write_shard_to(tmp, prep, names, lengths, types, flags):
    import numpy as np
    seq, n = prep.seq, len(prep.tokens)
    with open(tmp, "wb") as f:
        f.write(MAGIC + struct.pack("<IIqqI", VERSION, len(prep.tasks), n, seq, flags))
        for t in prep.tasks:
            b = t["name"].encode()
            f.write(struct.pack("<I", len(b)) + b + struct.pack("<q", width_of(t, seq)))
            labels = names.get(t["name"], [])
            f.write(struct.pack("<I", len(labels)))
            for s in labels:
                sb = s.encode()
                f.write(struct.pack("<I", len(sb)) + sb)
        f.write(np.asarray(prep.tokens, dtype=np.int32).tobytes())
        if flags & HAS_LENGTHS:
            f.write(lengths.tobytes())
        if flags & HAS_TYPES:
            f.write(types.tobytes())
        for t in prep.tasks:
            f.write(np.asarray(prep.present[t["name"]], dtype=np.uint8).tobytes())
            f.write(np.asarray(prep.labels[t["name"]], dtype=np.float32)
                    .reshape(n, width_of(t, seq)).tobytes())


def read_shard(path):
    """A version 2 shard as (seq, tasks [(name, width, names)], arrays)."""
    try:
        return read_shard_bytes(path)
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise Usage(f"{path}: not a whole shard ({e}); prepare it again")


def read_shard_bytes(path):
    import numpy as np
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != MAGIC:
        raise Usage(f"{path}: not an mtprt shard")
    version, ntasks, n, seq = struct.unpack_from("<IIqq", data, 8)
    if version != VERSION:
        raise Usage(f"{path}: shard version {version}; --merge reads version {VERSION} "
                    "(prepare it again)")
    (flags,) = struct.unpack_from("<I", data, 32)
    at, tasks = 36, []
    for _ in range(ntasks):
        (ln,) = struct.unpack_from("<I", data, at)
        name = data[at + 4:at + 4 + ln].decode()
        at += 4 + ln
        (width,) = struct.unpack_from("<q", data, at)
        (count,) = struct.unpack_from("<I", data, at + 8)
        at += 12
        labels = []
        for _ in range(count):
            (sl,) = struct.unpack_from("<I", data, at)
            labels.append(data[at + 4:at + 4 + sl].decode())
            at += 4 + sl
        tasks.append((name, width, labels))
    tokens = np.frombuffer(data, np.int32, n * seq, at).reshape(n, seq)
    at += 4 * n * seq
    lengths = np.full(n, seq, np.int32)
    if flags & HAS_LENGTHS:
        lengths = np.frombuffer(data, np.int32, n, at).copy()
        at += 4 * n
    types = np.zeros((n, seq), np.uint8)
    if flags & HAS_TYPES:
        types = np.frombuffer(data, np.uint8, n * seq, at).reshape(n, seq)
        at += n * seq
    present, labels = {}, {}
    for name, width, _ in tasks:
        present[name] = np.frombuffer(data, np.uint8, n, at)
        at += n
        labels[name] = np.frombuffer(data, np.float32, n * width, at).reshape(n, width)
        at += 4 * n * width
    if at != len(data):
        raise Usage(f"{path}: {len(data) - at} bytes after the last task: not a whole shard")
    return seq, tasks, tokens, lengths, types, present, labels


def merge(args, req):
    """Interleaves the records of several shards of this spec (round robin,
    so batches mix the tasks); label names must agree where both have them."""
    shards = [read_shard(p) for p in args.merge]
    seq = req["backbone"]["seq"]
    widths, names = {}, {}
    for path, (s, tasks, *_rest) in zip(args.merge, shards):
        if s != seq:
            raise Usage(f"{path}: seq {s}, the spec has {seq}")
        for name, width, labels in tasks:
            widths[name] = width
            if labels:
                if names.get(name, labels) != labels:
                    raise Usage(f"{path}: task {name}'s labels {labels[:6]} differ from "
                                f"another shard's {names[name][:6]}; prepare both with "
                                "the same --label-vocab")
                names[name] = labels
    by_name = {t["name"]: t for t in req["tasks"]}
    for name in widths:
        if name not in by_name:
            raise Usage(f"a shard has task '{name}', which the spec does not")
    for path, (_s, tasks, *_rest) in zip(args.merge, shards):
        for name, width, _labels in tasks:
            if width != width_of(by_name[name], seq):
                raise Usage(f"{path}: task '{name}' has {width} label values a record, the "
                            f"spec's {by_name[name]['head']} task {width_of(by_name[name], seq)}: "
                            "a shard prepared for another spec; prepare it again")
    tasks = [t for t in req["tasks"] if t["name"] in widths]
    prep = Prepared(req["backbone"], tasks)
    prep.pad = 0
    cursors = [0] * len(shards)
    while any(c < len(sh[2]) for c, sh in zip(cursors, shards)):
        for k, (s, stasks, tokens, lengths, types, present, labels) in enumerate(shards):
            r = cursors[k]
            if r >= len(tokens):
                continue
            cursors[k] += 1
            prep.tokens.append(tokens[r].tolist())
            prep.lengths.append(int(lengths[r]))
            prep.types.append(types[r].tolist())
            for t in tasks:
                name = t["name"]
                if name in present and present[name][r]:
                    prep.present[name].append(1)
                    prep.labels[name].append(labels[name][r].tolist())
                else:
                    prep.present[name].append(0)
                    prep.labels[name].append([0.0] * width_of(t, seq))
    return prep, names


def vocab_path(out):
    base = out[:-len(".shard")] if out.endswith(".shard") else out
    return base + ".labels.json"


def main(argv):
    ap = argparse.ArgumentParser(
        prog="mtpc prepare",
        description="Tokenize text data for a spec into the runtime's binary shard.")
    ap.add_argument("--request", required=True, help=argparse.SUPPRESS)
    ap.add_argument("input", nargs="?", help="JSON Lines, CSV, TSV or CoNLL file")
    ap.add_argument("-o", "--output", required=True, help="the shard to write")
    ap.add_argument("--format", default="auto", choices=["auto", "jsonl", "csv", "tsv", "conll"])
    ap.add_argument("--text", help="text column(s): one, or two (a sentence pair) comma-separated; "
                                   "CoNLL: the word column's index (default 0)")
    ap.add_argument("--task", action="append", metavar="TASK=COLUMN",
                    help="the column with TASK's labels (default: the task's name; CoNLL: an index)")
    ap.add_argument("--tokenizer", help="tokenizer.json, a sentencepiece .model, or a directory "
                                        "(default: the pretrained backbone's)")
    ap.add_argument("--label-vocab", help="the label vocabulary to use (another prepare's "
                                          "OUT.labels.json), for held-out data")
    ap.add_argument("--skip-bad", action="store_true", help="skip bad records, count and report them")
    ap.add_argument("--merge", nargs="+", metavar="SHARD",
                    help="interleave shards prepared for this spec into one")
    args = ap.parse_args(argv)
    with open(args.request, encoding="utf-8") as f:
        req = json.load(f)
    csv.field_size_limit(1 << 30)  # a long document is one field
    try:
        if os.path.isdir(args.output):
            raise Usage(f"-o {args.output} is a directory; name the shard file to write")
        # What is written must not be what is read (by any name).
        for read in [args.input, args.tokenizer, args.label_vocab] + (args.merge or []):
            if read and os.path.exists(read) and os.path.exists(args.output) and \
                    os.path.samefile(read, args.output):
                raise Usage(f"-o {args.output} is the input file {read}; name another output")
        if args.merge:
            if args.input:
                raise Usage("--merge takes shards, not an input file")
            prep, names = merge(args, req)
            stats, bad = {"records": len(prep.tokens)}, []
        else:
            if not args.input:
                raise Usage("no input file (or --merge SHARD...)")
            prep, names, stats, bad = prepare(args, req)
        write_shard(args.output, prep, names)
        with open(vocab_path(args.output) + ".tmp", "w", encoding="utf-8") as f:
            json.dump(names, f, indent=1, ensure_ascii=False)
            f.write("\n")
        os.replace(vocab_path(args.output) + ".tmp", vocab_path(args.output))
    except Usage as e:
        print(f"mtpc prepare: error: {e}", file=sys.stderr)
        return 2
    except Bad as e:
        print(f"mtpc prepare: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"mtpc prepare: error: {e.filename or ''}: {e.strerror}", file=sys.stderr)
        return 1
    tasks = ", ".join(f"{t['name']} {sum(prep.present[t['name']])}" for t in prep.tasks)
    lines = [f"mtpc prepare: wrote {args.output}: {stats['records']} records of "
             f"{prep.seq} tokens (labelled: {tasks})"]
    if names:
        lines.append("  labels: " + "; ".join(f"{k} {len(v)}" for k, v in names.items())
                     + f" -> {vocab_path(args.output)}")
    if stats.get("truncated"):
        lines.append(f"  truncated to {prep.seq} tokens: {stats['truncated']} records")
    if stats.get("words_lost"):
        lines.append(f"  tagged words cut off by truncation: {stats['words_lost']}")
    if stats.get("words_empty"):
        lines.append(f"  tagged words that give no token (their tags are not scored): "
                     f"{stats['words_empty']}")
    if stats.get("answers_lost"):
        lines.append(f"  span answers cut off by truncation (record kept without the span): "
                     f"{stats['answers_lost']}")
    if stats.get("skipped"):
        lines.append(f"  skipped {stats['skipped']} bad records; the first: {bad[0]}")
    print("\n".join(lines))
    if prep.tasks and not any(sum(prep.present[t["name"]]) for t in prep.tasks):
        print("mtpc prepare: warning: no record has labels of any task: the shard serves "
              "--predict, not training (name the label columns with --task TASK=COLUMN)",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
