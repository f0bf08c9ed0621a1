"""PyTorch's own DistributedTest suite against a backend: the judge of braid's
torch.distributed backend (issue 35).

    python python/judge/run_distributed_test.py --backend braid --world-size 2 [-k PATTERN] [--json OUT]

It wires `DistributedTest._DistTestBase` (shipped in the torch wheel) the way
PyTorch's test/distributed/test_distributed_spawn.py does (one process per rank,
spawned per test, a FileStore init), with `BACKEND`/`WORLD_SIZE` in the
environment. That script accepts only torch's built-in names; the suite itself
takes any backend listed in `DistTestCases.backend_feature["plugin"]`, and
decides what to run from the "ddp"/"subgroup" feature sets, so braid is added
to those (as gloo is). Tests that compare the name with "gloo" still skip for
braid; the summary counts them apart from the others.

Prints one line per test (PASS/FAIL/SKIP) and the counts; `--json` writes
{test: outcome}. Every test is bounded by the suite's own per-test timeout
(`--timeout`, seconds). Tests named cuda/nccl/gpu are counted as skipped
without spawning them unless `--device-tests` (they skip on a CPU anyway).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import unittest
from typing import Dict


def _configure(backend: str, world_size: int, timeout: int) -> None:
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(timeout)
    os.environ["BACKEND"] = backend
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="braid-judge-"))
    os.environ.setdefault("BRAID_TIMEOUT", "60")


# Spawned ranks import this file as their main module: the configuration and the
# registration below must happen at import time, in every process.
if "BACKEND" in os.environ:
    import torch.distributed as dist
    from torch.testing._internal.common_distributed import DistTestCases

    if os.environ["BACKEND"] == "braid":
        import braid.torch  # noqa: F401 - registers the backend in every rank

        # JUDGE_EXTRA_FEATURES (comma list, e.g. "gpu") lists braid in more of the
        # suite's feature sets, to run a test that is gated on one for a reason that
        # does not apply to it (see the results for which).
        extra = [f for f in os.environ.get("JUDGE_EXTRA_FEATURES", "").split(",") if f]
        for feature in ("plugin", "ddp", "subgroup", *extra):
            DistTestCases.backend_feature[feature].add("braid")
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):  # type: ignore[misc]
        def setUp(self) -> None:
            super().setUp()
            self._spawn_processes()

    _ = dist


_DEVICE_WORDS = ("cuda", "nccl", "gpu")


class _Outcomes(unittest.TextTestResult):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.outcomes: Dict[str, str] = {}

    def _name(self, test: unittest.TestCase) -> str:
        return test.id().rsplit(".", 1)[-1]

    def addSuccess(self, test):  # type: ignore[no-untyped-def]  # noqa: N802
        super().addSuccess(test)
        self.outcomes[self._name(test)] = "pass"

    def addFailure(self, test, err):  # type: ignore[no-untyped-def]  # noqa: N802
        super().addFailure(test, err)
        self.outcomes[self._name(test)] = "fail"

    def addError(self, test, err):  # type: ignore[no-untyped-def]  # noqa: N802
        super().addError(test, err)
        self.outcomes[self._name(test)] = "fail"

    def addSkip(self, test, reason):  # type: ignore[no-untyped-def]  # noqa: N802
        super().addSkip(test, reason)
        self.outcomes[self._name(test)] = "skip"

    def addExpectedFailure(self, test, err):  # type: ignore[no-untyped-def]  # noqa: N802
        super().addExpectedFailure(test, err)
        self.outcomes[self._name(test)] = "pass"

    def addUnexpectedSuccess(self, test):  # type: ignore[no-untyped-def]  # noqa: N802
        super().addUnexpectedSuccess(test)
        self.outcomes[self._name(test)] = "fail"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="braid")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("-k", dest="patterns", action="append", default=[], help="run tests whose name contains this")
    ap.add_argument("-t", "--tests", action="append", default=[],
                    help="run exactly these tests (comma-separated names; repeatable)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per test (the suite kills its ranks after)")
    ap.add_argument("--json", help="write {test: pass|fail|skip} here")
    ap.add_argument("--device-tests", action="store_true",
                    help="also spawn the tests named cuda/nccl/gpu (else counted as skipped without running)")
    args = ap.parse_args()
    if os.environ.get("BACKEND") != args.backend or os.environ.get("WORLD_SIZE") != str(args.world_size):
        # Re-run with the environment set, so the import-time wiring above sees it.
        _configure(args.backend, args.world_size, args.timeout)
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:])
    names = unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn)
    if args.patterns:
        names = [n for n in names if any(p in n for p in args.patterns)]
    exact = {t for arg in args.tests for t in arg.split(",") if t}
    if exact:
        unknown = exact - set(names)
        if unknown:
            ap.error(f"no such tests in DistributedTest: {', '.join(sorted(unknown))}")
        names = [n for n in names if n in exact]
    outcomes: Dict[str, str] = {}
    if not args.device_tests:
        # Each test spawns its ranks (seconds each); these skip on a CPU-only machine anyway.
        device = [n for n in names if any(k in n for k in _DEVICE_WORDS)]
        outcomes.update((n, "skip") for n in device)
        names = [n for n in names if n not in outcomes]
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    start = time.monotonic()
    runner = unittest.TextTestRunner(resultclass=_Outcomes, verbosity=0, stream=open(os.devnull, "w"))
    result = runner.run(suite)
    outcomes.update(result.outcomes)  # type: ignore[attr-defined]
    for name in sorted(outcomes):
        print(f"{outcomes.get(name, 'fail').upper():4} {name}")
    counts = {k: sum(1 for v in outcomes.values() if v == k) for k in ("pass", "fail", "skip")}
    print(
        f"backend {args.backend}, world size {args.world_size}: {len(outcomes)} tests, {counts['pass']} passed, "
        f"{counts['fail']} failed, {counts['skip']} skipped in {time.monotonic() - start:.0f} s"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(outcomes, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
