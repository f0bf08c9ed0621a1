"""Work: the handle of an asynchronous braid call (`braid_work`)."""

from __future__ import annotations

import threading
from ctypes import c_void_p
from typing import Any, Optional, Sequence

from . import _lib
from ._buffers import Pinned
from ._errors import BraidError, InvalidArgumentError

# Longest single wait: braid_work_wait_timeout takes an int of milliseconds, and a
# bounded wait lets Ctrl-C reach the main thread between slices.
_SLICE_MS = 1000


class Work:
    """An asynchronous call in flight. It holds the call's buffers until the call
    completes, so they stay valid even if the caller drops them.

    `wait()` blocks until completion and raises the call's error; `is_completed()`
    looks without blocking; `result` is the object the call wrote its output into
    (None for barrier and send).
    """

    def __init__(self, handle: c_void_p, call: str, pinned: Sequence[Pinned], result: Any) -> None:
        self._handle: Optional[c_void_p] = handle
        self._call = call
        self._pinned = list(pinned)
        self._lock = threading.Lock()
        self._done = False
        self._error: Optional[BraidError] = None
        self.result = result
        # Bound now: at interpreter exit the module's globals may be gone before __del__.
        self._free = _lib.lib().braid_work_free

    def _finish(self, error: Optional[BraidError]) -> None:
        self._done = True
        self._error = error
        for p in self._pinned:
            p.release()
        self._pinned = []

    def _poll(self, timeout_ms: Optional[int]) -> bool:
        """Under the lock: whether the work is done (recording its outcome)."""
        if self._done:
            return True
        lib = _lib.lib()
        wait_call = "braid_work_wait" if timeout_ms is None else "braid_work_wait_timeout"
        try:
            if timeout_ms is None:
                code = _lib.check(lib.braid_work_wait(self._handle), wait_call)
            else:
                code = _lib.check(lib.braid_work_wait_timeout(self._handle, timeout_ms), wait_call)
        except BraidError as e:
            # Name the call that failed, not the wait that reported it.
            if e.message.startswith(wait_call + ":"):
                e.message = f"{self._call} (async){e.message[len(wait_call):]}"
                e.args = (e.message,)
            e.call = self._call
            self._finish(e)
            return True
        if code == _lib.IN_PROGRESS:
            return False
        self._finish(None)
        return True

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the call completes (or `timeout` seconds pass): True when it
        completed, False when the time ran out first (it still runs; wait again).
        Raises the call's error (again on every later wait)."""
        if timeout is not None and timeout < 0:
            raise InvalidArgumentError(f"wait timeout {timeout} is negative", "Work.wait")
        with self._lock:
            if timeout is None:
                while not self._poll(_SLICE_MS):
                    pass
            else:
                remaining_ms = int(timeout * 1000)
                while not self._poll(min(remaining_ms, _SLICE_MS)):
                    remaining_ms -= _SLICE_MS
                    if remaining_ms <= 0:
                        return False
            if self._error is not None:
                raise self._error
            return True

    def is_completed(self) -> bool:
        """Whether the call has completed (successfully or not), without blocking."""
        with self._lock:
            return self._poll(0)

    def is_success(self) -> bool:
        """Whether the call has completed successfully, without blocking."""
        with self._lock:
            return self._poll(0) and self._error is None

    def exception(self) -> Optional[BraidError]:
        """The call's error once it has completed with one, else None (no blocking)."""
        with self._lock:
            self._poll(0)
            return self._error

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None:
            # Waits for the call if still running, so the buffers are released after.
            self._free(handle)
        for p in getattr(self, "_pinned", []):
            p.release()

    def __repr__(self) -> str:
        state = "running" if not self._done else ("failed" if self._error else "done")
        return f"<braid.Work {self._call} {state}>"
