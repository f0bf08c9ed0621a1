#!/bin/bash
# Issue 38, item 4, the long soak: random collectives on 4 workers with a SIGKILL
# and a joining replacement every 10 s, every result checked, resident memory
# compared with its value after 10 s. Usage: results/scripts/soak.sh [SECONDS] [OUT]
# (default 1800 s into results/soak-<date>.log); CI runs the 60 s version
# (tests/soak.rs).
set -euo pipefail
secs=${1:-1800}
out=${2:-results/soak-$(date -u +%F).log}
BIN=${BIN:-target/release/braid}
"$BIN" soak --ranks "${RANKS:-4}" --seconds "$secs" --kill-every "${KILL_EVERY:-10}" --seed "${SEED:-1}" \
  --transports "${TRANSPORTS:-shm,tcp}" | tee "$out"
