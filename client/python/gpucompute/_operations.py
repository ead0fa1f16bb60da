"""The operations, the same for both clients: each builds its request and hands it to
the client's submit(), which blocks, returns a Future, or is a coroutine; and the
reading of a finished operation.

What each returns is what the class's submit() returns: for Client a RemoteArray once
the operation is done (a Future of it with wait=False); for a Session a Pending and for
a Chain a Step, at once; for the asyncio client and session, a coroutine of those.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional, Protocol, TypeVar

from ._proto import v1
from ._requests import (elementwise_request, gemv_request, matmul_request, random_request,
                        reduce_request)
from ._types import ArrayRef, Axis, DTypeLike, Message, ShapeLike, StreamRef
from .errors import error_for

_Result = TypeVar("_Result", covariant=True)


class _Submits(Protocol[_Result]):
    """A class with Operations: its submit() says what the operations return."""

    def submit(self, request: Message, *, wait: bool = ...) -> _Result:
        """Submits `request`; see the class."""


# An input of an expression: a remote array or a scalar.
_Input = Any


def finished(operation: Message) -> Message:
    """Raises the operation's error if it failed; returns it otherwise."""
    if operation.state == v1.Operation.STATE_FAILED:
        raise error_for(operation.error_code, operation.error_message, operation)
    return operation


def output_of(operation: Message) -> Message:
    """The BufferInfo of the operation's result; raises its error if it failed."""
    finished(operation)
    if not operation.outputs:
        raise error_for(13, f"operation {operation.id} has no output")
    return operation.outputs[0]


class Operations:
    """eval, reduce, gemv, matmul and rand.*, on top of the client's submit(request, wait).
    Wherever they read a buffer, a View of one may stand (x[::2], x.T, ...). Each builds
    its request here, in the client, and hands it to submit(), which says whether it is
    sent now (Client, Session, the asyncio ones) or at run() (Chain) and what waits.
    """

    if TYPE_CHECKING:
        def submit(self, request: Message, *, wait: bool = True) -> Any:
            """Each class's own."""

    def eval(self: _Submits[_Result], expression: str,
             inputs: Optional[Mapping[str, _Input]] = None, *, out: Optional[ArrayRef] = None,
             name: Optional[str] = None, dtype: DTypeLike = None, stream: StreamRef = None,
             wait: bool = True, **named_inputs: _Input) -> _Result:
        """out = expression(inputs), elementwise, in one fused pass on the server.

        Inputs are remote arrays (handles, Views, ids or names) and scalars, whose shapes
        broadcast as NumPy's do, given as keyword
        arguments (`eval("a*x + 1", a=2.0, x=x)`) or, for names that clash with this
        method's own keywords, in the `inputs` mapping. The result goes to a new buffer
        (optionally named, of `dtype` or the expression's NumPy 2 result type), or
        into `out` (a buffer, or a View of one to write through). The request is sent
        by submit(): at once by a client or session, at run() by a chain.
        """
        bound = dict(inputs or {})
        bound.update(named_inputs)
        return self.submit(elementwise_request(expression, bound, out, name, dtype, stream),
                           wait=wait)

    def reduce(self: _Submits[_Result], kind: str, x: ArrayRef, /, axis: Axis = None, *,
               keepdims: bool = False, ddof: int = 0, out: Optional[ArrayRef] = None,
               name: Optional[str] = None, dtype: DTypeLike = None, stream: StreamRef = None,
               wait: bool = True, inputs: Optional[Mapping[str, _Input]] = None,
               **named_inputs: _Input) -> _Result:
        """sum prod min max mean norm2 argmin argmax var std any all of `x` (a remote
        array or a View), over every axis or over `axis` (an int or a tuple, negative
        counting from the end), keeping them with length 1 when `keepdims`; var and std
        divide by N - ddof; on the server. The handle's `value` holds the result (up to
        4096 values), sent back with the operation: reading it downloads nothing.

        With inputs, `x` is an expression over them, as eval's, reduced in one pass
        without a temporary: reduce("sum", "x*y", x=a, y=b) (names that clash with
        this method's keywords go in the `inputs` mapping).
        """
        bound = dict(inputs or {})
        bound.update(named_inputs)
        request = reduce_request(kind, x, axis, out, name, dtype, stream, keepdims=keepdims,
                                 ddof=ddof, inputs=bound)
        return self.submit(request, wait=wait)

    def matmul(self: _Submits[_Result], a: ArrayRef, b: ArrayRef, c: Optional[ArrayRef] = None,
               *, transpose_a: bool = False, transpose_b: bool = False, alpha: float = 1.0,
               beta: float = 0.0, allow_tf32: bool = False, name: Optional[str] = None,
               stream: StreamRef = None, wait: bool = True) -> _Result:
        """c = alpha * op(a) @ op(b) + beta * c on the server, as numpy.matmul (2-D
        matrices, 3-D batches over the first axis, 1-D vectors), into `c` or a new
        buffer. float32 or float64; a and b may be Views (a.T, b[:, ::2]). allow_tf32:
        float32 on CUDA may use TF32 tensor cores."""
        request = matmul_request(a, b, c, transpose_a, transpose_b, alpha, beta, allow_tf32,
                                 name, stream)
        return self.submit(request, wait=wait)

    def gemv(self: _Submits[_Result], a: ArrayRef, x: ArrayRef, y: Optional[ArrayRef] = None,
             *, transpose: bool = False, alpha: float = 1.0, beta: float = 0.0,
             name: Optional[str] = None, stream: StreamRef = None,
             wait: bool = True) -> _Result:
        """y = alpha * op(a) @ x + beta * y on the server, into `y` or a new buffer."""
        return self.submit(gemv_request(a, x, y, transpose, alpha, beta, name, stream),
                           wait=wait)

    @property
    def rand(self) -> Random:
        """Counter-based random fills made on the server (nothing is uploaded):
        rand.uniform, rand.normal, rand.integers. Getting it sends nothing."""
        return Random(self)


