"""NumPy's behaviour for RemoteArray and View: Python's operators (lazy: see
gpucompute._lazy), __array_ufunc__ and __array_function__ (what the server has; anything
else is a TypeError naming it, never a silent download), the reductions and other
methods, scalar conversion and assignment. The blocking client only.
"""

from __future__ import annotations

import html
import numbers
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Iterator, NoReturn, Optional, Tuple

import numpy as np

if TYPE_CHECKING:
    from ._lazy import LazyArray
    from ._types import Axis, DTypeLike

# The operators' methods: (self, other) -> the result. A binary operator gives a
# pending expression (a LazyArray), or NotImplemented; an in-place one the array written.
_Operator = Callable[[Any, Any], "LazyArray"]
_InPlace = Callable[[Any, Any], Any]


def _impl():
    # Imported here: _views (which View comes from) is imported by the modules below.
    from . import _functions, _lazy  # pylint: disable=import-outside-toplevel
    return _lazy, _functions


def _foreign(value):
    """Whether `value` is nothing an operator could combine with an array (x == None is
    then False, as Python's default)."""
    return not isinstance(value, (numbers.Number, np.generic, np.ndarray, list, tuple)) \
        and not hasattr(value, "__array_ufunc__")


def _binary(fn: str) -> Tuple[_Operator, _Operator, _InPlace]:
    def forward(self: Any, other: Any) -> LazyArray:
        if _foreign(other):
            return NotImplemented
        lazy, _ = _impl()
        return lazy.apply(fn, [self, other])

    def reverse(self: Any, other: Any) -> LazyArray:
        if _foreign(other):
            return NotImplemented
        lazy, _ = _impl()
        return lazy.apply(fn, [other, self])

    def in_place(self: Any, other: Any) -> Any:
        _, functions = _impl()
        return functions.write(self, fn, [self, other])

    return forward, reverse, in_place


def _unary(fn: str) -> Callable[[Any], LazyArray]:
    def method(self: Any) -> LazyArray:
        lazy, _ = _impl()
        return lazy.apply(fn, [self])
    return method


def _reduction(kind: str) -> Callable[..., LazyArray]:
    def method(self: Any, axis: Axis = None, *, keepdims: bool = False,
               **unsupported: Any) -> LazyArray:
        _, functions = _impl()
        return functions.reduce(kind, self, axis, keepdims, **unsupported)
    method.__name__ = kind
    method.__doc__ = (f"{kind} over `axis` (None: every axis; an int or a tuple), on the "
                      "server; of a pending expression, fused into one pass. Sent at once, "
                      "without waiting; the value comes back with the operation.")
    return method


def _statistic(kind: str) -> Callable[..., LazyArray]:
    def method(self: Any, axis: Axis = None, *, ddof: int = 0, keepdims: bool = False,
               **unsupported: Any) -> LazyArray:
        _, functions = _impl()
        return functions.reduce(kind, self, axis, keepdims, ddof, **unsupported)
    method.__name__ = kind
    method.__doc__ = (f"{kind} over `axis`, dividing by N - ddof, on the server. Sent at "
                      "once, without waiting; the value comes back with the operation.")
    return method


