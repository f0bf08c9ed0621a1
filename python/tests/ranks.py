"""Spawning one process per rank for the tests, each bounded in time.

Every rank runs `rank_main.py SCENARIO ARGS...` with `BRAID_RANK`,
`BRAID_WORLD_SIZE` and a fresh file store, importing the same `braid` as the test
process. Children still running at the deadline are killed, and so are the others
when the test fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

import braid

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(braid.__file__)))


@dataclass
class RankResult:
    rank: int
    returncode: Optional[int]
    timed_out: bool
    stdout: str
    stderr: str

    def show(self) -> str:
        late = " (killed at the test's deadline)" if self.timed_out else ""
        return f"--- rank {self.rank}: exit {self.returncode}{late}\n{self.stdout}\n--- stderr\n{self.stderr}"


def run_ranks(world: int, scenario: str, *args: str, timeout: float = 120, env: Optional[Dict[str, str]] = None,
              script: str = "rank_main.py") -> List[RankResult]:
    """Run `scenario` of `script` (in this folder) on `world` ranks; return every
    rank's outcome. Never outlives `timeout` seconds: ranks still running then
    are killed (timed_out)."""
    with tempfile.TemporaryDirectory(prefix="braid-py-") as tmp:
        base = dict(os.environ)
        base.update(
            BRAID_WORLD_SIZE=str(world),
            BRAID_STORE=f"file://{tmp}/store",
            BRAID_TIMEOUT=base.get("BRAID_TEST_TIMEOUT", "30"),
            PYTHONPATH=os.pathsep.join([PACKAGE_PARENT, HERE] + ([base["PYTHONPATH"]] if base.get("PYTHONPATH") else [])),
            PYTHONUNBUFFERED="1",
        )
        base.update(env or {})
        procs = []
        outs = []
        killed = set()
        try:
            for rank in range(world):
                out = open(os.path.join(tmp, f"out{rank}"), "w+")
                err = open(os.path.join(tmp, f"err{rank}"), "w+")
                outs.append((out, err))
                procs.append(
                    subprocess.Popen(
                        [sys.executable, os.path.join(HERE, script), scenario, *args],
                        env=dict(base, BRAID_RANK=str(rank)),
                        stdout=out,
                        stderr=err,
                        stdin=subprocess.DEVNULL,
                    )
                )
            deadline = time.monotonic() + timeout
            for p in procs:
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        finally:
            for rank, p in enumerate(procs):
                if p.poll() is None:
                    killed.add(rank)
                    p.kill()
                    p.wait()
        results = []
        for rank, (p, (out, err)) in enumerate(zip(procs, outs)):
            out.seek(0)
            err.seek(0)
            results.append(RankResult(rank, p.returncode, rank in killed, out.read(), err.read()))
            out.close()
            err.close()
        return results


def assert_all_ok(results: List[RankResult]) -> None:
    """Every rank exited 0 after printing `ok` (its own checks all held)."""
    bad = [r for r in results if r.returncode != 0 or "ok" not in r.stdout.split()]
    assert not bad, "\n".join(r.show() for r in results)
