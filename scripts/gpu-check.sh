#!/usr/bin/env bash
# The GPU check in one command (issue 32).
#
#   scripts/gpu-check.sh build            here: build `braid` and the CUDA unit tests
#                                         (release, stripped) into target/gpu-check/,
#                                         which must stay under the 64 MiB a device
#                                         machine is carried.
#   scripts/gpu-check.sh run [--device D] there (D = cuda, the default) or here
#                                         (D = sim, small sizes): the device unit tests,
#                                         the GPU's device-to-device copy ceiling, then
#                                         `braid perf --check` for every collective (and
#                                         send-recv from 2 ranks) at 1,
#                                         2, 4 and 8 ranks, as processes, as threads and
#                                         with host and device ranks mixed, in place and
#                                         out of place. Writes JSON lines
#                                         and summary.md under $OUT (or GPU_CHECK_OUT).
#
# The machine it runs on needs no Rust toolchain: only the CUDA driver, NVRTC, and
# nvcc for the copy ceiling. A failed case is recorded and the next one runs; the
# exit status is non-zero if any case failed or was not reached.
# On the device tool: carry ["target/gpu-check"], command `scripts/gpu-check.sh run`,
# timeout_s 540 (the run ends by itself within GPU_CHECK_BUDGET plus a few seconds).
# Knobs (environment): GPU_CHECK_BUDGET (seconds for everything, default 450),
# GPU_CHECK_MIN / GPU_CHECK_MAX / GPU_CHECK_FACTOR (sizes), GPU_CHECK_ITERS,
# GPU_CHECK_RANKS (e.g. "1 2"), GPU_CHECK_OPS; the bandwidth phase before the matrix:
# GPU_CHECK_BW_BUDGET (seconds, default 120; 0 skips it), GPU_CHECK_BW_OPS,
# GPU_CHECK_BW_RANKS, GPU_CHECK_BW_MIN / GPU_CHECK_BW_MAX, GPU_CHECK_BW_ITERS.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=target/gpu-check
limit_mib=64

build() {
  set -e
  local tgt="${CARGO_TARGET_DIR:-target}"
  cargo build --release --bin braid
  # The unit-test executable's path, from cargo's own report of what it built.
  local tests
  tests=$(cargo test --release --features cuda --lib --no-run --message-format=json |
    sed -n 's/.*"executable":"\([^"]*\)".*"fresh".*/\1/p; s/.*"fresh".*"executable":"\([^"]*\)".*/\1/p' | tail -1)
  [ -n "$tests" ] || { echo "gpu-check: cargo reported no unit-test executable" >&2; exit 1; }
  rm -rf "$dir" && mkdir -p "$dir"
  cp "$tgt/release/braid" "$dir/braid"
  cp "$tests" "$dir/braid-unit-tests"
  strip "$dir/braid" "$dir/braid-unit-tests"
  local kib
  kib=$(du -sk "$dir" | cut -f1)
  echo "gpu-check: $dir holds $((kib / 1024)) MiB ($kib KiB): $(ls "$dir" | tr '\n' ' ')"
  if [ "$kib" -gt $((limit_mib * 1024)) ]; then
    echo "gpu-check: over the ${limit_mib} MiB a device machine is carried" >&2
    exit 1
  fi
}

# The copy ceiling: cudaMemcpy device to device of 1 GiB, best of 10, compiled there.
ceiling() {
  local nvcc
  nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
  if [ -z "$nvcc" ]; then
    echo '{"ceiling":"d2d-copy","status":"fail","why":"no nvcc"}'
    return 1
  fi
  local src=$work/d2d.cu
  cat >"$src" <<'CU'
#include <cstdio>
#include <cuda_runtime.h>
int main() {
  const size_t n = 1ull << 30;
  void *a, *b;
  if (cudaMalloc(&a, n) || cudaMalloc(&b, n)) { printf("{\"ceiling\":\"d2d-copy\",\"status\":\"fail\",\"why\":\"cudaMalloc\"}\n"); return 1; }
  cudaMemset(a, 1, n);
  cudaEvent_t s, e; cudaEventCreate(&s); cudaEventCreate(&e);
  float best = 1e30f;
  for (int i = 0; i < 11; i++) {
    cudaEventRecord(s); cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice); cudaEventRecord(e);
    cudaEventSynchronize(e);
    float ms; cudaEventElapsedTime(&ms, s, e);
    if (i > 0 && ms < best) best = ms;  /* the first is the warm-up */
  }
  cudaError_t err = cudaGetLastError();
  /* Bytes read plus bytes written, as GPU copy bandwidths are usually quoted, and the copy rate. */
  printf("{\"ceiling\":\"d2d-copy\",\"status\":\"%s\",\"bytes\":%zu,\"time_ms\":%.3f,\"copy_GBps\":%.1f,\"rw_GBps\":%.1f}\n",
         err ? "fail" : "pass", n, best, n / (best * 1e6), 2.0 * n / (best * 1e6));
  return err ? 1 : 0;
}
CU
  timeout 60 "$nvcc" -O2 -o "$work/d2d" "$src" >>"$log" 2>&1 &&
    timeout 60 "$work/d2d"
}

