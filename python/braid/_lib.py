"""Loading libbraid and declaring its C ABI (include/braid.h) for ctypes.

The library is found, in order: `BRAID_LIBRARY` (a path to a libbraid.so, e.g. a
`cargo build` output while developing braid), else the copy that
`pip install ./python` put inside this package (`_libbraid*.so`).

Calls go through `CDLL`, so ctypes releases the GIL while braid runs: a blocking
collective does not stop the program's other Python threads.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from ctypes import POINTER, c_char_p, c_int, c_size_t, c_uint32, c_void_p
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from ._errors import InternalError, error_for

SUCCESS = 0
IN_PROGRESS = 9

comm_p = c_void_p
work_p = c_void_p
work_out = POINTER(c_void_p)

# Every entry point this package uses: name -> argument types (all return a
# braid_result as int). REQUIRED ones must exist; OPTIONAL ones are newer calls that
# an older libbraid may lack: the methods using them raise UnsupportedError there.
_BUF = (c_void_p, c_void_p, c_size_t, c_int)  # send, recv, count, dtype
REQUIRED: Dict[str, Tuple[Any, ...]] = {
    "braid_comm_init_from_env": (POINTER(comm_p),),
    "braid_comm_init": (c_int, c_int, c_char_p, POINTER(comm_p)),
    "braid_comm_split": (comm_p, c_int, c_int, POINTER(comm_p)),
    "braid_comm_dup": (comm_p, POINTER(comm_p)),
    "braid_comm_new_group": (comm_p, POINTER(c_int), c_size_t, POINTER(comm_p)),
    "braid_comm_destroy": (comm_p,),
    "braid_comm_abort": (comm_p,),
    "braid_comm_rank": (comm_p, POINTER(c_int)),
    "braid_comm_size": (comm_p, POINTER(c_int)),
    "braid_set_log_level": (c_char_p,),
    # Collectives: blocking, then `_async` with a trailing `braid_work **`.
    "braid_all_reduce": _BUF + (c_int, comm_p),  # op
    "braid_broadcast": _BUF + (c_int, comm_p),  # root
    "braid_reduce": _BUF + (c_int, c_int, comm_p),  # op, root
    "braid_all_gather": _BUF + (comm_p,),
    "braid_reduce_scatter": _BUF + (c_int, comm_p),  # op
    "braid_all_to_all": _BUF + (comm_p,),
    "braid_gather": _BUF + (c_int, comm_p),  # root
    "braid_scatter": _BUF + (c_int, comm_p),  # root
    "braid_barrier": (comm_p,),
    "braid_send": (c_void_p, c_size_t, c_int, c_int, comm_p),  # buf, count, dtype, peer
    "braid_recv": (c_void_p, c_size_t, c_int, c_int, comm_p),
    "braid_work_wait": (work_p,),
    "braid_work_test": (work_p,),
    "braid_work_wait_timeout": (work_p, c_int),
    "braid_work_free": (work_p,),
}
for _name in [n for n in REQUIRED if n.startswith(("braid_all_", "braid_reduce", "braid_broadcast",
                                                     "braid_gather", "braid_scatter", "braid_barrier",
                                                     "braid_send", "braid_recv"))]:
    REQUIRED[_name + "_async"] = REQUIRED[_name] + (work_out,)

# Calls added to the C ABI after this package's first version. New entry points
# (v-variants, grouped point-to-point with tags) go here with their argument types,
# and their methods in _comm.py call them through `call_optional`.
_P2P_TAGGED = (c_void_p, c_size_t, c_int, c_int, c_uint32)  # buf, count, dtype, peer, tag
_COUNTS = POINTER(c_size_t)
OPTIONAL: Dict[str, Tuple[Any, ...]] = {
    "braid_group_start": (),
    "braid_group_end_async": (work_out,),
    "braid_recv_any": (comm_p, c_void_p, c_size_t, c_int, c_uint32, POINTER(c_int)),  # comm first
    "braid_send_tagged": _P2P_TAGGED + (comm_p,),
    "braid_recv_tagged": _P2P_TAGGED + (comm_p,),
    "braid_send_tagged_async": _P2P_TAGGED + (comm_p, work_out),
    "braid_recv_tagged_async": _P2P_TAGGED + (comm_p, work_out),
    # send, send_count, recv, recv_counts, displs, dtype
    "braid_all_gather_v": (c_void_p, c_size_t, c_void_p, _COUNTS, _COUNTS, c_int, comm_p),
    # send, recv, recv_counts, dtype, op
    "braid_reduce_scatter_v": (c_void_p, c_void_p, _COUNTS, c_int, c_int, comm_p),
    # send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype
    "braid_all_to_all_v": (c_void_p, _COUNTS, _COUNTS, c_void_p, _COUNTS, _COUNTS, c_int, comm_p),
}
for _name in ("braid_all_gather_v", "braid_reduce_scatter_v", "braid_all_to_all_v"):
    OPTIONAL[_name + "_async"] = OPTIONAL[_name] + (work_out,)

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_last_error: Optional[Callable[[], bytes]] = None


def library_path() -> str:
    """Where libbraid is loaded from (see the module's note)."""
    explicit = os.environ.get("BRAID_LIBRARY")
    if explicit:
        if not os.path.isfile(explicit):
            raise ImportError(f"BRAID_LIBRARY={explicit} is not a file (point it at a libbraid.so, or unset it)")
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_libbraid*.so")) + glob.glob(os.path.join(here, "libbraid.so")))
    if not found:
        raise ImportError(
            f"libbraid is not inside the braid package at {here}: install the package with "
            "`pip install ./python` (which builds it with cargo), or set BRAID_LIBRARY to a libbraid.so "
            "(`cargo build --release -p braid-ffi` puts one in target/release/)"
        )
    return found[0]


def _declare(lib: ctypes.CDLL, name: str, argtypes: Sequence[Any]) -> None:
    fn = getattr(lib, name)
    fn.argtypes = list(argtypes)
    fn.restype = c_int


def lib() -> ctypes.CDLL:
    """The loaded library, with every known entry point declared (loaded once)."""
    global _lib, _last_error
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            loaded = ctypes.CDLL(path)
            for name, argtypes in REQUIRED.items():
                if not hasattr(loaded, name):
                    raise ImportError(f"{path} has no {name}: it is older than this braid package; rebuild it")
                _declare(loaded, name, argtypes)
            for name, argtypes in OPTIONAL.items():
                if hasattr(loaded, name):
                    _declare(loaded, name, argtypes)
            loaded.braid_last_error.argtypes = []
            loaded.braid_last_error.restype = c_char_p
            loaded.braid_version.argtypes = []
            loaded.braid_version.restype = c_char_p
            _last_error = loaded.braid_last_error
            _lib = loaded
    return _lib


def last_error() -> str:
    lib()
    assert _last_error is not None
    raw = _last_error()
    return raw.decode("utf-8", "replace") if raw else ""


def check(code: int, call: str) -> int:
    """Raise the exception for a failed call (read on the calling thread, right
    after the call, as braid_last_error requires); return SUCCESS/IN_PROGRESS."""
    if code == SUCCESS or code == IN_PROGRESS:
        return code
    raise error_for(code, last_error(), call)


_functions: Dict[str, Any] = {}


def call(name: str, *args: Any) -> int:
    """Call entry point `name` and raise on failure."""
    fn = _functions.get(name)
    if fn is None:
        fn = _functions[name] = getattr(lib(), name)
    code: int = fn(*args)
    if code == SUCCESS:
        return code
    return check(code, name)


def has(name: str) -> bool:
    """Whether the loaded library has entry point `name` (for OPTIONAL calls)."""
    return hasattr(lib(), name) and (name in REQUIRED or name in OPTIONAL)


def version() -> str:
    raw: Optional[bytes] = lib().braid_version()
    if not raw:
        raise InternalError("braid_version returned NULL", "braid_version")
    return raw.decode()
