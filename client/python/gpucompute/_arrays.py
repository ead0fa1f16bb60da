"""NumPy's side of the wire, for both clients: dtypes and layouts, scalars, an array's
bytes as they are sent, references to remote arrays and streams, and what a handle knows
of its remote array (RemoteArrayInfo).
"""

from __future__ import annotations

import numbers
from typing import Any, Optional, Tuple

import numpy as np

from ._proto import enum_name, v1
from ._types import Message
from ._views import View, ViewMethods

_DTYPES = {
    np.dtype(np.float32): v1.DTYPE_FLOAT32,
    np.dtype(np.float64): v1.DTYPE_FLOAT64,
    np.dtype(np.int32): v1.DTYPE_INT32,
    np.dtype(np.int64): v1.DTYPE_INT64,
    np.dtype(np.bool_): v1.DTYPE_BOOL,
}
_NUMPY_DTYPES = {number: dtype for dtype, number in _DTYPES.items()}
_LAYOUTS = {"C": v1.LAYOUT_C, "F": v1.LAYOUT_F}


def dtype_enum(dtype):
    """The DType for a NumPy dtype or its name; None gives DTYPE_UNSPECIFIED."""
    if dtype is None:
        return v1.DTYPE_UNSPECIFIED
    try:
        numpy_dtype = np.dtype(dtype)
    except TypeError as error:
        raise TypeError(f"not a dtype: {dtype!r}") from error
    number = _DTYPES.get(numpy_dtype.newbyteorder("="))
    if number is None:
        raise TypeError(f"gpucompute has no {numpy_dtype} arrays; it has float32, float64, "
                        "int32, int64 and bool")
    return number


def numpy_dtype(number):
    """The NumPy dtype of a DType."""
    dtype = _NUMPY_DTYPES.get(number)
    if dtype is None:
        raise TypeError(f"the server sent an unknown dtype {number}")
    return dtype


def layout_enum(layout):
    try:
        return _LAYOUTS[layout.upper()]
    except (KeyError, AttributeError):
        raise ValueError(f"layout must be 'C' or 'F', not {layout!r}") from None


class TaggedOutput:
    """The output of an operation of a session or chain, named by the reference
    "tag:<t>" (`ref`), which only later operations of the same session or chain
    understand (_session.Pending, _chain.Step)."""

    __slots__ = ("ref",)
    ref: str


def buffer_ref(value):
    """A buffer's id or name, from a handle or a string (or a View that is its whole
    buffer, or a session's or chain's tagged output); where a view cannot stand, a View
    of it is a TypeError."""
    if isinstance(value, RemoteArrayInfo):
        return value.id
    if isinstance(value, TaggedOutput):
        return value.ref
    if isinstance(value, View):
        if value.steps:
            raise TypeError("a view cannot stand here: pass its buffer, or copy the view "
                            "into a new buffer with eval('x', x=view)")
        return buffer_ref(value.base)
    if isinstance(value, str):
        return value
    if isinstance(value, (np.ndarray, list, tuple)):
        raise TypeError("pass a remote array (a handle, id or name), not host data: "
                        "upload it with put() first")
    raise TypeError(f"not a remote array, id or name: {type(value).__name__}")


def stream_ref(stream):
    """A stream id, from a string, a StreamInfo or None (the default stream)."""
    if stream is None:
        return ""
    if isinstance(stream, str):
        return stream
    stream_id = getattr(stream, "id", None)
    if isinstance(stream_id, str):
        return stream_id
    raise TypeError(f"not a stream: {stream!r}")


def scalar_message(value):
    """A Scalar: Python and NumPy bools, integers and floats."""
    scalar = v1.Scalar()
    if isinstance(value, (bool, np.bool_)):
        scalar.bool_value = bool(value)
    elif isinstance(value, numbers.Integral):
        scalar.int_value = int(value)
    elif isinstance(value, numbers.Real):
        scalar.float_value = float(value)
    else:
        raise TypeError(f"not a scalar: {type(value).__name__}")
    return scalar


