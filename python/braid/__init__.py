"""braid from Python: collectives over libbraid's C ABI (ctypes; no compiled
extension). See python/README.md.

    import braid, numpy as np
    comm = braid.Communicator.from_env()          # under `braid run -n 4 python prog.py`
    x = np.full(4, comm.rank, dtype=np.int64)
    comm.all_reduce(x)                            # in place, sum
    w = comm.all_gather(x, np.empty(4 * comm.world_size, np.int64), async_op=True)
    w.wait()
    comm.destroy()
"""

from __future__ import annotations

from . import _lib
from ._buffers import DType
from ._comm import P2pWork, Communicator, ReduceOp
from ._errors import (
    AbortedError,
    BraidError,
    BraidIOError,
    BraidTimeoutError,
    InternalError,
    InvalidArgumentError,
    MismatchError,
    PeerFailedError,
    UnsupportedError,
)
from ._work import Work

__version__ = "0.1.0"


def library_version() -> str:
    """The version libbraid was built from."""
    return _lib.version()


def library_path() -> str:
    """The path of the libbraid this package loads."""
    return _lib.library_path()


def set_log_level(filter: str) -> None:
    """Which of braid's log lines reach stderr (as `BRAID_DEBUG`): "warn", "debug", "braid=trace"."""
    _lib.call("braid_set_log_level", filter.encode())


__all__ = [
    "AbortedError",
    "BraidError",
    "BraidIOError",
    "BraidTimeoutError",
    "Communicator",
    "DType",
    "InternalError",
    "InvalidArgumentError",
    "MismatchError",
    "PeerFailedError",
    "ReduceOp",
    "UnsupportedError",
    "Work",
    "P2pWork",
    "library_path",
    "library_version",
    "set_log_level",
]
