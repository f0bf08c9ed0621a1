#!/bin/bash
# 4 ranks on this host's CPUs, placed three ways, each run a cold calibration and a
# `braid perf --algo all` sweep (results/scripts/tuner_ab.sh onehost):
#   none   BRAID_BIND=none: the scheduler places the ranks
#   pairs  rank r on CPU r/2 (neighbours in pairs: what fb1566e made BRAID_BIND=auto do)
#   alt    rank r on CPU r%2 (round robin: what BRAID_BIND=auto does since 1c6792a)
#   results/scripts/bind_modes.sh RUNS OUTDIR [MODES]      then results/scripts/tuner_summarize.py OUTDIR/MODE/*/*.json
# `calib` as the first argument instead prints each rank-0 calibration of RUNS cold
# starts per mode (the times the tuner fits to), e.g. results/scripts/bind_modes.sh calib 4.
set -euo pipefail
BRAID=$(realpath "${BRAID:-target/release/braid}")
cache=${BRAID_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/braid}
wrap=$(mktemp -d); trap 'rm -rf "$wrap"' EXIT
cat > "$wrap/braid" <<EOW
#!/bin/bash
[ "\$1" = run ] && exec "$BRAID" "\$@"
r=\${BRAID_RANK:?}
case \$MODE in
  pairs) exec taskset -c \$((r / 2)) "$BRAID" "\$@" ;;
  alt) exec taskset -c \$((r % 2)) "$BRAID" "\$@" ;;
  none) BRAID_BIND=none exec "$BRAID" "\$@" ;;
esac
EOW
chmod +x "$wrap/braid"
if [ "$1" = calib ]; then
  for m in ${3:-none pairs alt}; do
    echo "== $m"
    for i in $(seq 1 "$2"); do
      rm -f "$cache"/tuner-shm-*
      MODE=$m BRAID_DEBUG=braid=debug "$wrap/braid" run -n 4 -- "$wrap/braid" perf --in-place --op all-reduce -b 1M -e 1M -n 3 -w 1 2>&1 |
        sed 's/\x1b\[[0-9;]*m//g' | grep -m1 calibrated | grep -o 'tiny_us=[0-9.]*\|near_us=[0-9.]*\|far_us=[0-9.]*\|beta_gbps=[0-9.]*' | tr '\n' ' ' || true
      echo
    done
  done
  exit
fi
runs=$1 out=$2
for r in $(seq 1 "$runs"); do
  for m in ${3:-none pairs alt}; do
    rm -f "$cache"/tuner-shm-*
    MODE=$m BRAID="$wrap/braid" "$(dirname "$0")/tuner_ab.sh" onehost 4 1 "$out/m-$m/r$r" >/dev/null
  done
done
