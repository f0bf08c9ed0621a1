#!/usr/bin/env bash
# Memory checking of the unsafe-heavy code under valgrind's memcheck: byte rings,
# in-process links and their single copy, shared-memory segments, registered
# buffers, the verbs channel on a software adapter, reduction kernels, frame and
# descriptor decoders, and single copy
# through the executor (tests/memory_safety.rs). Miri and the sanitizers need
# nightly; CI has only the stable toolchain.
#
# Any invalid read or write, use of uninitialised memory or bad free fails the run
# (exit 99). Leaks are not errors: rank threads and process-wide registries live
# until exit by design.
#
# Usage: .ci/memcheck.sh              the default selection (about 2 minutes to
#                                     build, 1 to run, on 2 cores)
#        .ci/memcheck.sh FILTER...    only tests whose names contain a FILTER
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

if ! command -v valgrind >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends valgrind
  else
    echo "memcheck: valgrind is not installed (apt-get install valgrind)" >&2
    exit 1
  fi
fi

# Unoptimised, in a target directory of its own: at opt-level 2 memcheck reports
# branches on enum discriminants that the optimiser assembles from partly
# initialised words (e.g. `?` on shm::attach's Result), which are not errors of
# the program; at opt-level 0 the same tests are clean.
export CARGO_TARGET_DIR=${MEMCHECK_TARGET_DIR:-target/memcheck}
export CARGO_PROFILE_TEST_OPT_LEVEL=0

# The test executables cargo builds for `$@` (lib unit tests, an integration test).
test_binaries() {
  cargo test "$@" --no-run --message-format=json \
    | grep '"profile":{[^}]*"test":true' \
    | grep -o '"executable":"[^"]*"' \
    | sed 's/^"executable":"//; s/"$//'
}

# Threads run one at a time under valgrind; --fair-sched keeps a spinning rank from
# starving the peer it waits for. One test at a time keeps deadlines meaningful.
VALGRIND=(valgrind --tool=memcheck --error-exitcode=99 --errors-for-leak-kinds=none
  --fair-sched=yes --num-callers=30 --quiet)

run() {
  local bin=$1
  shift
  echo "=== memcheck: $(basename "$bin") $* ($(date -u +%H:%M:%S))"
  local t0=$SECONDS
  "${VALGRIND[@]}" "$bin" --test-threads=1 "$@"
  echo "=== memcheck: $(basename "$bin") passed in $((SECONDS - t0)) s"
}

lib=$(test_binaries --lib)
safety=$(test_binaries --test memory_safety)
[ -n "$lib" ] && [ -n "$safety" ] || { echo "memcheck: test binaries not found" >&2; exit 1; }

if [ $# -gt 0 ]; then
  run "$lib" "$@"
  run "$safety" "$@"
  exit 0
fi

# Skipped under valgrind, for the tool's sake, not the code's:
# - killed_peer_process_is_eof_within_a_second: valgrind 3.19 lacks pidfd_open
#   (syscall 434), and without a pidfd the peer, a zombie child of this test
#   process until reaped, still answers kill(pid, 0);
# - two_processes_exchange_64_mib...: process_vm_readv against the valgrind'ed
#   process fails with ESRCH, and 64 MiB each way takes over a minute.
run "$lib" transport::ring:: transport::loopback:: transport::shm:: transport::rdma:: registered:: reduce:: executor:: frame:: \
  --skip killed_peer_process_is_eof_within_a_second --skip two_processes_exchange_64_mib
# Single copy between threads through the executor: the happy path, late readers
# after a timeout (refused, not a read of freed memory), registered segments.
run "$safety"