class Random:
    """Philox4x32-10 fills keyed by (seed, offset): the same request gives the same
    numbers on every backend and run. A result's `operation.next_offset` continues the
    sequence. With `out`, the fill overwrites that buffer and `shape` is ignored.

    Each fill runs on the server and returns what the client's submit() returns (see
    the module): a RemoteArray for Client, a Pending for a Session, a Step for a Chain.
    """

    def __init__(self, client: Any) -> None:
        self._client = client

    def uniform(self, shape: ShapeLike, dtype: DTypeLike = "float64", *, seed: int = 0,
                offset: int = 0, out: Optional[ArrayRef] = None, name: Optional[str] = None,
                layout: str = "C", stream: StreamRef = None, wait: bool = True) -> Any:
        """Uniform on [0, 1), float32 or float64."""
        return self._fill("uniform", shape, dtype, seed, offset, out, name, layout, stream, wait)

    def normal(self, shape: ShapeLike, dtype: DTypeLike = "float64", *, seed: int = 0,
               offset: int = 0, mean: float = 0.0, stddev: float = 1.0, transform: str = "v2",
               out: Optional[ArrayRef] = None, name: Optional[str] = None, layout: str = "C",
               stream: StreamRef = None, wait: bool = True) -> Any:
        """Normal(mean, stddev), float32 or float64. `transform` picks how Philox bits
        become normals: "v2" (the default, Box-Muller in fixed polynomials) or "v3"
        (float32 by the inverse CDF, faster on GPUs; float64 as v2), both bitwise equal on
        every backend, or "v1" (the original, for numbers made before v2 existed)."""
        if transform not in ("v1", "v2", "v3"):
            raise ValueError(f"transform must be 'v1', 'v2' or 'v3', not {transform!r}")
        return self._fill("normal", shape, dtype, seed, offset, out, name, layout, stream, wait,
                          mean=float(mean), stddev=float(stddev),
                          normal_transform=getattr(v1, f"NORMAL_TRANSFORM_{transform.upper()}"))

    def integers(self, shape: ShapeLike, low: int, high: int, dtype: DTypeLike = "int64", *,
                 seed: int = 0, offset: int = 0, out: Optional[ArrayRef] = None,
                 name: Optional[str] = None, layout: str = "C", stream: StreamRef = None,
                 wait: bool = True) -> Any:
        """Uniform integers on [low, high), int32 or int64."""
        return self._fill("integers", shape, dtype, seed, offset, out, name, layout, stream,
                          wait, low=int(low), high=int(high))

    def _fill(self, distribution, shape, dtype, seed, offset, out, name, layout, stream, wait,
              **parameters):
        request = random_request(distribution, shape, dtype, seed, offset, out, name, layout,
                                 stream, **parameters)
        return self._client.submit(request, wait=wait)
