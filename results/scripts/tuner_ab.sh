#!/bin/bash
# The tuner's pick against every algorithm forced, all-reduce 4 KiB - 64 MiB:
#   results/scripts/tuner_ab.sh onehost N RUNS OUTDIR   N ranks on this host (shared memory)
#   results/scripts/tuner_ab.sh twohost RUNS OUTDIR     4 ranks on two emulated hosts (network
#       namespaces, private /dev/shm each, one CPU each, veth limited to 1 Gbit/s by tbf)
# BURST (twohost): tbf's bucket, default 256kb (tc's kb: kilobytes): messages shorter
#       than the bucket cross at the veth's own speed, not 1 Gbit/s.
# QDISC=htb (twohost): an htb class at 1 Gbit/s (rate and ceil; its own default
#       bucket, about one packet, unless BURST is given) instead of tbf.
# PARTS (twohost): "small large" by default (4 KiB-1 MiB, 4-64 MiB).
# `braid perf --algo all` alternates auto and every algorithm at each size within a
# run; each run writes JSON lines; results/scripts/tuner_summarize.py takes the medians.
# OP: the collective (default all-reduce).
set -euo pipefail
OP=${OP:-all-reduce}
BRAID=$(realpath "${BRAID:-target/release/braid}")
mode=$1; shift
sweep() { # extra args: where each perf's json goes ($1) and the launcher prefix
  local json=$1; shift
  "$@" perf --in-place --op "$OP" -b 4K -e 1M -f 4 --algo all --json "$json.small" >/dev/null
  "$@" perf --in-place --op "$OP" -b 4M -e 64M -f 4 --algo all -n 20 -w 2 --json "$json.large" >/dev/null
  cat "$json.small" "$json.large" > "$json"; rm -f "$json.small" "$json.large"
}
case $mode in
onehost)
  n=$1 runs=$2 out=$3; mkdir -p "$out"
  for r in $(seq 1 "$runs"); do
    sweep "$out/onehost-n$n-run$r.json" "$BRAID" run -n "$n" -- "$BRAID"
    echo "run $r done"
  done ;;
twohost)
  runs=$1 out=$(realpath -m "$2"); mkdir -p "$out"
  base=braid-tuner-$$
  holders=()
  cleanup() { for p in "${holders[@]}"; do kill "$p" 2>/dev/null || true; done; ip netns del $base-a 2>/dev/null || true; ip netns del $base-b 2>/dev/null || true; }
  trap cleanup EXIT
  . "$(dirname "$0")/emulated_link.sh"
  emulated_link "$base" 10.78.0
  for ns in $base-a $base-b; do
    fifo=$(mktemp -u); mkfifo "$fifo"
    ip netns exec $ns unshare --mount --propagation private sh -c 'mount -t tmpfs -o size=4g,mode=1777 tmpfs /dev/shm && echo $$ && exec sleep 3600' > "$fifo" &
    read -r pid < "$fifo"; rm -f "$fifo"; holders+=("$pid")
  done
  for r in $(seq 1 "$runs"); do
    json=$out/twohost-run$r.json
    for part in ${PARTS:-small large}; do
      if [ $part = small ]; then args=(-b 4K -e 1M -f 4); else args=(-b 4M -e 64M -f 4 -n 5 -w 1); fi
      pids=()
      for rank in 0 1 2 3; do
        h=$((rank / 2)); cpu=$h
        j=/dev/null; [ $rank = 0 ] && j=$json.$part
        BRAID_RANK=$rank BRAID_WORLD_SIZE=4 BRAID_LOCAL_RANK=$((rank % 2)) BRAID_STORE=tcp://10.78.0.1:29511 \
          BRAID_SOCKET_IFNAME==eth0 BRAID_TIMEOUT=120 BRAID_BIND=none \
          nsenter --target "${holders[$h]}" --net --mount -- taskset -c $cpu "$BRAID" perf --in-place --op all-reduce "${args[@]}" --algo all --json "$j" >/dev/null &
        pids+=($!)
      done
      for p in "${pids[@]}"; do wait "$p"; done
    done
    for part in ${PARTS:-small large}; do cat "$json.$part"; done > "$json"
    rm -f "$json.small" "$json.large"
    echo "run $r done"
  done ;;
esac
