"""What the array layer does besides elementwise expressions: reductions (fused with a
pending expression), matmul, writes through `out` and assignment, where/clip/round,
scalars, and NumPy's functions as __array_function__ dispatches them to remote arrays.
Everything is sent through gpucompute._dispatch.
"""

import numbers

import numpy as np

from . import _dispatch, _lazy, _ufuncs
from ._arrays import RemoteArrayInfo, scalar_value
from ._requests import elementwise_request, matmul_request, reduce_request
from ._views import View, _AxisError, _normalize_axis

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _reduce_dtype(kind, dtype):
    if kind in ("argmin", "argmax"):
        return np.dtype(np.int64)
    if kind in ("any", "all"):
        return _ufuncs.BOOL
    if kind in ("sum", "prod"):
        return dtype if dtype.kind == "f" else np.dtype(np.int64)
    if kind in ("mean", "var", "std", "norm2"):
        return dtype if dtype == _FLOATS[0] else _FLOATS[1]
    return dtype


def _check_array(x, what):
    if not isinstance(x, (RemoteArrayInfo, View)) or x.shape is None:
        raise TypeError(f"{what}: not a remote array of known shape: {type(x).__name__}")


def _refuse(what, keywords):
    for keyword, value in keywords.items():
        if value is not None and value is not np._NoValue:
            raise TypeError(f"{what}: keyword '{keyword}' is not supported on remote arrays")


_DTYPE_KINDS = ("sum", "prod", "mean", "std", "var")


def reduce(kind, x, axis=None, keepdims=False, ddof=0, dtype=None, out=None, **unsupported):
    """A reduction of a remote array, one ReduceOp; of a pending expression, one fused
    map-reduce over it. Returns a LazyArray (0-d for every axis: float() reads the
    value the server returned with the operation, without a download).

    `dtype` (sum, prod, mean, std, var), as NumPy's: the elements are cast to it as they
    are read (in the same pass) and the result is of that dtype. `out`: the result is
    written into it (one more operation), and it is returned."""
    _check_array(x, kind)
    _refuse(kind, unsupported)
    if dtype is not None:
        if kind not in _DTYPE_KINDS:
            raise TypeError(f"{kind}: keyword 'dtype' is not supported")
        dtype = np.dtype(dtype)
        if kind in ("std", "var") and dtype.kind != "f":
            # NumPy truncates each square to an integer dtype: not worth mimicking.
            raise TypeError(f"{kind}: dtype must be float32 or float64 on remote arrays")
        result = reduce(kind, x.astype(dtype), axis, keepdims, ddof)
        result = result if result.dtype == dtype else result.astype(dtype)
        return result if out is None else write(out, "", [result], what=kind)
    if out is not None:
        return write(out, "", [reduce(kind, x, axis, keepdims, ddof)], what=kind)
    client = _lazy.client_of(x)
    shape = tuple(x.shape)
    if kind in ("argmin", "argmax") and axis is not None \
            and not isinstance(axis, (numbers.Integral, np.integer)):
        raise TypeError(f"{kind}: axis must be an integer or None")
    if axis is None:
        axes = tuple(range(len(shape)))
    else:
        listed = axis if isinstance(axis, tuple) else (axis,)
        axes = tuple(_normalize_axis(int(a), len(shape)) for a in listed)
        if len(set(axes)) != len(axes):
            raise ValueError(f"{kind}: duplicate value in 'axis'")
    result = tuple(1 if i in axes else n for i, n in enumerate(shape) if keepdims or i not in axes)
    dtype = _reduce_dtype(kind, np.dtype(x.dtype))
    if isinstance(x, _lazy.LazyArray) and x._node is not None:
        expression, inputs = _lazy.emit(x._node)
        request = reduce_request(kind, expression, axis, keepdims=keepdims, ddof=ddof,
                                 inputs=inputs)
    else:
        request = reduce_request(kind, _lazy.operand(x), axis, keepdims=keepdims, ddof=ddof)
    return _lazy.array_from(client, _dispatch.submit(client, request), result, dtype)


def _matmul_shape(a, b):
    sa, sb = tuple(a), tuple(b)
    if not sa or not sb:
        raise ValueError("matmul: Input operand does not have enough dimensions")
    a2 = sa if len(sa) > 1 else (1,) + sa
    b2 = sb if len(sb) > 1 else sb + (1,)
    if a2[-1] != b2[-2]:
        raise ValueError(f"matmul: Input operand 1 has a mismatch in its core dimension 0, "
                         f"with gufunc signature (n?,k),(k,m?)->(n?,m?) (size {b2[-2]} is "
                         f"different from {a2[-1]})")
    batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    return batch + (sa[-2:-1] if len(sa) > 1 else ()) + (sb[-1:] if len(sb) > 1 else ())


