"""Creation functions of the array layer: buffers made on the server, never uploaded
(CreateBuffer with a fill, RandomOp, and expressions over a small index vector). Each
returns a RemoteArray freed when it is garbage collected.

Module-level functions take `client=`; without it they use the client that
gpucompute.connect() opened last.

What is sent when: full, zeros, ones, empty and their *_like are one CreateBuffer call
each, which blocks until the buffer exists; the others (random fills, arange, linspace,
eye) are operations sent through the client's session at once, without waiting (the
first index() expression of a client waits once, to learn whether the server has it).
Nothing is uploaded, except arange's and linspace's few integers on a server without
index().
"""

from __future__ import annotations

import math
import numbers
import secrets
import threading
import weakref
from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np

from . import _dispatch, _lazy
from ._requests import create_request, elementwise_request, random_request
from ._types import DTypeLike, Scalar, ShapeLike
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from ._lazy import LazyArray
    from .client import Client

_default = None


def set_default(client):
    global _default  # pylint: disable=global-statement
    _default = weakref.ref(client)


def _client(client):
    if client is not None:
        return client
    client = _default() if _default is not None else None
    if client is None:
        raise RuntimeError("no client: pass client=, or call gpucompute.connect() first")
    return client


def _shape(shape):
    if isinstance(shape, (numbers.Integral, np.integer)):
        shape = (shape,)
    shape = tuple(int(extent) for extent in shape)
    if any(extent < 0 for extent in shape):
        raise ValueError("negative dimensions are not allowed")
    return shape


def full(shape: ShapeLike, fill_value: Scalar, dtype: DTypeLike = None, *,
         client: Optional[Client] = None) -> LazyArray:
    """An array of `shape` filled with `fill_value` (dtype: NumPy's for the value),
    made on the server (a blocking call)."""
    client = _client(client)
    dtype = np.dtype(dtype) if dtype is not None else np.array(fill_value).dtype
    if dtype == np.dtype(np.int64) and isinstance(fill_value, float):
        dtype = np.dtype(np.float64)
    info = _dispatch.call(client, "CreateBuffer",
                          create_request(_shape(shape), dtype, fill_value)).buffer
    return _lazy.created(client, info)


def zeros(shape: ShapeLike, dtype: DTypeLike = np.float64, *,
          client: Optional[Client] = None) -> LazyArray:
    """NumPy's zeros, made on the server (a blocking call; nothing is uploaded)."""
    return full(shape, 0, dtype, client=client)


def ones(shape: ShapeLike, dtype: DTypeLike = np.float64, *,
         client: Optional[Client] = None) -> LazyArray:
    """NumPy's ones, made on the server (a blocking call; nothing is uploaded)."""
    return full(shape, 1, dtype, client=client)


def empty(shape: ShapeLike, dtype: DTypeLike = np.float64, *,
          client: Optional[Client] = None) -> LazyArray:
    """As zeros (a blocking call): the server fills every new buffer."""
    return zeros(shape, dtype, client=client)


def _like(function, x, dtype, shape, *args):
    return function(x.shape if shape is None else shape, *args,
                    x.dtype if dtype is None else dtype, client=x._client)


def zeros_like(x: Any, dtype: DTypeLike = None, *,
               shape: Optional[ShapeLike] = None) -> LazyArray:
    """zeros of x's shape and dtype (or those given), on x's client."""
    return _like(zeros, x, dtype, shape)


def ones_like(x: Any, dtype: DTypeLike = None, *,
              shape: Optional[ShapeLike] = None) -> LazyArray:
    """ones of x's shape and dtype (or those given), on x's client."""
    return _like(ones, x, dtype, shape)


def empty_like(x: Any, dtype: DTypeLike = None, *,
               shape: Optional[ShapeLike] = None) -> LazyArray:
    """empty of x's shape and dtype (or those given), on x's client."""
    return _like(empty, x, dtype, shape)


