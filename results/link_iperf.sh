#!/bin/bash
set -u
# The emulated link alone: iperf3 --bidir over two network namespaces joined by a
# veth with an htb class at 1 Gbit/s (as results/tuner_ab.sh twohost QDISC=htb),
# each side pinned to one CPU, with 1 and 2 parallel connections.
#   results/link_iperf.sh OUTDIR P...     (needs iperf3: apt-get install -y iperf3)
out=$1; shift; mkdir -p "$out"
base=ip-$$
cleanup() { ip netns del $base-a 2>/dev/null; ip netns del $base-b 2>/dev/null; }
trap cleanup EXIT
ip netns add $base-a; ip netns add $base-b
ip link add eth0 netns $base-a type veth peer name eth0 netns $base-b
i=1
for ns in $base-a $base-b; do
  ip -n $ns addr add 10.80.0.$i/24 dev eth0; ip -n $ns link set eth0 up; ip -n $ns link set lo up
  ip netns exec $ns tc qdisc add dev eth0 root handle 1: htb default 10 2>/dev/null
  ip netns exec $ns tc class add dev eth0 parent 1: classid 1:10 htb rate 1gbit ceil 1gbit 2>/dev/null
  i=$((i+1))
done
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