def matmul(a, b, **unsupported):
    """a @ b, one MatmulOp (float32 or float64; mixed dtypes are cast first)."""
    _refuse("matmul", unsupported)
    for x in (a, b):
        if not isinstance(x, (RemoteArrayInfo, View)):
            raise TypeError(f"matmul: operands must be remote arrays, not {type(x).__name__}")
        _check_array(x, "matmul")
    client = _lazy.client_of(a, b)
    shape = _matmul_shape(a.shape, b.shape)
    dtype = np.promote_types(a.dtype, b.dtype)
    if dtype not in _FLOATS:
        raise TypeError(f"matmul of {a.dtype} and {b.dtype}: the server multiplies float32 "
                        "or float64 matrices; use astype first")
    a, b = (x if x.dtype == dtype else x.astype(dtype) for x in (a, b))
    pending = _dispatch.submit(client, matmul_request(_lazy.operand(a), _lazy.operand(b)))
    return _lazy.array_from(client, pending, shape, dtype)


def dot(a, b, out=None):
    _refuse("dot", {"out": out})
    if len(a.shape) > 2 or len(b.shape) > 2:
        raise TypeError("dot: only 1-D and 2-D operands (np.matmul batches 3-D ones)")
    if not a.shape or not b.shape:
        return _lazy.apply("multiply", [a, b])
    return matmul(a, b)


def write(out, fn, values, what=None):
    """out[...] = fn(values), through `out` (a remote array or a View): one operation.
    Pending expressions that read out's buffer are sent first. Returns out."""
    what = what or fn
    if not isinstance(out, (RemoteArrayInfo, View)) or out.shape is None:
        raise TypeError(f"{what}: out must be a remote array or a view of one, not "
                        f"{type(out).__name__}")
    client = _lazy.client_of(out, *values)
    if not fn:
        weak = _ufuncs.weak_kind(values[0]) is not None
        result = _lazy.apply("", values, type_=out.dtype if weak else None, what=what,
                             client=client)
    else:
        result = _lazy.apply(fn, values, what=what)
    if not np.can_cast(result.dtype, out.dtype, "same_kind"):
        raise TypeError(f"{what}: Cannot cast ufunc '{what}' output from {result.dtype} to "
                        f"{out.dtype} with casting rule 'same_kind'")
    try:
        fits = np.broadcast_shapes(result.shape, tuple(out.shape)) == tuple(out.shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{what}: non-broadcastable output operand with shape "
                         f"{tuple(out.shape)} doesn't match the broadcast shape "
                         f"{result.shape}")
    if result.shape != tuple(out.shape):
        # The server writes a result of out's own shape: where(True, ...) with out as an
        # operand broadcasts the values to it (out's own values are never used).
        result = _lazy.apply("where", [True, result, out], what=what,
                             type_=_ufuncs.promote(result.dtype, np.dtype(out.dtype)))
    expression, inputs = _lazy.emit(result._node)
    target = _lazy.operand(out)
    _lazy.before_write(client, target.base)
    pending = _dispatch.submit(client, elementwise_request(expression, inputs, out=target))
    out._last_write = pending
    return out


def assign(array, key, value):
    """array[key] = value, written through the view array[key]."""
    target = array[key]
    if isinstance(value, View) and value.base is target.base and value.steps == target.steps:
        return  # an in-place operator on array[key] has written it already
    write(target, "", [value], what="assignment")


def where(condition, x=None, y=None):
    if x is None or y is None:
        raise TypeError("where: the one-argument form (nonzero) is not supported on remote "
                        "arrays")
    terms = [_lazy.as_term(value, "where") for value in (x, y)]
    return _lazy.apply("where", [condition, x, y], type_=_ufuncs.promote(
        *(term.type for term in terms)), what="where")


def clip(a, a_min=None, a_max=None, out=None, **unsupported):
    _refuse("clip", unsupported)
    if a_min is None or a_max is None:
        low_or_high = "maximum" if a_max is None else "minimum"
        bound = a_min if a_max is None else a_max
        if bound is None:
            raise ValueError("clip: One of max or min must be given")
        fn, values = low_or_high, [a, bound]
    else:
        fn, values = "clip", [a, a_min, a_max]
    if out is not None:
        return write(out, fn, values, what="clip")
    return _lazy.apply(fn, values, what="clip")


def round_(a, decimals=0, out=None):
    if not isinstance(decimals, (numbers.Integral, np.integer)):
        raise TypeError("round: decimals must be an integer")
    values = [a] if decimals == 0 else [a, int(decimals)]
    if out is not None:
        return write(out, "round", values)
    return _lazy.apply("round", values)


def scalar(x, convert):
    """convert(the value of a one-element remote array): a reduction's value comes with
    its operation; anything else is downloaded."""
    _dispatch.refuse_in_trace(f"{convert.__name__}() of an array" + (
        " (Python control flow on an array's values: if, while, and, or)"
        if convert is bool else ""))
    if x.size != 1:
        raise TypeError("only arrays of one element can be converted to Python scalars")
    pending = _lazy.pending_of(x)
    if pending is not None and x._node is None:
        operation = pending.result()
        values = operation.values if operation is not None else ()
        if len(values) == 1:
            return convert(np.array(scalar_value(values[0]), dtype=x.dtype)[()])
    return convert(np.asarray(x).reshape(())[()])
