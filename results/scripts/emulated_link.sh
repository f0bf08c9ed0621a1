# Sourced by the two-host scripts: two network namespaces BASE-a and BASE-b joined
# by a veth (eth0 in each, addresses PREFIX.1 and PREFIX.2/24), each side's egress
# limited to 1 Gbit/s: QDISC=htb, an htb class (rate and ceil; its own bucket
# unless BURST is given), or else tbf with a bucket of BURST (default 256kb; tc's
# kb are kilobytes). Removing the namespaces is the caller's cleanup.
#   emulated_link BASE PREFIX
emulated_link() {
  local base=$1 prefix=$2 i=1 ns
  ip netns add "$base-a"; ip netns add "$base-b"
  ip link add eth0 netns "$base-a" type veth peer name eth0 netns "$base-b"
  for ns in "$base-a" "$base-b"; do
    ip -n "$ns" addr add "$prefix.$i/24" dev eth0; ip -n "$ns" link set eth0 up; ip -n "$ns" link set lo up
    if [ "${QDISC:-tbf}" = htb ]; then
      ip netns exec "$ns" tc qdisc add dev eth0 root handle 1: htb default 10
      ip netns exec "$ns" tc class add dev eth0 parent 1: classid 1:10 htb rate 1gbit ceil 1gbit ${BURST:+burst $BURST cburst $BURST}
    else
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate 1gbit burst "${BURST:-256kb}" latency 100ms
    fi
    i=$((i + 1))
  done
}
