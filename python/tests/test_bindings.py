"""braid's Python bindings across processes: world sizes 1-4, NumPy and torch.

Each test starts one process per rank (rank_main.py), bounded in time; the ranks
check their results themselves (exact integers) and print `ok`.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

try:
    import braid

    braid.library_version()
except ImportError as e:
    # Under CI=true the package must be there (.ci/run installs it).
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"the braid package does not load in {sys.executable}: {e}") from e
    pytest.skip(f"braid does not load: {e}", allow_module_level=True)

from ranks import RankResult, assert_all_ok, run_ranks  # noqa: E402


def _need(module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{module} is not installed in this Python ({sys.executable}); .ci/run installs it")
        pytest.skip(f"{module} is not installed")


def _report(r: RankResult) -> dict:
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert lines, r.show()
    return json.loads(lines[-1])


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_every_collective_exact(kind: str, world: int) -> None:
    _need(kind)
    assert_all_ok(run_ranks(world, "collectives", kind, timeout=240))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_uneven_collectives_and_tags_exact(kind: str, world: int) -> None:
    _need(kind)
    assert_all_ok(run_ranks(world, "uneven_and_tagged", kind, timeout=240))


def test_every_dtype_and_buffer_kind() -> None:
    _need("numpy")
    _need("torch")
    assert_all_ok(run_ranks(2, "dtypes", timeout=120))


@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_bad_local_input_is_refused(kind: str, world: int) -> None:
    _need(kind)
    assert_all_ok(run_ranks(world, "bad_local_input", kind, timeout=120))


@pytest.mark.parametrize("what", ["dtype", "count"])
def test_mismatch_across_ranks_raises_on_every_rank(what: str) -> None:
    _need("numpy")
    results = run_ranks(2, "mismatch", what, timeout=90, env={"BRAID_TIMEOUT": "10"})
    assert_all_ok(results)
    differing = {"dtype": ("dtype=i32", "dtype=f32"), "count": ("count=8", "count=16")}[what]
    for r in results:
        report = _report(r)
        assert report["type"] == "MismatchError" and report["call"] == "braid_all_reduce", report
        # names this rank, the other rank, and both calls
        assert f"rank {r.rank}" in report["message"] and f"rank {1 - r.rank}" in report["message"], report
        assert all(d in report["message"] for d in differing), report


def test_dead_peer_is_named_by_the_others() -> None:
    _need("numpy")
    victim = 1
    results = run_ranks(3, "dead_peer", str(victim), timeout=90, env={"BRAID_TIMEOUT": "20"})
    assert results[victim].returncode == -9, results[victim].show()
    assert_all_ok([r for r in results if r.rank != victim])
    for r in results:
        if r.rank != victim:
            report = _report(r)
            assert report["type"] == "PeerFailedError", report
            assert f"rank {victim}" in report["message"] and "braid_all_reduce" in report["message"], report


def test_abort_fails_the_peers_call() -> None:
    _need("numpy")
    results = run_ranks(2, "abort", timeout=90, env={"BRAID_TIMEOUT": "20"})
    assert_all_ok(results)
    report = _report(results[0])
    assert report["type"] == "PeerFailedError" and "rank 1" in report["message"], report


def test_wait_with_timeout_and_the_deadline() -> None:
    _need("numpy")
    results = run_ranks(2, "late_peer", timeout=90, env={"BRAID_TIMEOUT": "4", "SILENT_SECONDS": "8"})
    assert_all_ok(results)
    report = _report(results[0])
    assert report["type"] == "BraidTimeoutError" and "waiting for rank(s) [1]" in report["message"], report


def test_blocking_call_releases_the_gil() -> None:
    _need("numpy")
    assert_all_ok(run_ranks(2, "threads", timeout=60))


def test_destroy_waits_for_a_call_in_flight_on_another_thread() -> None:
    _need("numpy")
    assert_all_ok(run_ranks(2, "destroy_waits", timeout=60))
