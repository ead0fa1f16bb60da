"""The Python array API standard (2023.12) over remote arrays, for what the server has:
x.__array_namespace__() returns this module. Everything runs on the server; creation
functions take `device=` as a Client (default: the client gpucompute.connect() opened
last). Any other name of the standard raises NotImplementedError naming it (which is
also an AttributeError, so hasattr() is False). The deviations are listed in the
client's README ("The array API namespace").

As for the operators: elementwise functions return a pending expression, sent when
needed; reductions and matmul are sent at once, without waiting; the creation
functions are those of gpucompute (zeros and full block on a CreateBuffer call); the
shape functions make Views, with no call; result_type and isdtype run here.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any, Iterable, List, Optional, Tuple, Union

import numpy as np

from . import _composed, _creation, _functions, _lazy, _ufuncs
from ._types import Array, Axis, DTypeLike, Scalar, ShapeLike
from ._views import View

if TYPE_CHECKING:
    from ._lazy import LazyArray
    from .client import Client

# An operand of an elementwise function: an array or a scalar.
_Operand = Union[Array, Scalar]

__array_api_version__ = "2023.12"

# Annotations below name Python's bool as builtins.bool.
bool = np.bool_  # pylint: disable=redefined-builtin
int32 = np.int32
int64 = np.int64
float32 = np.float32
float64 = np.float64
e = float(np.e)
pi = float(np.pi)
inf = float("inf")
nan = float("nan")
newaxis = None


class NotSupported(NotImplementedError, AttributeError):
    """A function of the array API standard that the server does not have."""


def _unary(ufunc: str) -> Any:
    def function(x: Array, /) -> LazyArray:
        return _lazy.apply(ufunc, [x])
    function.__name__ = ufunc
    function.__doc__ = f"numpy.{ufunc}, elementwise on the server (a pending expression)."
    return function


def _binary(ufunc: str) -> Any:
    def function(x1: _Operand, x2: _Operand, /) -> LazyArray:
        return _lazy.apply(ufunc, [x1, x2])
    function.__name__ = ufunc
    function.__doc__ = f"numpy.{ufunc}, elementwise on the server (a pending expression)."
    return function


# The standard's name -> the ufunc's.
_UNARY = {"abs": "absolute", "acos": "arccos", "acosh": "arccosh", "asin": "arcsin",
          "asinh": "arcsinh", "atan": "arctan", "atanh": "arctanh", "bitwise_invert": "invert",
          "ceil": "ceil", "cos": "cos", "cosh": "cosh", "exp": "exp", "expm1": "expm1",
          "floor": "floor", "isfinite": "isfinite", "isinf": "isinf", "isnan": "isnan",
          "log": "log", "log1p": "log1p", "log2": "log2", "log10": "log10",
          "logical_not": "logical_not", "negative": "negative", "positive": "positive",
          "sign": "sign", "signbit": "signbit", "sin": "sin", "sinh": "sinh",
          "square": "square", "sqrt": "sqrt", "tan": "tan", "tanh": "tanh", "trunc": "trunc",
          "reciprocal": "reciprocal"}
_BINARY = {"add": "add", "atan2": "arctan2", "bitwise_and": "bitwise_and",
           "bitwise_left_shift": "left_shift", "bitwise_or": "bitwise_or",
           "bitwise_right_shift": "right_shift", "bitwise_xor": "bitwise_xor",
           "copysign": "copysign", "divide": "true_divide", "equal": "equal",
           "floor_divide": "floor_divide", "greater": "greater",
           "greater_equal": "greater_equal", "hypot": "hypot", "less": "less",
           "less_equal": "less_equal", "logical_and": "logical_and",
           "logical_or": "logical_or", "logical_xor": "logical_xor", "maximum": "maximum",
           "minimum": "minimum", "multiply": "multiply", "not_equal": "not_equal",
           "pow": "power", "remainder": "remainder", "subtract": "subtract"}
globals().update({name: _unary(ufunc) for name, ufunc in _UNARY.items()})
globals().update({name: _binary(ufunc) for name, ufunc in _BINARY.items()})


def round(x: Array, /) -> LazyArray:  # pylint: disable=redefined-builtin
    """numpy.round, elementwise on the server (a pending expression)."""
    return _functions.round_(x)


def clip(x: Array, /, min: Optional[Scalar] = None,  # pylint: disable=redefined-builtin
         max: Optional[Scalar] = None) -> LazyArray:  # pylint: disable=redefined-builtin
    """x limited to [min, max], elementwise on the server (a pending expression)."""
    if min is None and max is None:
        return x.copy()
    return _functions.clip(x, min, max)


# Creation -------------------------------------------------------------------


def _client(device: Optional[Client]) -> Client:
    return device if device is not None else _creation._client(None)


def zeros(shape: ShapeLike, *, dtype: DTypeLike = None,
          device: Optional[Client] = None) -> LazyArray:
    """gpucompute.zeros on `device` (a blocking call)."""
    return _creation.zeros(shape, dtype or float64, client=_client(device))


def ones(shape: ShapeLike, *, dtype: DTypeLike = None,
         device: Optional[Client] = None) -> LazyArray:
    """gpucompute.ones on `device` (a blocking call)."""
    return _creation.ones(shape, dtype or float64, client=_client(device))


def empty(shape: ShapeLike, *, dtype: DTypeLike = None,
          device: Optional[Client] = None) -> LazyArray:
    """gpucompute.empty on `device` (a blocking call)."""
    return _creation.empty(shape, dtype or float64, client=_client(device))


def full(shape: ShapeLike, fill_value: Scalar, *, dtype: DTypeLike = None,
         device: Optional[Client] = None) -> LazyArray:
    """gpucompute.full on `device` (a blocking call)."""
    return _creation.full(shape, fill_value, dtype, client=_client(device))


def zeros_like(x: Array, /, *, dtype: DTypeLike = None,
               device: Optional[Client] = None) -> LazyArray:
    """gpucompute.zeros_like, on x's client."""
    return _creation.zeros_like(x, dtype)


