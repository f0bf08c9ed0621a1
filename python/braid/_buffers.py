"""Turning Python objects into (address, element count, braid dtype) for the C ABI.

Accepted: torch tensors on the CPU (through `data_ptr()`; torch is never imported
here, a tensor is recognised by its type's module), anything exporting the buffer
protocol (NumPy arrays, memoryview, bytearray, array.array), and other DLPack
producers (through `numpy.from_dlpack`). The memory must be C-contiguous; element
types are braid's eight, anything else is a TypeError naming the type.

A `Pinned` holds the object (and, for buffer-protocol objects, the buffer export
itself, so a bytearray cannot be resized under braid) until `release()`: async
calls keep theirs until the work completes.
"""

from __future__ import annotations

import ctypes
import enum
import sys
from ctypes import POINTER, c_char_p, c_int, c_ssize_t, c_void_p, py_object
from typing import Any, Dict, Optional

from ._errors import InvalidArgumentError


class DType(enum.IntEnum):
    """braid's element types (`braid_dtype`)."""

    F32 = 0
    F64 = 1
    F16 = 2
    BF16 = 3
    I8 = 4
    U8 = 5
    I32 = 6
    I64 = 7


ITEMSIZE = {DType.F32: 4, DType.F64: 8, DType.F16: 2, DType.BF16: 2, DType.I8: 1, DType.U8: 1, DType.I32: 4, DType.I64: 8}

# By dtype name: NumPy's `dtype.name` (bfloat16 from ml_dtypes) and torch's
# `str(dtype)` without the "torch." prefix.
_BY_NAME = {
    "float32": DType.F32,
    "float64": DType.F64,
    "float16": DType.F16,
    "bfloat16": DType.BF16,
    "int8": DType.I8,
    "uint8": DType.U8,
    "int32": DType.I32,
    "int64": DType.I64,
}
_SUPPORTED = "float32, float64, float16, bfloat16, int8, uint8, int32, int64"

# Buffer-protocol format characters (struct module), native size and order.
_FORMAT_FLOAT = {"f": DType.F32, "d": DType.F64, "e": DType.F16}
_FORMAT_SIGNED = "bhilq"
_FORMAT_UNSIGNED = "BHILQ"
_SIGNED_BY_SIZE = {1: DType.I8, 4: DType.I32, 8: DType.I64}


class _PyBuffer(ctypes.Structure):
    """CPython's `Py_buffer` (layout fixed since Python 3.3)."""

    _fields_ = [
        ("buf", c_void_p),
        ("obj", c_void_p),
        ("len", c_ssize_t),
        ("itemsize", c_ssize_t),
        ("readonly", c_int),
        ("ndim", c_int),
        ("format", c_char_p),
        ("shape", POINTER(c_ssize_t)),
        ("strides", POINTER(c_ssize_t)),
        ("suboffsets", POINTER(c_ssize_t)),
        ("internal", c_void_p),
    ]


_PyBUF_WRITABLE = 0x0001
_PyBUF_FORMAT = 0x0004
_PyBUF_C_CONTIGUOUS = 0x0038
_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [py_object, POINTER(_PyBuffer), c_int]
_get_buffer.restype = c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [POINTER(_PyBuffer)]
_release_buffer.restype = None


def dtype_from_name(name: str, what: str) -> DType:
    dt = _BY_NAME.get(name)
    if dt is None:
        raise TypeError(f"{what} has element type {name}, which braid does not support (supported: {_SUPPORTED})")
    return dt


def _dtype_from_format(fmt: str, itemsize: int, what: str) -> DType:
    code = fmt
    if code and code[0] in "@=" or (code and code[0] == "<" and sys.byteorder == "little"):
        code = code[1:]
    if code in _FORMAT_FLOAT:
        return _FORMAT_FLOAT[code]
    if code in _FORMAT_SIGNED and itemsize in _SIGNED_BY_SIZE:
        return _SIGNED_BY_SIZE[itemsize]
    if code in _FORMAT_UNSIGNED and itemsize == 1 or code == "c":
        return DType.U8
    raise TypeError(
        f"{what} has buffer format {fmt!r} ({itemsize}-byte elements), which braid does not support "
        f"(supported: {_SUPPORTED})"
    )


def is_torch_tensor(obj: Any) -> bool:
    """A torch tensor, recognised without importing torch."""
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous")


