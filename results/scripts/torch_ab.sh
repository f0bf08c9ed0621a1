#!/usr/bin/env bash
# braid against gloo through torch.distributed, alternated ROUNDS times (default 3):
# all_reduce on CPU tensors (python/bench/torch_allreduce.py) and the DDP step of
# the digits MLP (python/examples/ddp_digits.py under torchrun); medians per size.
#   BRAID_LIBRARY=target/release/libbraid.so results/scripts/torch_ab.sh
# NP (2), PY (/opt/peers-venv/bin/python), DDP_NP (4), DDP_STEPS (200).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${ROUNDS:-3} np=${NP:-2} py=${PY:-/opt/peers-venv/bin/python}
ddp_np=${DDP_NP:-4} ddp_steps=${DDP_STEPS:-200}
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
dir=$(mktemp -d)
for r in $(seq "$rounds"); do
  for b in gloo braid; do
    timeout 600 "$py" python/bench/torch_allreduce.py --backend $b --np "$np" >>"$dir/ar-$b.jsonl"
    timeout 600 "$py" -m torch.distributed.run --nproc-per-node "$ddp_np" python/examples/ddp_digits.py \
      --backend $b --steps "$ddp_steps" 2>/dev/null | grep '^{' >>"$dir/ddp-$b.jsonl"
  done
done
"$py" - "$dir" <<'PY'
import json, os, statistics, sys
d = sys.argv[1]
rows = lambda f: [json.loads(l) for l in open(os.path.join(d, f)) if l.strip()]
ar = {b: rows(f"ar-{b}.jsonl") for b in ("gloo", "braid")}
print("| all_reduce bytes | gloo us | braid us | gloo busbw GB/s | braid busbw GB/s | braid/gloo busbw |")
print("|---|---|---|---|---|---|")
for size in sorted({r["bytes"] for r in ar["gloo"]}):
    med = {b: statistics.median(r["median_us"] for r in ar[b] if r["bytes"] == size) for b in ar}
    bw = {b: statistics.median(r["busbw_GBps"] for r in ar[b] if r["bytes"] == size) for b in ar}
    print(f"| {size} | {med['gloo']:.1f} | {med['braid']:.1f} | {bw['gloo']:.3f} | {bw['braid']:.3f} | {bw['braid'] / bw['gloo']:.2f} |")
ddp = {b: rows(f"ddp-{b}.jsonl") for b in ("gloo", "braid")}
print()
print("| DDP digits | median step ms (per round) | median | accuracy |")
print("|---|---|---|---|")
for b in ("gloo", "braid"):
    steps = [r["median_step_ms"] for r in ddp[b]]
    acc = sorted({r["accuracy"] for r in ddp[b]})
    print(f"| {b} | {', '.join(f'{s:.3f}' for s in steps)} | {statistics.median(steps):.3f} | {acc} |")
PY
rm -rf "$dir"
