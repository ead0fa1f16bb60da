"""NumPy's functions that __array_function__ runs on the server for remote arrays:
np.where; np.sum, mean, prod, min, max, std, var, argmin, argmax, any, all (axis,
keepdims, ddof); np.dot, np.matmul, np.clip, np.round; np.transpose, reshape, squeeze,
expand_dims, broadcast_to; and those gpucompute._composed builds from these (flip,
concatenate, isclose, linalg.norm, the nan reductions, ...). Any other NumPy function
given a remote array raises TypeError naming it.
"""

import numpy as np

from . import _composed, _functions


def _reduction(kind, statistic=False):
    def function(a, axis=None, *args, keepdims=False, ddof=0, **unsupported):
        if args:
            raise TypeError(f"{kind}: pass dtype, out and the others as keywords")
        if not statistic and ddof:
            raise TypeError(f"{kind}: keyword 'ddof' is not supported")
        return _functions.reduce(kind, a, axis, keepdims, ddof, **unsupported)
    return function


def _reshape(a, newshape, order="C"):
    if order != "C":
        raise TypeError(f"reshape: order={order!r} is not supported on remote arrays (views "
                        "reshape in C order)")
    return a.reshape(newshape)


def _transpose(a, axes=None):
    return a.transpose() if axes is None else a.transpose(axes)


def _squeeze(a, axis=None):
    return a.squeeze(axis)


def _expand_dims(a, axis):
    return a.expand_dims(axis)


def _broadcast_to(array, shape, subok=False):
    if subok:
        raise TypeError("broadcast_to: keyword 'subok' is not supported on remote arrays")
    return array.broadcast_to(shape)


def _matmul(a, b, **unsupported):
    return _functions.matmul(a, b, **unsupported)


FUNCTIONS = {
    np.where: _functions.where,
    np.dot: _functions.dot,
    np.clip: _functions.clip,
    np.around: _functions.round_,
    np.transpose: _transpose,
    np.reshape: _reshape,
    np.squeeze: _squeeze,
    np.expand_dims: _expand_dims,
    np.broadcast_to: _broadcast_to,
    np.matmul: _matmul,
}
# np.round_ went in NumPy 2.0, np.round came in 1.17 as another name of around.
for _name in ("round", "round_"):
    if hasattr(np, _name):
        FUNCTIONS[getattr(np, _name)] = _functions.round_
for _kind in ("sum", "mean", "prod", "min", "max", "argmin", "argmax", "any", "all"):
    FUNCTIONS[getattr(np, _kind)] = _reduction(_kind)
for _kind in ("std", "var"):
    FUNCTIONS[getattr(np, _kind)] = _reduction(_kind, statistic=True)
FUNCTIONS[np.amin] = FUNCTIONS[np.min]
FUNCTIONS[np.amax] = FUNCTIONS[np.max]
FUNCTIONS.update(_composed.FUNCTIONS)