class Pinned:
    """A buffer held for braid: its address, element count and dtype."""

    __slots__ = ("obj", "address", "count", "dtype", "_view")

    def __init__(self, obj: Any, what: str, writable: bool) -> None:
        self.obj = obj
        self._view: Optional[_PyBuffer] = None
        if is_torch_tensor(obj):
            self._pin_tensor(obj, what)
        elif type(obj).__module__ == "numpy" and type(obj).__name__ == "ndarray":
            self._pin_numpy(obj, what, writable)
        elif _has_buffer(obj):
            self._pin_buffer(obj, what, writable)
        elif hasattr(obj, "__dlpack__"):
            try:
                import numpy
            except ImportError as e:  # pragma: no cover - numpy is in every test venv
                raise TypeError(f"{what} is a DLPack object; reading it needs numpy (`pip install numpy`)") from e
            try:
                self.obj = numpy.from_dlpack(obj)
            except (BufferError, RuntimeError, TypeError, ValueError) as e:
                raise TypeError(f"{what}: braid reads DLPack objects in CPU memory only ({e})") from e
            self._pin_buffer(self.obj, what, writable)
        else:
            raise TypeError(
                f"{what} is a {type(obj).__name__}: braid takes NumPy arrays, torch CPU tensors, DLPack "
                "objects or anything with the buffer protocol (bytearray, memoryview, array.array)"
            )

    def _pin_tensor(self, t: Any, what: str) -> None:
        device = getattr(t, "device", None)
        if device is not None and getattr(device, "type", "cpu") != "cpu":
            raise InvalidArgumentError(f"{what} is a tensor on {device}: this package passes CPU tensors only")
        if not t.is_contiguous():
            raise InvalidArgumentError(
                f"{what} is a non-contiguous tensor (shape {tuple(t.shape)}, strides {tuple(t.stride())}): "
                "pass .contiguous() and copy the result back"
            )
        dt = _torch_dtypes.get(t.dtype)
        if dt is None:
            dt = _torch_dtypes[t.dtype] = dtype_from_name(str(t.dtype).replace("torch.", ""), what)
        self.dtype = dt
        self.count = int(t.numel())
        self.address = int(t.data_ptr()) if self.count else None

    def _pin_numpy(self, a: Any, what: str, writable: bool) -> None:
        # A NumPy array cannot be resized while this reference exists (numpy's
        # refcheck), so holding it pins its memory; no buffer export needed.
        flags = a.flags
        if not flags.c_contiguous:
            raise InvalidArgumentError(
                f"{what} is not C-contiguous (shape {a.shape}, strides {a.strides}): pass a contiguous "
                "copy (numpy.ascontiguousarray) and copy the result back"
            )
        if writable and not flags.writeable:
            raise InvalidArgumentError(f"{what} is read-only, and braid writes the result into it")
        self.dtype = _numpy_dtype(a.dtype, what)
        self.count = int(a.size)
        self.address = a.__array_interface__["data"][0] if self.count else None

    def _pin_buffer(self, obj: Any, what: str, writable: bool) -> None:
        # Inspect through a memoryview first for clear messages; the pointer then
        # comes from a buffer export of our own, held until release().
        mv = memoryview(obj)
        try:
            if not mv.c_contiguous:
                raise InvalidArgumentError(
                    f"{what} is not C-contiguous (shape {mv.shape}, strides {mv.strides}): pass a contiguous "
                    "copy (numpy.ascontiguousarray) and copy the result back"
                )
            if writable and mv.readonly:
                raise InvalidArgumentError(f"{what} is read-only, and braid writes the result into it")
            dtype_obj: Any = getattr(obj, "dtype", None)
            if isinstance(getattr(dtype_obj, "name", None), str) and hasattr(obj, "__array_interface__"):
                self.dtype = _numpy_dtype(dtype_obj, what)
            else:
                self.dtype = _dtype_from_format(mv.format, mv.itemsize, what)
            if mv.nbytes % ITEMSIZE[self.dtype]:
                raise InvalidArgumentError(f"{what} holds {mv.nbytes} bytes, not a whole number of {self.dtype.name}")
            self.count = mv.nbytes // ITEMSIZE[self.dtype]
        finally:
            mv.release()
        view = _PyBuffer()
        flags = _PyBUF_C_CONTIGUOUS | _PyBUF_FORMAT | (_PyBUF_WRITABLE if writable else 0)
        if _get_buffer(obj, ctypes.byref(view), flags) != 0:  # pragma: no cover - checked above
            raise InvalidArgumentError(f"{what}: its buffer could not be exported")
        self._view = view
        self.address = view.buf if self.count else None

    def release(self, _release: Any = _release_buffer, _byref: Any = ctypes.byref) -> None:
        """Give the buffer back (idempotent). The defaults bind the C functions, which
        module teardown at interpreter exit could otherwise remove first."""
        if self._view is not None:
            _release(_byref(self._view))
            self._view = None
        self.obj = None

    def __del__(self) -> None:
        self.release()


_NATIVE_ORDER = "<" if sys.byteorder == "little" else ">"


# NumPy's and torch's dtypes -> braid's, as found (this is on every call's path,
# and NumPy computes `dtype.name` in Python).
_numpy_dtypes: Dict[Any, DType] = {}
_torch_dtypes: Dict[Any, DType] = {}


def _numpy_dtype(dtype_obj: Any, what: str) -> DType:
    known = _numpy_dtypes.get(dtype_obj)
    if known is not None:
        return known
    # NumPy names a big-endian int32 "int32" too: the byte order decides.
    if dtype_obj.byteorder not in ("=", "|", _NATIVE_ORDER):
        raise TypeError(f"{what} has non-native byte order ({dtype_obj.str}): use .astype(its native type)")
    dt = _numpy_dtypes[dtype_obj] = dtype_from_name(dtype_obj.name, what)
    return dt


def _has_buffer(obj: Any) -> bool:
    try:
        memoryview(obj).release()
        return True
    except TypeError:
        return False


def pin(obj: Any, what: str, writable: bool) -> Pinned:
    return Pinned(obj, what, writable)
