#!/usr/bin/env bash
# Where a device round's time goes (issue 32), in one call on a lent GPU:
#   scripts/gpu-probe.sh            (carry target/gpu-check; writes under $OUT)
# 1. scripts/gpu-probe.cu (built there with nvcc): driver-call latencies, the
#    GPU ping-pong between two threads and between two processes;
# 2. braid perf all-reduce with every algorithm, 2 ranks as processes and as
#    threads and 8 processes, 16 MiB to 1 GiB, checked; a timeline of the tree.
# Knobs: PROBE_BUDGET (seconds per perf run, default 45); PROBE_STEPS, a list of
# `probe` (1), `all` (every algorithm), `timeline`, `bw` (all-reduce at 256 and 512 MiB,
# PROBE_BW_RANKS as processes and as threads), `units` (every algorithm at 512 MiB,
# 2 ranks, under each BRAID_PEER_COPY_UNITS of PROBE_UNITS), `auto` (the tuner's picks for
# PROBE_AUTO_OPS at 2 and 8 processes) and `mps` (the pair probe, `bw`'s processes and
# PROBE_AUTO_OPS at 8 processes again under CUDA MPS, which lets two processes' contexts share the
# GPU); default "probe all timeline".
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?set OUT}
braid=$PWD/target/gpu-check/braid
budget=${PROBE_BUDGET:-45}
log=$out/probe-log.txt
: >"$log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$log"
nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
work=$(mktemp -d)
perf() {
  local name=$1
  shift
  echo "== $name: braid perf $*" | tee -a "$log"
  timeout -k 5 "$budget" "$braid" perf --device cuda --check -w 1 -n 3 --json "$work/rows.jsonl" "$@" >>"$log" 2>&1
  echo "rc $?" | tee -a "$log"
  [ -f "$work/rows.jsonl" ] && sed "s/^{/{\"case\":\"$name\",/" "$work/rows.jsonl" >>"$out/perf.jsonl"
  rm -f "$work/rows.jsonl"
}
steps=${PROBE_STEPS:-probe all timeline}
build_probe() {
  [ -x "$work/probe" ] || timeout 90 "$nvcc" -O2 -std=c++17 -o "$work/probe" scripts/gpu-probe.cu >>"$log" 2>&1
}
pair() {
  rm -f "$work"/probe-shm "$work"/probe-owner
  timeout 60 "$work/probe" pair "$work" >>"$1" 2>>"$log" &
  timeout 60 "$work/probe" pair "$work" >>"$1" 2>>"$log"
  wait
}
for step in $steps; do
  case $step in
    probe)
      if build_probe; then
        timeout 60 "$work/probe" solo >>"$out/probe.jsonl"
        pair "$out/probe.jsonl"
        cat "$out/probe.jsonl"
      else
        echo "probe: nvcc failed (see log)"
      fi
      ;;
    all)
      perf p2-all --ranks 2 --algo all --in-place -b 16M -e 256M -f 4
      perf t2-all --ranks 2 --transport inproc --algo all --in-place -b 16M -e 256M -f 4
      perf p8-all --ranks 8 --algo all --in-place -b 64M -e 256M -f 4
      perf p2-bcast --op broadcast --ranks 2 --in-place -b 16M -e 1G -f 4
      ;;
    timeline)
      mkdir -p "$work/tl"
      BRAID_TIMELINE="$work/tl/tree.json" perf p2-tree-timeline --ranks 2 --algo tree --in-place -b 16M -e 16M
      BRAID_TIMELINE="$work/tl/tree.json" perf t2-tree-timeline --ranks 2 --transport inproc --algo tree --in-place -b 16M -e 16M
      tar -C "$work" -czf "$out/timelines.tgz" tl
      ;;
    auto)
      for n in 2 8; do
        for op in ${PROBE_AUTO_OPS:-broadcast all-gather reduce-scatter reduce}; do
          perf "p$n-auto" --op $op --ranks $n --in-place -b 16M -e 256M -f 16
        done
      done
      ;;
    bw)
      for n in ${PROBE_BW_RANKS:-2 4 8}; do
        perf "bw-p$n" --ranks $n --in-place -b 256M -e 512M -f 2
        perf "bw-t$n" --ranks $n --transport inproc --in-place -b 256M -e 512M -f 2
      done
      ;;
    units)
      for u in ${PROBE_UNITS:-2 8 32}; do
        BRAID_PEER_COPY_UNITS=$u perf "units$u-p2" --ranks 2 --algo all --in-place -b 512M -e 512M
        BRAID_PEER_COPY_UNITS=$u perf "units$u-t2" --ranks 2 --transport inproc --algo all --in-place -b 512M -e 512M
      done
      ;;
    mps)
      if ! command -v nvidia-cuda-mps-control >/dev/null; then
        echo "mps: no nvidia-cuda-mps-control" | tee -a "$log"
        continue
      fi
      export CUDA_MPS_PIPE_DIRECTORY=$work/mps-pipe CUDA_MPS_LOG_DIRECTORY=$work/mps-log
      mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
      nvidia-cuda-mps-control -d >>"$log" 2>&1 && sleep 1
      build_probe && pair "$out/probe-mps.jsonl" && cat "$out/probe-mps.jsonl"
      for n in ${PROBE_BW_RANKS:-2 4 8}; do
        perf "mps-p$n" --ranks $n --in-place -b 256M -e 512M -f 2
      done
      for op in ${PROBE_AUTO_OPS:-broadcast all-gather reduce-scatter reduce}; do
        perf mps-p8 --op $op --ranks 8 --in-place -b 256M -e 256M
      done
      echo quit | nvidia-cuda-mps-control >>"$log" 2>&1
      cat "$CUDA_MPS_LOG_DIRECTORY"/*.log >>"$log" 2>/dev/null
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
      ;;
    *) echo "unknown step $step" ;;
  esac
done
python3 - "$out/perf.jsonl" <<'PY' | tee "$out/perf-summary.txt"
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(f"{r['case']:18} {r['op']:10} {r.get('algo','?'):18} {r['bytes']>>20:5} MiB  {r.get('time_us',0):10.0f} us  busbw {r['busbw_gbps']:7.1f}  wrong {r.get('wrong')}")
PY
rm -rf "$work"