run() {
  local device=cuda
  while [ $# -gt 0 ]; do
    case "$1" in
      --device) device="$2"; shift 2 ;;
      --device=*) device="${1#*=}"; shift ;;
      *) echo "gpu-check run: unknown argument $1" >&2; exit 2 ;;
    esac
  done
  case "$device" in
    cuda) min=${GPU_CHECK_MIN:-4K} max=${GPU_CHECK_MAX:-1G} factor=${GPU_CHECK_FACTOR:-8} iters=${GPU_CHECK_ITERS:-3} ;;
    sim) min=${GPU_CHECK_MIN:-4K} max=${GPU_CHECK_MAX:-64K} factor=${GPU_CHECK_FACTOR:-4} iters=${GPU_CHECK_ITERS:-2} ;;
    *) echo "gpu-check run: --device is cuda or sim" >&2; exit 2 ;;
  esac
  local out=${GPU_CHECK_OUT:-${OUT:-}}
  [ -n "$out" ] || { echo "gpu-check run: set OUT (or GPU_CHECK_OUT) to the results folder" >&2; exit 2; }
  mkdir -p "$out"
  local braid="$PWD/$dir/braid" tests="$PWD/$dir/braid-unit-tests"
  for f in "$braid" "$tests"; do
    [ -x "$f" ] || { echo "gpu-check run: $f is missing: run '$0 build' first" >&2; exit 2; }
  done
  local start deadline budget=${GPU_CHECK_BUDGET:-450}
  start=$(date +%s)
  deadline=$((start + budget))
  work=$(mktemp -d)
  log=$out/log.txt
  local cases=$out/cases.jsonl rows=$out/perf.jsonl summary=$out/summary.md
  : >"$log"; : >"$cases"; : >"$rows"
  local failed=0 passed=0
  # record NAME STATUS RC SECONDS EXTRA_JSON
  record() {
    printf '{"case":"%s","status":"%s","rc":%s,"seconds":%s%s}\n' "$1" "$2" "$3" "$4" "${5:-}" >>"$cases"
    if [ "$2" = pass ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    printf '| %s | %s | %s | %ss |\n' "$1" "$2" "$3" "$4" >>"$work/table"
  }

  echo "== unit tests (device::cuda)" | tee -a "$log"
  local t0=$SECONDS rc
  timeout -k 5 120 "$tests" device::cuda --test-threads=4 >>"$log" 2>&1
  rc=$?
  local tline
  tline=$(grep -E '^test result:' "$log" | tail -1)
  record unit-tests "$([ $rc = 0 ] && echo pass || echo fail)" $rc $((SECONDS - t0)) ",\"result\":\"${tline//\"/}\""

  local ceil_line="n/a (sim device)"
  if [ "$device" = cuda ]; then
    echo "== d2d copy ceiling" | tee -a "$log"
    t0=$SECONDS
    local c
    c=$(ceiling 2>>"$log")
    rc=$?
    echo "$c" >"$out/ceiling.json"
    ceil_line=${c:-"none measured (see log.txt)"}
    record d2d-copy-ceiling "$([ $rc = 0 ] && echo pass || echo fail)" $rc $((SECONDS - t0))
  fi

  # Bandwidth first (the ceiling's use): long messages, several timed iterations,
  # every result still checked; rows in bw.jsonl, ratios to the copy ceiling in
  # the summary. GPU_CHECK_BW_BUDGET=0 skips it.
  local bw_budget=${GPU_CHECK_BW_BUDGET:-120} bw_rows=$out/bw.jsonl
  : >"$bw_rows"
  if [ "$bw_budget" -gt 0 ]; then
    local bw_list=() bw_end=$(($(date +%s) + bw_budget))
    for op in ${GPU_CHECK_BW_OPS:-all-reduce}; do
      for n in ${GPU_CHECK_BW_RANKS:-2 4 8}; do
        for mode in procs threads; do bw_list+=("$op $n $mode"); done
      done
    done
    echo "== bandwidth: ${#bw_list[@]} cases, ${GPU_CHECK_BW_MIN:-256M}..${GPU_CHECK_BW_MAX:-1G}" | tee -a "$log"
    local bw_left=${#bw_list[@]}
    for entry in "${bw_list[@]}"; do
      read -r op n mode <<<"$entry"
      local name="bandwidth $op n=$n $mode" t
      t=$(((bw_end - $(date +%s)) / bw_left))
      bw_left=$((bw_left - 1))
      if [ "$t" -lt 3 ]; then record "$name" not-reached null 0; continue; fi
      local args=(perf --op "$op" --ranks "$n" --device "$device" --check -b "${GPU_CHECK_BW_MIN:-256M}"
        -e "${GPU_CHECK_BW_MAX:-1G}" -f 2 -n "${GPU_CHECK_BW_ITERS:-5}" -w 2 --in-place --json "$work/rows.jsonl")
      [ "$mode" = threads ] && args+=(--transport inproc)
      echo "-- $name (timeout ${t}s): braid ${args[*]}" >>"$log"
      rm -f "$work/rows.jsonl"
      t0=$SECONDS
      timeout -k 5 "$t" "$braid" "${args[@]}" >>"$log" 2>&1
      rc=$?
      local status=pass nrows=0
      if [ -f "$work/rows.jsonl" ]; then
        nrows=$(wc -l <"$work/rows.jsonl")
        sed "s/^{/{\"case\":\"$name\",\"mode\":\"$mode\",/" "$work/rows.jsonl" >>"$bw_rows"
      fi
      case $rc in 0) ;; 124 | 137) status=timeout ;; *) status=fail ;; esac
      record "$name" $status $rc $((SECONDS - t0)) ",\"op\":\"$op\",\"ranks\":$n,\"mode\":\"$mode\",\"timeout_s\":$t,\"sizes_done\":$nrows"
      echo "$name: $status (rc $rc, $((SECONDS - t0))s, $nrows sizes)"
    done
  fi

  # The matrix, smallest worlds first: every collective (the barrier once per world and
  # mode, at no size) and send/recv (each rank to rank + 1, from 2 ranks, always from a
  # send buffer into a receive buffer), ranks x {processes, threads, processes with the
  # odd ranks on the host (mixed)} x {in place, out of place}.
  local ops=${GPU_CHECK_OPS:-"all-reduce broadcast all-gather reduce-scatter reduce all-to-all barrier send-recv"}
  local ranks=${GPU_CHECK_RANKS:-"1 2 4 8"}
  local list=()
  for n in $ranks; do
    for mode in procs threads mixed; do
      [ "$mode" = mixed ] && [ "$n" = 1 ] && continue
      for place in in-place out-of-place; do
        for op in $ops; do
          [ "$op" = barrier ] && [ "$place" = out-of-place ] && continue
          [ "$op" = send-recv ] && { [ "$n" = 1 ] || [ "$place" = in-place ]; } && continue
          list+=("$op $n $mode $place")
        done
      done
    done
  done
  local left=${#list[@]}
  echo "== perf matrix: $left cases, $min..$max x$factor, device $device" | tee -a "$log"
  for entry in "${list[@]}"; do
    read -r op n mode place <<<"$entry"
    local name="$op n=$n $mode $place" now remaining fair t
    now=$(date +%s)
    remaining=$((deadline - now))
    if [ "$remaining" -lt 3 ]; then
      record "$name" "not-reached" null 0
      left=$((left - 1))
      continue
    fi
    # Each case may take up to three fair shares of what is left, but never so much
    # that a later case would get under two seconds.
    fair=$((remaining / left))
    t=$((fair * 3))
    [ $((remaining - (left - 1) * 2)) -lt "$t" ] && t=$((remaining - (left - 1) * 2))
    [ "$t" -lt 2 ] && t=2
    local args=(perf --op "$op" --ranks "$n" --device "$device" --check -b "$min" -e "$max" -f "$factor"
      -n "$iters" -w 1 --json "$work/rows.jsonl")
    [ "$mode" = threads ] && args+=(--transport inproc)
    [ "$mode" = mixed ] && args+=(--mixed)
    # One mode per case (braid perf measures both by default).
    [ "$place" = out-of-place ] && args+=(--out-of-place)
    [ "$place" = in-place ] && [ "$op" != barrier ] && args+=(--in-place)
    echo "-- $name (timeout ${t}s): braid ${args[*]}" >>"$log"
    rm -f "$work/rows.jsonl"
    t0=$SECONDS
    timeout -k 5 "$t" "$braid" "${args[@]}" >>"$log" 2>&1
    rc=$?
    local status=pass nrows=0
    if [ -f "$work/rows.jsonl" ]; then
      nrows=$(wc -l <"$work/rows.jsonl")
      sed "s/^{/{\"case\":\"$name\",/" "$work/rows.jsonl" >>"$rows"
    fi
    case $rc in
      0) ;;
      124 | 137) status=timeout ;;
      *) status=fail ;;
    esac
    record "$name" $status $rc $((SECONDS - t0)) ",\"op\":\"$op\",\"ranks\":$n,\"mode\":\"$mode\",\"place\":\"$place\",\"device\":\"$device\",\"timeout_s\":$t,\"sizes_done\":$nrows"
    echo "$name: $status (rc $rc, $((SECONDS - t0))s, $nrows sizes)"
    left=$((left - 1))
  done

  {
    echo "# GPU check ($device), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo
    echo "$passed passed, $failed failed or not reached, in $(($(date +%s) - start))s of a ${budget}s budget."
    echo "Sizes $min..$max (x$factor), $iters timed iterations, every result checked (--check)."
    echo
    echo "Copy ceiling: $ceil_line"
    echo
    if [ -s "$bw_rows" ]; then
      echo "Bus bandwidth against the copy ceiling (busbw / copy rate) and against the memory-traffic"
      echo "bound (its time over the measured time): ranks sharing one GPU share its memory, so a"
      echo "collective takes at least the bytes it must read and write over the GPU's read-plus-write"
      echo "rate. all-reduce reads every input and writes every output (2nS of n ranks of S bytes),"
      echo "reduce-scatter and reduce read every input and write the results ((n+1)S, S input),"
      echo "all-gather reads every block once and writes every output ((n+1)S, S output), broadcast"
      echo "reads the root's buffer and writes the others (nS). Against the copy rate C that caps"
      echo "all-reduce busbw at 2(n-1)C/n^2: 50% of C at 2 ranks, 37.5% at 4, 22% at 8."
      echo
      python3 - "$bw_rows" "$out/ceiling.json" <<'PY' || echo "(no python3 for the ratio table)"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
try:
    ceil = json.load(open(sys.argv[2]))
except Exception:
    ceil = {}
copy, rw = ceil.get("copy_GBps"), ceil.get("rw_GBps")
# Bytes the collective must at least read plus write, in units of the size S.
traffic = {"all-reduce": lambda n: 2 * n, "reduce-scatter": lambda n: n + 1, "reduce": lambda n: n + 1,
           "all-gather": lambda n: n + 1, "broadcast": lambda n: n}
print("| op | ranks | mode | size | algo | busbw GB/s | of copy ceiling | of traffic bound | wrong |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    ratio = f"{r['busbw_gbps'] / copy:.1%}" if copy else "n/a"
    t = traffic.get(r["op"])
    bound = "n/a"
    if rw and t and r.get("time_us"):
        bound = f"{t(r['ranks']) * r['bytes'] / (rw * 1e3) / r['time_us']:.1%}"
    print(f"| {r['op']} | {r['ranks']} | {r['mode']} | {r['bytes'] >> 20} MiB | {r['algo']} | "
          f"{r['busbw_gbps']:.1f} | {ratio} | {bound} | {r.get('wrong')} |")
PY
      echo
    fi
    echo "| case | status | rc | time |"
    echo "| --- | --- | --- | --- |"
    cat "$work/table"
  } >"$summary"
  rm -rf "$work"
  echo "gpu-check: $passed passed, $failed failed or not reached; see $summary"
  [ "$failed" = 0 ]
}

case "${1:-}" in
  build) build ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 build | run [--device cuda|sim]" >&2; exit 2 ;;
esac