def full_like(x: Any, fill_value: Scalar, dtype: DTypeLike = None, *,
              shape: Optional[ShapeLike] = None) -> LazyArray:
    """full of x's shape and dtype (or those given), on x's client."""
    return _like(full, x, dtype, shape, fill_value)


def _index_vector(client, n):
    """0, 1, ... n-1 (int64), made on the server: one operation, `index(0)` over the
    shape (n,), where the server has index(); else (an older server) from
    ceil(sqrt(n)) uploaded integers, as i * k + j over a (k, k) grid cut to n."""
    if client._has_index is not False:
        request = elementwise_request("index(0)", {})
        request.elementwise.shape.extents.append(n)
        pending = _dispatch.submit(client, request)
        if client._has_index is None:
            try:
                pending.result()
            except InvalidArgumentError as error:
                if "index" not in str(error):
                    raise
                client._has_index = False
                return _index_vector(client, n)
            client._has_index = True
        return _lazy.array_from(client, pending, (n,), np.int64)
    k = max(1, math.isqrt(max(n - 1, 0)) + 1)
    digits = client.put(np.arange(k, dtype=np.int64))
    try:
        grid = _lazy.apply("add", [digits[:, None] * k, digits[None, :]])
        grid.compute()
    finally:
        client.delete(digits)
    return grid.reshape(k * k)[:n]


def eye(n: int, m: Optional[int] = None, k: int = 0, dtype: DTypeLike = np.float64, *,
        client: Optional[Client] = None) -> LazyArray:
    """NumPy's eye: ones on diagonal k of an (n, m) array, one index() expression (a
    server without index() raises NotImplementedError)."""
    client = _client(client)
    m = n if m is None else m
    dtype = np.dtype(dtype)
    request = elementwise_request(f"{dtype.name}(index(1) - index(0) == {int(k)})", {})
    request.elementwise.shape.extents.extend((int(n), int(m)))
    pending = _dispatch.submit(client, request)
    if client._has_index is None:
        try:
            pending.result()
        except InvalidArgumentError as error:
            if "index" in str(error):
                client._has_index = False
            raise NotImplementedError("eye needs a server whose expressions have index()") \
                from error
        client._has_index = True
    return _lazy.array_from(client, pending, (int(n), int(m)), dtype)


def arange(start: Union[int, float], stop: Union[int, float, None] = None,
           step: Union[int, float] = 1, dtype: DTypeLike = None, *,
           client: Optional[Client] = None) -> LazyArray:
    """NumPy's arange: start + i * step, computed on the server (a pending array)."""
    client = _client(client)
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ZeroDivisionError("arange: step is zero")
    n = max(0, math.ceil((stop - start) / step))
    if dtype is None:
        dtype = np.arange(start, start + step, step).dtype if n else np.array(
            [start, stop, step]).dtype
    dtype = np.dtype(dtype)
    if n == 0:
        return zeros((0,), dtype, client=client)
    index = _index_vector(client, n)
    # NumPy fills start, start + delta, ... with delta = (start + step) - start.
    delta = (start + step) - start
    values = index * delta + start if dtype.kind == "f" or isinstance(delta, float) else (
        index * int(delta) + int(start))
    return values.astype(dtype, copy=False) if values.dtype != dtype else values


def linspace(start: float, stop: float, num: int = 50, endpoint: bool = True,
             dtype: DTypeLike = None, *, client: Optional[Client] = None) -> LazyArray:
    """NumPy's linspace, computed on the server in float64 as NumPy does (a pending
    array)."""
    client = _client(client)
    num = int(num)
    if num < 0:
        raise ValueError(f"Number of samples, {num}, must be non-negative.")
    dtype = np.dtype(np.float64 if dtype is None else dtype)
    if num == 0:
        return zeros((0,), dtype, client=client)
    div = (num - 1) if endpoint else num
    start, stop = float(start), float(stop)
    step = (stop - start) / div if div > 0 else float("nan")
    index = _index_vector(client, num).astype(np.float64)
    if div > 0 and step != 0:
        values = index * step + start
    elif div > 0:
        values = index / div * (stop - start) + start
    else:
        values = index * (stop - start) + start
    if endpoint and num > 1:
        values = _lazy.apply("where", [index == num - 1, stop, values],
                             type_=np.dtype(np.float64), what="linspace")
    if dtype.kind in "iu":
        values = _lazy.apply("floor", [values])
    return values.astype(dtype, copy=False) if dtype != np.float64 else values


