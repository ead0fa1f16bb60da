"""The Python array API standard (2023.12) over remote arrays, for what the server has:
x.__array_namespace__() returns this module. Everything runs on the server; creation
functions take `device=` as a Client (default: the client gpucompute.connect() opened
last). Any other name of the standard raises NotImplementedError naming it (which is
also an AttributeError, so hasattr() is False). The deviations are listed in the
client's README ("The array API namespace").
"""

import numpy as np

from . import _creation, _functions, _lazy, _ufuncs
from ._views import View

__array_api_version__ = "2023.12"

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


def _unary(ufunc):
    def function(x, /):
        return _lazy.apply(ufunc, [x])
    function.__name__ = ufunc
    return function


def _binary(ufunc):
    def function(x1, x2, /):
        return _lazy.apply(ufunc, [x1, x2])
    function.__name__ = ufunc
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


def round(x, /):  # pylint: disable=redefined-builtin
    return _functions.round_(x)


def clip(x, /, min=None, max=None):  # pylint: disable=redefined-builtin
    if min is None and max is None:
        return x.copy()
    return _functions.clip(x, min, max)


# Creation -------------------------------------------------------------------


def _client(device):
    return device if device is not None else _creation._client(None)


def zeros(shape, *, dtype=None, device=None):
    return _creation.zeros(shape, dtype or float64, client=_client(device))


def ones(shape, *, dtype=None, device=None):
    return _creation.ones(shape, dtype or float64, client=_client(device))


def empty(shape, *, dtype=None, device=None):
    return _creation.empty(shape, dtype or float64, client=_client(device))


def full(shape, fill_value, *, dtype=None, device=None):
    return _creation.full(shape, fill_value, dtype, client=_client(device))


def zeros_like(x, /, *, dtype=None, device=None):
    return _creation.zeros_like(x, dtype)


def ones_like(x, /, *, dtype=None, device=None):
    return _creation.ones_like(x, dtype)


def empty_like(x, /, *, dtype=None, device=None):
    return _creation.empty_like(x, dtype)


def full_like(x, /, fill_value, *, dtype=None, device=None):
    return _creation.full_like(x, fill_value, dtype)


def arange(start, /, stop=None, step=1, *, dtype=None, device=None):
    return _creation.arange(start, stop, step, dtype, client=_client(device))


def linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True):
    return _creation.linspace(start, stop, num, endpoint, dtype, client=_client(device))


def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None):
    return _creation.eye(n_rows, n_cols, k, dtype or float64, client=_client(device))


def asarray(obj, /, *, dtype=None, device=None, copy=None):
    """A remote array as is (or cast); host data is uploaded to `device`."""
    if isinstance(obj, (_lazy.RemoteArrayInfo, View)):
        if dtype is not None and np.dtype(dtype) != obj.dtype:
            return obj.astype(dtype)
        return obj.copy() if copy else obj
    return _client(device).put(np.asarray(obj, dtype=dtype))


# Statistics, searching, utilities ---------------------------------------------


def _reduction(kind, statistic=False):
    if statistic:
        def function(x, /, *, axis=None, correction=0.0, keepdims=False):
            return _functions.reduce(kind, x, axis, keepdims, correction)
    else:
        def function(x, /, *, axis=None, keepdims=False):
            return _functions.reduce(kind, x, axis, keepdims)
    function.__name__ = kind
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


def argmax(x, /, *, axis=None, keepdims=False):
    return _functions.reduce("argmax", x, axis, keepdims)


def argmin(x, /, *, axis=None, keepdims=False):
    return _functions.reduce("argmin", x, axis, keepdims)


def where(condition, x1, x2, /):
    return _functions.where(condition, x1, x2)


# Manipulation and linear algebra ----------------------------------------------


def reshape(x, /, shape, *, copy=None):
    if copy:
        return x.copy().reshape(shape)
    return x.reshape(shape)


def permute_dims(x, /, axes):
    return x.transpose(axes)


def expand_dims(x, /, *, axis=0):
    return x.expand_dims(axis)


def squeeze(x, /, axis):
    return x.squeeze(axis)


def broadcast_to(x, /, shape):
    return x.broadcast_to(shape)


def matrix_transpose(x, /):
    if len(x.shape) < 2:
        raise ValueError("matrix_transpose: x must have at least 2 dimensions")
    axes = list(range(len(x.shape)))
    axes[-2], axes[-1] = axes[-1], axes[-2]
    return x.transpose(axes)


def matmul(x1, x2, /):
    return _functions.matmul(x1, x2)


def vecdot(x1, x2, /, *, axis=-1):
    """sum(x1 * x2) over `axis`: one fused map-reduce (real dtypes: no conjugation)."""
    return _functions.reduce("sum", _lazy.apply("multiply", [x1, x2]), axis)


def astype(x, dtype, /, *, copy=True, device=None):
    return x.astype(dtype, copy=copy)


def result_type(*arrays_and_dtypes):
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


def isdtype(dtype, kind):
    kinds = {"bool": "b", "signed integer": "i", "integral": "i", "real floating": "f",
             "numeric": "if"}
    if isinstance(kind, tuple):
        return builtins_any(isdtype(dtype, k) for k in kind)
    if isinstance(kind, str):
        return np.dtype(dtype).kind in kinds.get(kind, "")
    return np.dtype(dtype) == np.dtype(kind)


def builtins_any(values):
    for value in values:
        if value:
            return True
    return False


def __getattr__(name):
    if name.startswith("_"):
        raise AttributeError(name)
    raise NotSupported(f"gpucompute.array_api.{name} is not supported: the server has no "
                       "such operation (see the client README's array API section)")
