#!/usr/bin/env bash
# DDP on the digits MLP under torchrun, gloo and braid, same seed: each saves its
# parameters after step SAVE_AT (20); prints accuracy and step time of each run and
# whether the two parameter sets are bit-identical (else the largest difference).
#   BRAID_LIBRARY=target/release/libbraid.so results/scripts/ddp_digits_compare.sh [NP]
# PY (/opt/peers-venv/bin/python), STEPS (400), EXTRA_BRAID_ENV (e.g. BRAID_DETERMINISTIC=1).
set -euo pipefail
cd "$(dirname "$0")/../.."
np=${1:-4} py=${PY:-/opt/peers-venv/bin/python} steps=${STEPS:-400} save_at=${SAVE_AT:-20}
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
dir=$(mktemp -d)
for b in gloo braid; do
  env ${EXTRA_BRAID_ENV:-} timeout 600 "$py" -m torch.distributed.run --nproc-per-node "$np" \
    python/examples/ddp_digits.py --backend $b --steps "$steps" --save-at "$save_at" --params "$dir/$b.pt" \
    2>/dev/null | grep '^{'
done
"$py" - "$dir" "$save_at" <<'PY'
import sys, torch
d, at = sys.argv[1], sys.argv[2]
g, b = torch.load(f"{d}/gloo.pt"), torch.load(f"{d}/braid.pt")
same = all(torch.equal(g[k], b[k]) for k in g)
worst = max((g[k] - b[k]).abs().max().item() for k in g)
scale = max(g[k].abs().max().item() for k in g)
print(f"parameters after step {at}: bit-identical={same}, largest difference {worst:.3g} (largest parameter {scale:.3g})")
PY
rm -rf "$dir"