def ones_like(x: Array, /, *, dtype: DTypeLike = None,
              device: Optional[Client] = None) -> LazyArray:
    """gpucompute.ones_like, on x's client."""
    return _creation.ones_like(x, dtype)


def empty_like(x: Array, /, *, dtype: DTypeLike = None,
               device: Optional[Client] = None) -> LazyArray:
    """gpucompute.empty_like, on x's client."""
    return _creation.empty_like(x, dtype)


def full_like(x: Array, /, fill_value: Scalar, *, dtype: DTypeLike = None,
              device: Optional[Client] = None) -> LazyArray:
    """gpucompute.full_like, on x's client."""
    return _creation.full_like(x, fill_value, dtype)


def arange(start: Union[int, float], /, stop: Union[int, float, None] = None,
           step: Union[int, float] = 1, *, dtype: DTypeLike = None,
           device: Optional[Client] = None) -> LazyArray:
    """gpucompute.arange on `device` (a pending array)."""
    return _creation.arange(start, stop, step, dtype, client=_client(device))


def linspace(start: float, stop: float, /, num: int, *, dtype: DTypeLike = None,
             device: Optional[Client] = None, endpoint: builtins.bool = True) -> LazyArray:
    """gpucompute.linspace on `device` (a pending array)."""
    return _creation.linspace(start, stop, num, endpoint, dtype, client=_client(device))


def eye(n_rows: int, n_cols: Optional[int] = None, /, *, k: int = 0, dtype: DTypeLike = None,
        device: Optional[Client] = None) -> LazyArray:
    """gpucompute.eye on `device` (a pending array)."""
    return _creation.eye(n_rows, n_cols, k, dtype or float64, client=_client(device))


def tril(x: Array, /, *, k: int = 0) -> LazyArray:
    """x with the elements above the k-th diagonal zeroed: one expression (and two small
    index vectors) on the server."""
    return _composed.tril(x, k)


def triu(x: Array, /, *, k: int = 0) -> LazyArray:
    """x with the elements below the k-th diagonal zeroed: one expression (and two small
    index vectors) on the server."""
    return _composed.triu(x, k)


def meshgrid(*arrays: Array, indexing: str = "xy") -> List[Any]:
    """Coordinate grids of 1-d arrays: a copy of each, on the server."""
    return _composed.meshgrid(*arrays, indexing=indexing)


