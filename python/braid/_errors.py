"""braid's exceptions: one class per `braid_result` code, all under `BraidError`.

Each also derives from the built-in exception a Python caller would catch for that
kind of failure (`ValueError`, `TimeoutError`, `ConnectionError`, `OSError`), so
generic handlers keep working. The message is `braid_last_error()`'s, which names
the call, this rank and the peer involved.
"""

from __future__ import annotations

from typing import Dict, Optional, Type


class BraidError(Exception):
    """A braid call failed. `code` is the `braid_result` value (0 for failures
    detected in Python before reaching the library), `call` the entry point."""

    code: int = 0

    def __init__(self, message: str, call: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.call = call


class InvalidArgumentError(BraidError, ValueError):
    """Bad arguments: sizes that do not fit, a root or peer that is not a rank,
    non-contiguous or read-only buffers, a bad configuration."""

    code = 1


class BraidTimeoutError(BraidError, TimeoutError):
    """A wait passed its deadline (`BRAID_TIMEOUT`); the message names the ranks
    that did not arrive."""

    code = 2


class PeerFailedError(BraidError, ConnectionError):
    """A peer failed: it died, closed its connection or aborted (the message names
    its rank)."""

    code = 3


class AbortedError(BraidError):
    """This communicator was aborted (`Communicator.abort`)."""

    code = 4


class MismatchError(BraidError):
    """Ranks issued different calls at the same point (the message names both)."""

    code = 5


class BraidIOError(BraidError, OSError):
    """An operating-system or rendezvous-store error (connecting, binding)."""

    code = 6


class UnsupportedError(BraidError):
    """The operation or transport is not available in this build or here."""

    code = 7


class InternalError(BraidError):
    """A communicator broken by an earlier failure, a device error, or a bug."""

    code = 8


ERROR_BY_CODE: Dict[int, Type[BraidError]] = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        BraidTimeoutError,
        PeerFailedError,
        AbortedError,
        MismatchError,
        BraidIOError,
        UnsupportedError,
        InternalError,
    )
}


def error_for(code: int, message: str, call: str) -> BraidError:
    """The exception for a failed call's code and `braid_last_error()` message."""
    cls = ERROR_BY_CODE.get(code, BraidError)
    if not message:
        message = f"{call} failed with code {code} and left no message"
    err = cls(message, call)
    err.code = code
    return err
