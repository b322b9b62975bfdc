#!/usr/bin/env python3
"""Seeds for the safetensors reader's fuzzer: a file with one tensor of
every dtype, metadata, a truncated copy, and a sharded set's index."""
import json
import struct
import sys

out = sys.argv[1]
sizes = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4,
         "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
header, data = {"__metadata__": {"format": "pt"}}, b""
for i, (dtype, size) in enumerate(sizes.items()):
    shape = [2, i % 3 + 1]
    n = size * shape[0] * shape[1]
    header[f"t{i}.weight"] = {"dtype": dtype, "shape": shape,
                              "data_offsets": [len(data), len(data) + n]}
    data += bytes((j * 7 + i) % 256 for j in range(n))
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
whole = struct.pack("<Q", len(text)) + text + data
open(f"{out}/all.safetensors", "wb").write(whole)
open(f"{out}/truncated.safetensors", "wb").write(whole[:len(whole) // 2])
open(f"{out}/empty.safetensors", "wb").write(struct.pack("<Q", 2) + b"{}")
open(f"{out}/index.json", "w").write(json.dumps(
    {"metadata": {"total_size": len(data)},
     "weight_map": {"t0.weight": "model-00001-of-00002.safetensors",
                    "t1.weight": "model-00002-of-00002.safetensors"}}))