def asarray(obj: Any, /, *, dtype: DTypeLike = None, device: Optional[Client] = None,
            copy: Optional[bool] = None) -> Array:
    """A remote array as is (or cast, or copied: pending expressions); host data is
    uploaded to `device` (a blocking call)."""
    if isinstance(obj, (_lazy.RemoteArrayInfo, View)):
        if dtype is not None and np.dtype(dtype) != obj.dtype:
            return obj.astype(dtype)
        return obj.copy() if copy else obj
    return _client(device).put(np.asarray(obj, dtype=dtype))


# Statistics, searching, utilities ---------------------------------------------


def _reduction(kind: str, statistic: builtins.bool = False) -> Any:
    if statistic:
        def function(x: Array, /, *, axis: Axis = None, correction: float = 0.0,
                     keepdims: builtins.bool = False) -> LazyArray:
            return _functions.reduce(kind, x, axis, keepdims, correction)
    else:
        def function(x: Array, /, *, axis: Axis = None,  # type: ignore[misc]
                     keepdims: builtins.bool = False) -> LazyArray:
            return _functions.reduce(kind, x, axis, keepdims)
    function.__name__ = kind
    function.__doc__ = (f"{kind} over `axis` on the server: sent at once, without waiting; "
                        "of a pending expression, one fused pass.")
    return function


max = _reduction("max")  # pylint: disable=redefined-builtin
min = _reduction("min")  # pylint: disable=redefined-builtin
sum = _reduction("sum")  # pylint: disable=redefined-builtin
prod = _reduction("prod")
mean = _reduction("mean")
any = _reduction("any")  # pylint: disable=redefined-builtin
all = _reduction("all")  # pylint: disable=redefined-builtin
std = _reduction("std", statistic=True)
var = _reduction("var", statistic=True)


def argmax(x: Array, /, *, axis: Optional[int] = None,
           keepdims: builtins.bool = False) -> LazyArray:
    """The index of the largest value, over `axis`, on the server (sent at once)."""
    return _functions.reduce("argmax", x, axis, keepdims)


def argmin(x: Array, /, *, axis: Optional[int] = None,
           keepdims: builtins.bool = False) -> LazyArray:
    """The index of the smallest value, over `axis`, on the server (sent at once)."""
    return _functions.reduce("argmin", x, axis, keepdims)


def where(condition: Array, x1: _Operand, x2: _Operand, /) -> LazyArray:
    """x1 where condition, else x2, elementwise on the server (a pending expression)."""
    return _functions.where(condition, x1, x2)


# Manipulation and linear algebra ----------------------------------------------


def reshape(x: Array, /, shape: Tuple[int, ...], *, copy: Optional[bool] = None) -> Any:
    """x.reshape(shape): a View, no call, where the strides allow it, else a pending copy
    (with copy=True, always a copy; with copy=False, ValueError where one is needed)."""
    if copy:
        return x.copy().reshape(shape)
    if copy is False:
        return x.reshape_view(shape)
    return x.reshape(shape)


def permute_dims(x: Array, /, axes: Tuple[int, ...]) -> View:
    """x.transpose(axes): a View, no call."""
    return x.transpose(axes)


def expand_dims(x: Array, /, *, axis: int = 0) -> View:
    """x.expand_dims(axis): a View, no call."""
    return x.expand_dims(axis)


def squeeze(x: Array, /, axis: Union[int, Tuple[int, ...]]) -> View:
    """x.squeeze(axis): a View, no call."""
    return x.squeeze(axis)


def broadcast_to(x: Array, /, shape: Tuple[int, ...]) -> View:
    """x.broadcast_to(shape): a read-only View, no call."""
    return x.broadcast_to(shape)


def matrix_transpose(x: Array, /) -> View:
    """x with its last two axes swapped: a View, no call."""
    if len(x.shape) < 2:
        raise ValueError("matrix_transpose: x must have at least 2 dimensions")
    axes = list(range(len(x.shape)))
    axes[-2], axes[-1] = axes[-1], axes[-2]
    return x.transpose(axes)


def concat(arrays: Union[Tuple[Array, ...], List[Array]], /, *,
           axis: Optional[int] = 0) -> LazyArray:
    """A new buffer (one CreateBuffer call), each array written into it."""
    return _composed.concatenate(arrays, axis=axis)


