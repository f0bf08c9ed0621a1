"""Markdown table of PyTorch DistributedTest outcomes, Gloo against braid.

    python results/scripts/judge_table.py GLOO.json BRAID.json [BRAID_EXTRA.json]

GLOO/BRAID.json are run_distributed_test.py --json outputs of one world size.
Rows: every test Gloo passes. A test braid skips is classed by its decorators in
torch's distributed_test.py: locked to the name "gloo", gated on the suite's "gpu"
feature set, or other. BRAID_EXTRA.json (optional) holds re-runs of the gated
tests with JUDGE_EXTRA_FEATURES=gpu.
"""

import json
import re
import sys

import torch.testing._internal.distributed.distributed_test as dt

gloo, braid = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
extra = json.load(open(sys.argv[3])) if len(sys.argv) > 3 else {}
src = open(dt.__file__).read().split("\n")


def gate(test: str) -> str:
    at = next(i for i, line in enumerate(src) if re.search(rf"def {test}\(", line))
    j = at
    while j > 0 and not src[j - 1].strip().startswith("def ") and at - j < 12 and src[j - 1].strip():
        j -= 1
    decorators = " ".join(line.strip() for line in src[j:at])
    if '"gloo"' in decorators:
        return "locked to gloo"
    if '"gpu"' in decorators:
        return "gated on the gpu feature set"
    return ""


rows, counts = [], {"pass": 0, "locked to gloo": 0, "gated on the gpu feature set": 0, "other": 0}
for test in sorted(t for t, v in gloo.items() if v == "pass"):
    mine = braid.get(test, "missing")
    note = ""
    if mine == "pass":
        counts["pass"] += 1
    else:
        note = gate(test) if mine == "skip" else ""
        if note and test in extra:
            note += f"; with JUDGE_EXTRA_FEATURES=gpu: {extra[test]}"
        counts[gate(test) if mine == "skip" and gate(test) else "other"] += 1
    rows.append(f"| {test} | pass | {mine} | {note} |")
print(f"Gloo passes {sum(v == 'pass' for v in gloo.values())} of {len(gloo)}; of those braid passes "
      f"{counts['pass']}, skips {counts['locked to gloo']} locked to the name gloo and "
      f"{counts['gated on the gpu feature set']} gated on the gpu feature set, and fails or skips "
      f"{counts['other']} others.")
print()
print("| test | gloo | braid | why braid does not run it |")
print("|---|---|---|---|")
print("\n".join(rows))
