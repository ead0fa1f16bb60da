"""The operations, the same for both clients: each builds its request and hands it to
the client's submit(), which blocks, returns a Future, or is a coroutine; and the
reading of a finished operation.
"""

from ._proto import v1
from ._requests import (elementwise_request, gemv_request, matmul_request, random_request,
                        reduce_request)
from .errors import error_for


def finished(operation):
    """Raises the operation's error if it failed; returns it otherwise."""
    if operation.state == v1.Operation.STATE_FAILED:
        raise error_for(operation.error_code, operation.error_message, operation)
    return operation


def output_of(operation):
    """The BufferInfo of the operation's result; raises its error if it failed."""
    finished(operation)
    if not operation.outputs:
        raise error_for(13, f"operation {operation.id} has no output")
    return operation.outputs[0]


class Operations:
    """eval, reduce, gemv, matmul and rand.*, on top of the client's submit(request, wait).
    Wherever they read a buffer, a View of one may stand (x[::2], x.T, ...)."""

    def eval(self, expression, inputs=None, *, out=None, name=None, dtype=None, stream=None,
             wait=True, **named_inputs):
        """out = expression(inputs), elementwise, in one fused pass.

        Inputs are remote arrays (handles, Views, ids or names) and scalars, whose shapes
        broadcast as NumPy's do, given as keyword
        arguments (`eval("a*x + 1", a=2.0, x=x)`) or, for names that clash with this
        method's own keywords, in the `inputs` mapping. The result goes to a new buffer
        (optionally named, of `dtype` or the expression's NumPy 2 result type), or
        into `out` (a buffer, or a View of one to write through).
        """
        bound = dict(inputs or {})
        bound.update(named_inputs)
        return self.submit(elementwise_request(expression, bound, out, name, dtype, stream),
                           wait=wait)

    def reduce(self, kind, x, /, axis=None, *, keepdims=False, ddof=0, out=None, name=None,
               dtype=None, stream=None, wait=True, inputs=None, **named_inputs):
        """sum prod min max mean norm2 argmin argmax var std any all of `x` (a remote
        array or a View), over every axis or over `axis` (an int or a tuple, negative
        counting from the end), keeping them with length 1 when `keepdims`; var and std
        divide by N - ddof. The handle's `value` holds the result (up to 4096 values).

        With inputs, `x` is an expression over them, as eval's, reduced in one pass
        without a temporary: reduce("sum", "x*y", x=a, y=b) (names that clash with
        this method's keywords go in the `inputs` mapping).
        """
        bound = dict(inputs or {})
        bound.update(named_inputs)
        request = reduce_request(kind, x, axis, out, name, dtype, stream, keepdims=keepdims,
                                 ddof=ddof, inputs=bound)
        return self.submit(request, wait=wait)

    def matmul(self, a, b, c=None, *, transpose_a=False, transpose_b=False, alpha=1.0,
               beta=0.0, allow_tf32=False, name=None, stream=None, wait=True):
        """c = alpha * op(a) @ op(b) + beta * c, as numpy.matmul (2-D matrices, 3-D
        batches over the first axis, 1-D vectors), into `c` or a new buffer. float32 or
        float64; a and b may be Views (a.T, b[:, ::2]). allow_tf32: float32 on CUDA may
        use TF32 tensor cores."""
        request = matmul_request(a, b, c, transpose_a, transpose_b, alpha, beta, allow_tf32,
                                 name, stream)
        return self.submit(request, wait=wait)

    def gemv(self, a, x, y=None, *, transpose=False, alpha=1.0, beta=0.0, name=None,
             stream=None, wait=True):
        """y = alpha * op(a) @ x + beta * y, into `y` or a new buffer."""
        return self.submit(gemv_request(a, x, y, transpose, alpha, beta, name, stream),
                           wait=wait)

    @property
    def rand(self):
        """Counter-based random fills: rand.uniform, rand.normal, rand.integers."""
        return Random(self)


class Random:
    """Philox4x32-10 fills keyed by (seed, offset): the same request gives the same
    numbers on every backend and run. A result's `operation.next_offset` continues the
    sequence. With `out`, the fill overwrites that buffer and `shape` is ignored."""

    def __init__(self, client):
        self._client = client

    def uniform(self, shape, dtype="float64", *, seed=0, offset=0, out=None, name=None,
                layout="C", stream=None, wait=True):
        """Uniform on [0, 1), float32 or float64."""
        return self._fill("uniform", shape, dtype, seed, offset, out, name, layout, stream, wait)

    def normal(self, shape, dtype="float64", *, seed=0, offset=0, mean=0.0, stddev=1.0,
               transform="v2", out=None, name=None, layout="C", stream=None, wait=True):
        """Normal(mean, stddev), float32 or float64. `transform` picks how Philox bits
        become normals: "v2" (the default; bitwise equal on every backend) or "v1" (the
        original, for numbers made before v2 existed)."""
        if transform not in ("v1", "v2"):
            raise ValueError(f"transform must be 'v1' or 'v2', not {transform!r}")
        return self._fill("normal", shape, dtype, seed, offset, out, name, layout, stream, wait,
                          mean=float(mean), stddev=float(stddev),
                          normal_transform=getattr(v1, f"NORMAL_TRANSFORM_{transform.upper()}"))

    def integers(self, shape, low, high, dtype="int64", *, seed=0, offset=0, out=None,
                 name=None, layout="C", stream=None, wait=True):
        """Uniform integers on [low, high), int32 or int64."""
        return self._fill("integers", shape, dtype, seed, offset, out, name, layout, stream,
                          wait, low=int(low), high=int(high))

    def _fill(self, distribution, shape, dtype, seed, offset, out, name, layout, stream, wait,
              **parameters):
        request = random_request(distribution, shape, dtype, seed, offset, out, name, layout,
                                 stream, **parameters)
        return self._client.submit(request, wait=wait)