def stack(arrays: Union[Tuple[Array, ...], List[Array]], /, *, axis: int = 0) -> LazyArray:
    """A new buffer (one CreateBuffer call), each array written into it."""
    return _composed.stack(arrays, axis=axis)


def flip(x: Array, /, *, axis: Optional[Union[int, Tuple[int, ...]]] = None) -> View:
    """x reversed along `axis` (every axis by default): a View, no call."""
    return _composed.flip(x, axis)


def roll(x: Array, /, shift: Union[int, Tuple[int, ...]], *,
         axis: Optional[Union[int, Tuple[int, ...]]] = None) -> Any:
    """x rolled: a new buffer per rolled axis, each written in two parts."""
    return _composed.roll(x, shift, axis)


def moveaxis(x: Array, source: Union[int, Tuple[int, ...]],
             destination: Union[int, Tuple[int, ...]], /) -> View:
    """x with axes moved: a View, no call."""
    return _composed.moveaxis(x, source, destination)


def repeat(x: Array, repeats: int, /, *, axis: Optional[int] = None) -> Any:
    """x repeated along `axis` (of the flattened x by default); `repeats` one integer:
    one copy on the server."""
    return _composed.repeat(x, repeats, axis)


def tile(x: Array, repetitions: Tuple[int, ...], /) -> Any:
    """x tiled: one copy on the server."""
    return _composed.tile(x, repetitions)


def count_nonzero(x: Array, /, *, axis: Axis = None, keepdims: builtins.bool = False
                  ) -> LazyArray:
    """The number of nonzero elements: one fused map-reduce, sent at once."""
    return _composed.count_nonzero(x, axis=axis, keepdims=keepdims)


def matmul(x1: Array, x2: Array, /) -> LazyArray:
    """x1 @ x2 on the server (sent at once, without waiting)."""
    return _functions.matmul(x1, x2)


def vecdot(x1: Array, x2: Array, /, *, axis: int = -1) -> LazyArray:
    """sum(x1 * x2) over `axis`: one fused map-reduce on the server, sent at once (real
    dtypes: no conjugation)."""
    return _functions.reduce("sum", _lazy.apply("multiply", [x1, x2]), axis)


def astype(x: Array, dtype: DTypeLike, /, *, copy: builtins.bool = True,
           device: Optional[Client] = None) -> Any:
    """x.astype(dtype, copy=copy): a pending cast (or x itself)."""
    return x.astype(dtype, copy=copy)


def result_type(*arrays_and_dtypes: Any) -> np.dtype[Any]:
    """The dtype NumPy 2 (NEP 50) gives these arrays, dtypes and scalars; computed here."""
    types = []
    for value in arrays_and_dtypes:
        if _ufuncs.weak_kind(value) is not None:
            types.append(_ufuncs.weak_kind(value))
        elif isinstance(value, (type, np.dtype, str)):
            types.append(np.dtype(value))
        else:
            types.append(np.dtype(value.dtype))
    result = _ufuncs.promote(*types)
    return _ufuncs.WEAK_DTYPES[result] if _ufuncs.is_weak(result) else result


def isdtype(dtype: DTypeLike, kind: Union[str, DTypeLike, Tuple[Any, ...]]) -> builtins.bool:
    """Whether `dtype` is of `kind` (the standard's names, a dtype, or a tuple of them);
    computed here."""
    kinds = {"bool": "b", "signed integer": "i", "integral": "i", "real floating": "f",
             "numeric": "if"}
    if isinstance(kind, tuple):
        return builtins_any(isdtype(dtype, k) for k in kind)
    if isinstance(kind, str):
        return np.dtype(dtype).kind in kinds.get(kind, "")
    return np.dtype(dtype) == np.dtype(kind)


def builtins_any(values: Iterable[object]) -> builtins.bool:
    """Python's any() (the module's own `any` is the reduction)."""
    for value in values:
        if value:
            return True
    return False


# Annotated Any so that type checkers accept the elementwise functions, which
# globals().update above defines where they cannot see them.
def __getattr__(name: str) -> Any:
    if name.startswith("_"):
        raise AttributeError(name)
    raise NotSupported(f"gpucompute.array_api.{name} is not supported: the server has no "
                       "such operation (see the client README's array API section)")
