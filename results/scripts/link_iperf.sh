#!/bin/bash
set -u
# The emulated link alone: iperf3 --bidir over two network namespaces joined by a
# veth with an htb class at 1 Gbit/s (as results/scripts/tuner_ab.sh twohost QDISC=htb),
# each side pinned to one CPU, with 1 and 2 parallel connections.
#   results/scripts/link_iperf.sh OUTDIR P...     (needs iperf3: apt-get install -y iperf3)
out=$1; shift; mkdir -p "$out"
base=ip-$$
cleanup() { ip netns del $base-a 2>/dev/null; ip netns del $base-b 2>/dev/null; }
trap cleanup EXIT
. "$(dirname "$0")/emulated_link.sh"
QDISC=htb emulated_link "$base" 10.80.0
ip netns exec $base-b taskset -c 1 iperf3 -s -D -1 -p 5201 >/dev/null 2>&1
ip netns exec $base-b taskset -c 1 iperf3 -s -D -1 -p 5202 >/dev/null 2>&1
sleep 0.5
for P in "$@"; do
  ip netns exec $base-a taskset -c 0 iperf3 -c 10.80.0.2 -p 5201 --bidir -t 4 -P $P -J > "$out/iperf-P$P.json" 2>&1
  python3 - "$P" "$out" <<'PY'
import json,sys
d=json.load(open(f"{sys.argv[2]}/iperf-P{sys.argv[1]}.json"))
e=d["end"]
print(f"P={sys.argv[1]} bidir: A->B {e['sum_sent']['bits_per_second']/8e6:.1f} MB/s, B->A {e['sum_sent_bidir_reverse']['bits_per_second']/8e6:.1f} MB/s")
PY
  ip netns exec $base-b taskset -c 1 iperf3 -s -D -1 -p 5201 >/dev/null 2>&1; sleep 0.3
done