def scalar_value(scalar):
    which = scalar.WhichOneof("value")
    return getattr(scalar, which) if which else None


def host_bytes(array):
    """The array as (dtype, shape, layout, memoryview of its bytes), copying only when
    the memory is not contiguous or not little-endian."""
    if isinstance(array, RemoteArrayInfo):
        raise TypeError("the array is already remote")
    array = np.asarray(array)
    number = dtype_enum(array.dtype)
    if array.dtype.byteorder not in ("=", "|"):
        array = array.astype(array.dtype.newbyteorder("="))
    layout = "C"
    if array.ndim >= 2 and array.flags.f_contiguous and not array.flags.c_contiguous:
        layout = "F"
    elif not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    # ravel(order="K") of a contiguous array is a view in memory order.
    data = memoryview(array.ravel(order="K").view(np.uint8))
    return number, array.shape, layout, data


class RemoteArrayInfo(ViewMethods):
    """What a handle knows of its remote array, without asking the server.

    id, name, shape, dtype (NumPy), layout ("C" or "F"), size, nbytes, device; the
    operation that produced it (None for uploads and created buffers) with its
    timing; transfer: the TransferStats (bytes, seconds, GB/s) of the handle's last
    upload or download through get() (None before one); value: a reduction's result
    as the server returned it inline (a NumPy scalar, or an array along an axis).

    Indexing and NumPy's shape functions (x[0:10, ::2], x.T, x.reshape(2, -1), ...)
    make Views of it (gpucompute._views), without a server call. Every property here is
    read from what the handle holds: none calls the server.
    """

    def __init__(self, client: Any, info: Message, operation: Optional[Message] = None,
                 transfer: Optional[Message] = None) -> None:
        self._client = client
        self.info = info
        self.operation = operation
        self.transfer = transfer

    def _view_parts(self):
        return self, (), self.shape, self._client

    @property
    def id(self) -> str:
        """The buffer's id on the server."""
        return self.info.id

    @property
    def name(self) -> Optional[str]:
        """The buffer's name, or None."""
        return self.info.name or None

    @property
    def shape(self) -> Tuple[int, ...]:
        """The array's shape."""
        return tuple(self.info.shape)

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self.info.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        """The NumPy dtype."""
        return numpy_dtype(self.info.dtype)

    @property
    def layout(self) -> str:
        """"C" or "F": the memory order on the server."""
        return "F" if self.info.layout == v1.LAYOUT_F else "C"

    @property
    def size(self) -> int:
        """The number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """The size of the buffer in bytes."""
        return self.info.size_bytes

    @property
    def device(self) -> int:
        """The server's device that holds the buffer."""
        return self.info.device

    @property
    def timing(self) -> Optional[Message]:
        """The operation's Timing (device and queued seconds, bytes, GB/s, GFLOP/s)."""
        if self.operation is None or not self.operation.HasField("timing"):
            return None
        return self.operation.timing

    @property
    def value(self) -> Any:
        """A reduction's result, sent back with the operation (no download): a NumPy
        scalar, or an array for a reduction along axes; None for other arrays."""
        if self.operation is None or not self.operation.values:
            return None
        values = np.array([scalar_value(s) for s in self.operation.values], dtype=self.dtype)
        if values.size != self.size:
            return None
        return values.reshape(self.shape)[()]

    def _describe(self):
        text = f"{self.id}"
        if self.name:
            text += f" ({self.name})"
        text += f" {self.dtype}{list(self.shape)}"
        if self.layout == "F":
            text += " F"
        timing = self.timing
        if timing is not None:
            kind = enum_name("OperationKind", self.operation.kind)
            text += (f" {kind.removeprefix('OPERATION_KIND_').lower()} "
                     f"{timing.device_seconds * 1e3:.3f} ms {timing.gbps:.2f} GB/s")
        if self.transfer is not None:
            text += f" transferred in {self.transfer.seconds:.3f} s {self.transfer.gbps:.2f} GB/s"
        return text

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._describe()}>"