# Random fills ---------------------------------------------------------------

class _Stream:
    """A client's default random stream: one Philox key and a running counter offset."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seed = secrets.randbits(63)
        self.offset = 0


_streams = weakref.WeakKeyDictionary()


def seed(value: int, *, client: Optional[Client] = None) -> None:
    """Restarts `client`'s default random stream at key `value`, counter 0, so that
    the fills that follow are reproducible. The stream is kept here: no call."""
    client = _client(client)
    stream = _streams.setdefault(client, _Stream())
    with stream.lock:
        stream.seed, stream.offset = int(value), 0


def _random(client, distribution, shape, dtype, seed_value, **parameters):
    client = _client(client)
    shape = _shape(shape)
    dtype = np.dtype(dtype)
    if seed_value is None:
        stream = _streams.setdefault(client, _Stream())
        per = 4 if dtype == np.float32 and distribution != "integers" else 2
        with stream.lock:
            seed_value, offset = stream.seed, stream.offset
            stream.offset += -(-math.prod(shape) // per)
    else:
        offset = 0
    request = random_request(distribution, shape, dtype, seed_value, offset, **parameters)
    return _lazy.array_from(client, _dispatch.submit(client, request), shape, dtype)


def random(size: ShapeLike = (), dtype: DTypeLike = np.float64, *, seed: Optional[int] = None,
           client: Optional[Client] = None) -> LazyArray:
    """Uniform on [0, 1): Philox4x32-10 keyed by `seed` (None: the client's stream,
    see gpucompute.seed); the same seed gives the same numbers on every backend. Filled
    on the server, sent at once without waiting."""
    return _random(client, "uniform", size, dtype, seed)


def rand(*shape: int, dtype: DTypeLike = np.float64, seed: Optional[int] = None,
         client: Optional[Client] = None) -> LazyArray:
    """NumPy's rand: random(shape), the extents given as arguments."""
    return random(shape, dtype, seed=seed, client=client)


def randn(*shape: int, dtype: DTypeLike = np.float64, seed: Optional[int] = None,
          client: Optional[Client] = None) -> LazyArray:
    """NumPy's randn: standard normals of the shape given as arguments."""
    return normal(0.0, 1.0, shape, dtype, seed=seed, client=client)


def normal(loc: float = 0.0, scale: float = 1.0, size: ShapeLike = (),
           dtype: DTypeLike = np.float64, *, seed: Optional[int] = None,
           client: Optional[Client] = None) -> LazyArray:
    """Normal(loc, scale) of shape `size`, as random (Philox, filled on the server;
    the same seed gives the same numbers on every backend)."""
    return _random(client, "normal", size, dtype, seed, mean=float(loc), stddev=float(scale),
                   normal_transform=2)


def uniform(low: float = 0.0, high: float = 1.0, size: ShapeLike = (),
            dtype: DTypeLike = np.float64, *, seed: Optional[int] = None,
            client: Optional[Client] = None) -> LazyArray:
    """Uniform on [low, high) of shape `size`, as random (scaled on the server)."""
    values = random(size, dtype, seed=seed, client=client)
    return values * (high - low) + low if (low, high) != (0.0, 1.0) else values


def integers(low: int, high: Optional[int] = None, size: ShapeLike = (),
             dtype: DTypeLike = np.int64, *, seed: Optional[int] = None,
             client: Optional[Client] = None) -> LazyArray:
    """Uniform integers on [low, high) (on [0, low) without high)."""
    if high is None:
        low, high = 0, low
    return _random(client, "integers", size, dtype, seed, low=int(low), high=int(high))