class ArrayOperators:
    """The NumPy-like part of RemoteArray and View.

    Elementwise operators and ufuncs run on the server but are sent later: they return
    a pending expression (gpucompute._lazy) at once. Reductions and matmul are sent at
    once and do not wait; float(), int(), bool() and np.asarray() block and download.
    """

    __array_priority__ = 100
    # Arrays compare elementwise, but stay hashable by identity, as handles always were.
    __hash__ = object.__hash__

    (__add__, __radd__, __iadd__) = _binary("add")
    (__sub__, __rsub__, __isub__) = _binary("subtract")
    (__mul__, __rmul__, __imul__) = _binary("multiply")
    (__truediv__, __rtruediv__, __itruediv__) = _binary("true_divide")
    (__floordiv__, __rfloordiv__, __ifloordiv__) = _binary("floor_divide")
    (__mod__, __rmod__, __imod__) = _binary("remainder")
    (__pow__, __rpow__, __ipow__) = _binary("power")
    (__and__, __rand__, __iand__) = _binary("bitwise_and")
    (__or__, __ror__, __ior__) = _binary("bitwise_or")
    (__xor__, __rxor__, __ixor__) = _binary("bitwise_xor")
    (__lshift__, __rlshift__, __ilshift__) = _binary("left_shift")
    (__rshift__, __rrshift__, __irshift__) = _binary("right_shift")
    __lt__ = _binary("less")[0]
    __le__ = _binary("less_equal")[0]
    __gt__ = _binary("greater")[0]
    __ge__ = _binary("greater_equal")[0]
    __eq__ = _binary("equal")[0]
    __ne__ = _binary("not_equal")[0]
    __neg__ = _unary("negative")
    __pos__ = _unary("positive")
    __invert__ = _unary("invert")
    __abs__ = _unary("absolute")

    def __matmul__(self, other: Any) -> LazyArray:
        return _impl()[1].matmul(self, other)

    def __rmatmul__(self, other: Any) -> LazyArray:
        return _impl()[1].matmul(other, self)

    def __imatmul__(self, other: Any) -> NoReturn:
        raise TypeError("in-place matrix multiplication (@=) is not supported on remote "
                        "arrays: write c = a @ b")

    sum = _reduction("sum")
    prod = _reduction("prod")
    min = _reduction("min")
    max = _reduction("max")
    mean = _reduction("mean")
    any = _reduction("any")
    all = _reduction("all")
    argmin = _reduction("argmin")
    argmax = _reduction("argmax")
    std = _statistic("std")
    var = _statistic("var")

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any,
                        **kwargs: Any) -> Any:
        from . import _ufuncs  # pylint: disable=import-outside-toplevel
        lazy, functions = _impl()
        name = ufunc.__name__
        if method != "__call__":
            raise TypeError(f"ufunc method '{name}.{method}' is not supported on remote "
                            "arrays; the reductions are (np.sum(x), x.max(axis=0), ...)")
        if name == "matmul" and not kwargs:
            return functions.matmul(*inputs)
        if name not in _ufuncs.UFUNCS or name in ("clip", "round"):
            raise TypeError(f"ufunc '{name}' is not supported on remote arrays: the server's "
                            "expression language has no such function")
        out = kwargs.pop("out", None)
        for keyword in kwargs:
            raise TypeError(f"ufunc '{name}': keyword '{keyword}' is not supported on remote "
                            "arrays")
        if out is not None and any(value is not None for value in out):
            if len(out) != 1:
                raise TypeError(f"ufunc '{name}': one output only")
            return functions.write(out[0], name, list(inputs))
        return lazy.apply(name, list(inputs))

    def __array_function__(self, func: Callable[..., Any], types: Any, args: Any,
                           kwargs: Any) -> Any:
        from . import _numpy_functions  # pylint: disable=import-outside-toplevel
        implementation = _numpy_functions.FUNCTIONS.get(func)
        if implementation is None:
            module = getattr(func, "__module__", None) or "numpy"
            raise TypeError(f"{module}.{func.__name__} is not supported on remote arrays; "
                            "download first (np.asarray(x) or x.get()) to use NumPy on the "
                            "host")
        return implementation(*args, **kwargs)

    def __setitem__(self, key: Any, value: Any) -> None:
        _impl()[1].assign(self, key, value)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self) -> Iterator[Any]:
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __float__(self) -> float:
        return _impl()[1].scalar(self, float)

    def __int__(self) -> int:
        return _impl()[1].scalar(self, int)

    def __bool__(self) -> bool:
        return _impl()[1].scalar(self, bool)

    def __index__(self) -> int:
        if np.dtype(self.dtype).kind not in "iu":
            raise TypeError("only integer arrays can be used as an index")
        return _impl()[1].scalar(self, int)

    def astype(self, dtype: DTypeLike, copy: bool = True) -> Any:
        """The array as `dtype`: a cast on the server, pending (fused with what follows),
        or the array itself for its own dtype without `copy`."""
        from ._arrays import dtype_enum  # pylint: disable=import-outside-toplevel
        dtype_enum(dtype)
        dtype = np.dtype(dtype)
        if dtype == self.dtype and not copy:
            return self
        return _impl()[0].apply(dtype.name, [self], type_=dtype, what="astype")

    def copy(self) -> LazyArray:
        """A new buffer with the array's values, copied on the server (pending: sent
        when needed)."""
        return _impl()[0].apply("", [self], what="copy")

    def compute(self, name: Optional[str] = None) -> Any:
        """The array's value in a buffer of its own: pending work is sent now, without
        waiting for it. A handle is that already, and is returned as it is."""
        if name is not None:
            raise ValueError("name a copy: x.copy().compute(name=...)")
        return self

    def _repr_html_(self) -> str:
        """For notebooks: what repr() says (no download, no server call)."""
        return f"<code>{html.escape(repr(self))}</code>"

    def __array_namespace__(self, *, api_version: Optional[str] = None) -> ModuleType:
        """gpucompute.array_api (no server call)."""
        if api_version not in (None, "2023.12"):
            raise ValueError(f"array API version {api_version!r} is not supported; 2023.12 is")
        from . import array_api  # pylint: disable=import-outside-toplevel
        return array_api
