"""Checks that each project's plan.cpp embeds its plan.mtpplan byte for byte
(after the 16-byte "MTPPLAN" header) and that two builds of one spec wrote
identical files."""
import os
import re
import sys

dirs = sys.argv[1:]
for d in dirs:
    src = open(os.path.join(d, "plan.cpp")).read()
    body = src[src.index("{", src.index("mtp_embedded_plan[] =")) + 1:src.index("};")]
    data = bytes(int(b) for b in re.findall(r"\d+", body))
    plan = open(os.path.join(d, "plan.mtpplan"), "rb").read()
    size = int(re.search(r"mtp_embedded_plan_size = (\d+);", src).group(1))
    assert size == len(plan), (d, size, len(plan))
    assert data[16:] == plan, f"{d}: plan.cpp does not embed plan.mtpplan"
    assert int.from_bytes(data[8:16], "little") == len(plan), d
files = sorted(f for f in os.listdir(dirs[0]) if f != "CMakeLists.txt")
for f in files:
    a = open(os.path.join(dirs[0], f), "rb").read()
    b = open(os.path.join(dirs[1], f), "rb").read()
    assert a == b, f"{f} differs between the two builds"
print(f"plan.cpp embeds plan.mtpplan ({len(plan)} bytes) in both projects; "
      f"every file identical")
