#!/usr/bin/env python3
"""Checks an emitted step program (mtpc --emit=cpp) against its plan
(mtpc plan --format=json): the backbone units run in order, one call each,
a checkpoint region as one Checkpoint call, an offloaded unit as KeepOffload;
every head right after the unit that produces its tap, offloaded as planned;
then every head backward, the fused gradient op, the backbone backward, the
collective, the optimizer step and endStep. Prints one line per call it
matched and exits 1 at the first mismatch."""
import json
import re
import sys

ATTN = {"attn_norm", "qkv", "attn_core", "attn_out", "attn_residual"}


def block(unit):
    if unit["unit"] == "embed":
        return 0
    return 2 * unit["layer"] - (1 if unit["unit"] in ATTN else 0)


def expected(plan):
    regions = {first: last for first, last in plan["plan"]["regions"]}
    in_region = {b for f, l in regions.items() for b in range(f, l + 1)}
    units = plan["units"]
    offloaded = {block(u) for u in units
                 if "task" not in u and u["decision"] == "offload"}
    head_off = {u["task"] for u in units
                if "task" in u and u["decision"] == "offload"}
    tasks = []
    calls = [("beginStep",), ("microBatches",), ("beginMicroBatch",),
             ("input",)]
    done = set()
    for u in units:
        if "task" in u:
            if u["unit"] == "head":
                tasks.append(u["task"])
                calls.append(("forwardHead", str(len(tasks) - 1),
                              "true" if u["task"] in head_off else "false"))
            continue
        b = block(u)
        if b in done:
            continue
        if b in regions:
            calls.append(("forward", str(b), str(regions[b]), "Checkpoint"))
            done.update(range(b, regions[b] + 1))
        elif b in in_region:
            continue
        else:
            calls.append(("forward", str(b), str(b),
                          "KeepOffload" if b in offloaded else "Keep"))
            done.add(b)
        calls.append(("release",))
    for t in reversed(range(len(tasks))):
        calls.append(("backwardHead", str(t)))
    calls += [("fuseTaskGradients",), ("backwardBackbone",),
              ("exchangeGradients",), ("optimizerStep",), ("endStep",)]
    return calls


def emitted(cpp):
    out = []
    for m in re.finditer(r"mtprt::step::(\w+)\(([^)]*)\)", cpp):
        name, args = m.group(1), [a.strip() for a in m.group(2).split(",")]
        if name == "prefetch":
            continue  # checked by FileCheck where the plan offloads heads
        if name == "forward":
            out.append((name, args[1], args[2], args[4].split("::")[-1]))
        elif name == "forwardHead":
            out.append((name, args[1], args[2]))
        elif name == "backwardHead":
            out.append((name, args[1]))
        else:
            out.append((name,))
    return out


def main():
    plan = json.load(open(sys.argv[1]))
    got = emitted(open(sys.argv[2]).read())
    want = expected(plan)
    for i, (w, g) in enumerate(zip(want, got)):
        if w != g:
            print(f"call {i}: the plan says {w}, the program calls {g}")
            return 1
    if len(want) != len(got):
        print(f"the plan has {len(want)} calls, the program {len(got)}")
        return 1
    print(f"call order matches the plan: {len(got)} calls, "
          f"{sum(1 for c in got if c[-1] == 'Checkpoint')} checkpoint regions, "
          f"{sum(1 for c in got if c[-1] == 'KeepOffload')} offloaded units")
    return 0


if __name__ == "__main__":
    sys.exit(main())
