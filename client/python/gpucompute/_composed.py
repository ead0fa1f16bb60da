"""NumPy functions that the server has no operation of their own for, built from the ones
it has: views, elementwise expressions (fused lazily), reductions and writes through
`out`. Nothing is downloaded; each function says what it sends.

  views, no call:      flip, fliplr, flipud, swapaxes, moveaxis, ravel, ndim, shape, size,
                       atleast_1d/2d/3d, broadcast_arrays, meshgrid(copy=False)
  one expression:      diff, outer, isclose, triu, tril (with two small index vectors),
                       nan_to_num, fix, copy, meshgrid (one copy a grid)
  reductions:          count_nonzero, linalg.norm, nansum, nanprod, nanmean, nanmin,
                       nanmax, nanvar, nanstd, ptp, average (each a fused map-reduce or
                       two, and an expression over their results)
  diagonals:           diagonal, trace (a flat view of a C-ordered matrix: a copy first
                       where it is not one), diag (also a new matrix from a vector)
  matmul:              tensordot, inner (transposed, reshaped, one matmul), vdot, cov,
                       corrcoef (centred rows times their transpose), einsum (a
                       contraction of two operands; anything else is one fused
                       map-reduce of the operands broadcast together)
  a new buffer:        concatenate, stack, vstack, hstack, roll (one CreateBuffer, then
                       one write per part), take and x[host integers] (one write per
                       run of evenly spaced indices), repeat, tile (one copy of a
                       broadcast view)
  numerical staples:   polyval (Horner), trapezoid, convolve and correlate (1-d, a sum
                       of shifted products; full and same pad a copy), kron, cross,
                       gradient (a new buffer written in three parts an axis)
  a Python bool:       allclose, array_equal (one reduction, its value read inline)
  creation:            zeros_like, ones_like, empty_like, full_like

Results follow NumPy's values, shapes and dtypes (NEP 50), with the summation order of
the server's reductions. Where NumPy returns a Python or NumPy scalar (count_nonzero
over every axis, norm), these return a 0-d remote array, as np.sum does here.
"""

import numbers

import numpy as np

from . import _creation, _functions, _lazy, _ufuncs
from ._arrays import RemoteArrayInfo
from ._views import View, _axes, _normalize_axis


def _check(x, what):
    _functions._check_array(x, what)  # pylint: disable=protected-access
    return x


def _refuse(what, **keywords):
    _functions._refuse(what, keywords)  # pylint: disable=protected-access


def _refuse_order(what, order, allowed=("K", "C", "A")):
    if order not in allowed:
        raise TypeError(f"{what}: order={order!r} is not supported on remote arrays")


def _axis_tuple(axis, ndim, what):
    if axis is None:
        return tuple(range(ndim))
    listed = axis if isinstance(axis, tuple) else (axis,)
    axes = tuple(_normalize_axis(int(a), ndim) for a in listed)
    if len(set(axes)) != len(axes):
        raise ValueError(f"{what}: repeated axis")
    return axes


def _along(ndim, axis, item):
    """An index tuple with `item` at `axis` and whole slices elsewhere."""
    key = [slice(None)] * ndim
    key[axis] = item
    return tuple(key)


def _assembled(shape, dtype, client, axis, pieces, what):
    """A new buffer of `shape` (one CreateBuffer call), written one piece at a time: each
    piece is (a slice along `axis`, the values it takes)."""
    result = _creation.empty(tuple(shape), dtype, client=client)
    for target, values in pieces:
        _functions.write(result[_along(len(shape), axis, target)], "", [values], what=what)
    return result


def _is_float(x):
    return np.dtype(x.dtype).kind == "f"


# ---- Views: no server call. ----

def flip(m, axis=None):
    _check(m, "flip")
    return m[tuple(slice(None, None, -1) if i in _axis_tuple(axis, m.ndim, "flip")
                   else slice(None) for i in range(m.ndim))]


def fliplr(m):
    if _check(m, "fliplr").ndim < 2:
        raise ValueError("Input must be >= 2-d.")
    return m[:, ::-1]


def flipud(m):
    if _check(m, "flipud").ndim < 1:
        raise ValueError("Input must be >= 1-d.")
    return m[::-1]


def swapaxes(a, axis1, axis2):
    return _check(a, "swapaxes").swapaxes(axis1, axis2)


def moveaxis(a, source, destination):
    ndim = _check(a, "moveaxis").ndim
    source = _axes(source if isinstance(source, (tuple, list)) else (source,), ndim)
    destination = _axes(
        destination if isinstance(destination, (tuple, list)) else (destination,), ndim)
    if len(source) != len(destination):
        raise ValueError("`source` and `destination` arguments must have the same number of "
                         "elements")
    order = [n for n in range(ndim) if n not in source]
    for dest, src in sorted(zip(destination, source)):
        order.insert(dest, src)
    return a.transpose(order)


def ravel(a, order="C"):
    _refuse_order("ravel", order, ("C",))
    return _check(a, "ravel").ravel()


def array_ndim(a):
    return len(_check(a, "ndim").shape)


def array_shape(a):
    return tuple(_check(a, "shape").shape)


def array_size(a, axis=None):
    _check(a, "size")
    return a.size if axis is None else a.shape[_normalize_axis(int(axis), a.ndim)]


def _atleast(least, arrays, what):
    """NumPy's atleast_Nd: Views with axes of 1 added (a 1-d array becomes a row, and in
    3-d the middle of (1, n, 1); a 2-d one gains a last axis)."""
    shapes = {1: {0: (1,)}, 2: {0: (1, 1), 1: (1, -1)}, 3: {0: (1, 1, 1), 1: (1, -1, 1)}}
    results = []
    for a in arrays:
        _check(a, what)
        if least == 3 and a.ndim == 2:
            a = a.reshape(tuple(a.shape) + (1,))
        elif a.ndim < least:
            a = a.reshape(shapes[least][a.ndim])
        results.append(a)
    return results[0] if len(results) == 1 else results


def atleast_1d(*arys):
    return _atleast(1, arys, "atleast_1d")


def atleast_2d(*arys):
    return _atleast(2, arys, "atleast_2d")


def atleast_3d(*arys):
    return _atleast(3, arys, "atleast_3d")


def broadcast_arrays(*args, subok=False):
    """Read-only broadcast Views of each array, no call."""
    _refuse("broadcast_arrays", subok=subok or None)
    shape = np.broadcast_shapes(*(tuple(_check(a, "broadcast_arrays").shape) for a in args))
    return [a if tuple(a.shape) == shape else a.broadcast_to(shape) for a in args]


def meshgrid(*xi, copy=True, sparse=False, indexing="xy"):
    """Views of the 1-d arrays broadcast to the grid (copy=False), else copies of them."""
    if indexing not in ("xy", "ij"):
        raise ValueError("Valid values for `indexing` are 'xy' and 'ij'.")
    ndim = len(xi)
    grids = []
    for i, x in enumerate(xi):
        shape = [1] * ndim
        shape[i] = -1
        grids.append(_check(x, "meshgrid").reshape(shape))
    if indexing == "xy" and ndim > 1:
        grids = [g.swapaxes(0, 1) for g in grids]
    if not sparse:
        grids = broadcast_arrays(*grids)
    return [g.copy() for g in grids] if copy else grids


def copy_(a, order="K", subok=False):
    _refuse_order("copy", order)
    return _check(a, "copy").copy()


def nan_to_num(x, copy=True, nan=0.0, posinf=None, neginf=None):
    """One expression: NaN and the infinities replaced (by default with 0 and the
    dtype's largest finite values)."""
    if not copy:
        raise TypeError("nan_to_num: copy=False is not supported on remote arrays")
    _check(x, "nan_to_num")
    if not _is_float(x):
        return x.copy()
    largest = float(np.finfo(x.dtype).max)
    posinf = largest if posinf is None else posinf
    neginf = -largest if neginf is None else neginf
    typed = np.dtype(x.dtype).type  # so that the replacements keep x's dtype
    return np.where(np.isnan(x), typed(nan), np.where(
        np.isinf(x), np.where(np.signbit(x), typed(neginf), typed(posinf)), x))


def fix(x, out=None):
    if out is not None:
        return _functions.write(out, "trunc", [x], what="fix")
    return np.trunc(_check(x, "fix"))


# ---- Numerical staples, each one fused expression or map-reduce. ----

def _coefficients(p, what):
    """Host numbers as the NumPy scalars of np.asarray(p) (strong, as NumPy's polyval
    has them); a remote 1-d array as its 0-d element views."""
    if isinstance(p, (RemoteArrayInfo, View)):
        if _check(p, what).ndim != 1:
            raise ValueError(f"{what}: the coefficients must be 1-d")
        return [p[i] for i in range(p.shape[0])]
    values = np.asarray(p)
    if values.ndim != 1 or values.dtype.kind not in "biuf":
        raise TypeError(f"{what}: the coefficients must be a 1-d list of real numbers")
    return list(values)


def polyval(p, x):
    """Horner's rule in one expression: p[0] x^(n-1) + ... + p[n-1]."""
    coefficients = _coefficients(p, "polyval")
    _check(x, "polyval")
    if not coefficients:
        return np.multiply(x, 0)
    result = np.multiply(x, 0) + coefficients[0]
    for c in coefficients[1:]:
        result = np.add(np.multiply(result, x), c)
    return result


def trapezoid(y, x=None, dx=1.0, axis=-1):
    """The trapezoidal rule along `axis`: one fused map-reduce."""
    _check(y, "trapezoid")
    axis = _normalize_axis(int(axis), y.ndim)
    later = y[_along(y.ndim, axis, slice(1, None))]
    earlier = y[_along(y.ndim, axis, slice(None, -1))]
    if x is None:
        widths = dx
    else:
        _check(x, "trapezoid")
        if x.ndim == 1:
            widths = diff(x).reshape((-1,) + (1,) * (y.ndim - axis - 1))
        else:
            widths = diff(x, axis=axis)
    return np.sum(np.multiply(widths, np.add(later, earlier)) / 2.0, axis=axis)


def gradient(f, *varargs, axis=None, edge_order=1):
    """Central differences inside, one-sided at the edges (edge_order=1), each axis one
    new buffer written in three parts; scalar spacings."""
    _check(f, "gradient")
    if edge_order != 1:
        raise TypeError("gradient: edge_order=2 is not supported on remote arrays")
    axes = _axis_tuple(axis, f.ndim, "gradient")
    if not varargs:
        spacings = [1.0] * len(axes)
    elif len(varargs) == 1 and np.ndim(varargs[0]) == 0:
        spacings = [float(varargs[0])] * len(axes)
    elif len(varargs) == len(axes) and all(np.ndim(v) == 0 for v in varargs):
        spacings = [float(v) for v in varargs]
    else:
        raise TypeError("gradient: remote arrays take scalar spacings only")
    floats = np.dtype(f.dtype) if _is_float(f) else np.dtype(np.float64)
    results = []
    for ax, h in zip(axes, spacings):
        n = f.shape[ax]
        if n < 2:
            raise ValueError("Shape of array too small to calculate a numerical gradient, "
                             "at least (edge_order + 1) elements are required.")
        def part(item, ax=ax):
            return f[_along(f.ndim, ax, item)].astype(floats)
        pieces = [(slice(0, 1), np.subtract(part(slice(1, 2)), part(slice(0, 1))) / h),
                  (slice(n - 1, n), np.subtract(part(slice(n - 1, n)),
                                                part(slice(n - 2, n - 1))) / h)]
        if n > 2:
            pieces.append((slice(1, -1), np.subtract(part(slice(2, None)),
                                                     part(slice(None, -2))) / (2.0 * h)))
        results.append(_assembled(f.shape, floats, _lazy.client_of(f), ax, pieces,
                                  "gradient"))
    return results[0] if len(results) == 1 else results


def _correlate_valid(a, v, reverse):
    """sum_j a[j : j + n - k + 1] * v[j] (v reversed for a convolution): one expression."""
    n, k = a.shape[0], v.shape[0]
    terms = [np.multiply(a[j:j + n - k + 1], v[k - 1 - j if reverse else j]) for j in range(k)]
    result = terms[0]
    for term in terms[1:]:
        result = np.add(result, term)
    return result


def _sliding(a, v, mode, reverse, what):
    _check(a, what)
    _check(v, what)
    if a.ndim != 1 or v.ndim != 1:
        raise ValueError(f"{what}: object too deep for desired array")
    if not a.shape[0] or not v.shape[0]:
        raise ValueError(f"{what}: v cannot be empty" if not v.shape[0]
                         else f"{what}: a cannot be empty")
    if mode not in ("full", "same", "valid"):
        raise ValueError(f"{what}: mode must be one of 'valid', 'same', or 'full'")
    if v.shape[0] > a.shape[0]:
        # The longer one slides, as NumPy's: a convolution commutes, and a correlation
        # of real arrays swapped is the same read backwards.
        if what == "correlate":
            return _sliding(v, a, mode, reverse, what)[::-1]
        a, v = v, a
    n, k = a.shape[0], v.shape[0]
    if mode == "valid" and k <= n:
        return _correlate_valid(a, v, reverse)
    # Full: a padded with k - 1 zeros at each end, in a new buffer, then slid.
    dtype = _ufuncs.promote(np.dtype(a.dtype), np.dtype(v.dtype))
    padded = _creation.zeros((n + 2 * (k - 1),), dtype, client=_lazy.client_of(a, v))
    _functions.write(padded[k - 1:k - 1 + n], "", [a], what=what)
    full = _correlate_valid(padded, v, reverse)
    if mode == "full":
        return full
    start = (min(n, k) - 1) // 2  # NumPy's centring, for both
    return full[start:start + max(n, k)] if mode == "same" else full


def convolve(a, v, mode="full"):
    """NumPy's 1-d convolve: a sum of len(v) shifted products, fused (full and same read
    a zero-padded copy of a)."""
    return _sliding(a, v, mode, True, "convolve")


def correlate(a, v, mode="valid"):
    """NumPy's 1-d correlate of real arrays, as convolve without reversing v."""
    return _sliding(a, v, mode, False, "correlate")


def kron(a, b):
    """The Kronecker product: a broadcast product of interleaved views, one copy."""
    _check(a, "kron")
    _check(b, "kron")
    ndim = max(a.ndim, b.ndim)
    sa = (1,) * (ndim - a.ndim) + tuple(a.shape)
    sb = (1,) * (ndim - b.ndim) + tuple(b.shape)
    spread_a = a.reshape(tuple(x for n in sa for x in (n, 1)))
    spread_b = b.reshape(tuple(x for n in sb for x in (1, n)))
    return np.multiply(spread_a, spread_b).reshape(tuple(x * y for x, y in zip(sa, sb)))


def cross(a, b, axisa=-1, axisb=-1, axisc=-1, axis=None):
    """The cross product of 3-vectors along the last axis: one expression a component."""
    _check(a, "cross")
    _check(b, "cross")
    if axis is not None or (axisa, axisb, axisc) != (-1, -1, -1):
        raise TypeError("cross: remote arrays take vectors along the last axis only")
    if a.shape[-1] not in (2, 3) or b.shape[-1] not in (2, 3):
        raise ValueError("incompatible dimensions for cross product\n(dimension must be 2 "
                         "or 3)")
    if a.shape[-1] != 3 or b.shape[-1] != 3:
        raise TypeError("cross: remote arrays take 3-vectors only")
    x0, x1, x2 = (a[..., i] for i in range(3))
    y0, y1, y2 = (b[..., i] for i in range(3))
    return stack([x1 * y2 - x2 * y1, x2 * y0 - x0 * y2, x0 * y1 - x1 * y0], axis=-1)


# ---- Creation, on the array's client. ----

def zeros_like(a, dtype=None, order="K", subok=True, shape=None):
    _refuse_order("zeros_like", order)
    return _creation.zeros_like(_check(a, "zeros_like"), dtype, shape=shape)


def ones_like(a, dtype=None, order="K", subok=True, shape=None):
    _refuse_order("ones_like", order)
    return _creation.ones_like(_check(a, "ones_like"), dtype, shape=shape)


def empty_like(a, dtype=None, order="K", subok=True, shape=None):
    _refuse_order("empty_like", order)
    return _creation.empty_like(_check(a, "empty_like"), dtype, shape=shape)


def full_like(a, fill_value, dtype=None, order="K", subok=True, shape=None):
    _refuse_order("full_like", order)
    return _creation.full_like(_check(a, "full_like"), fill_value, dtype, shape=shape)


# ---- One expression. ----

def diff(a, n=1, axis=-1, prepend=np._NoValue, append=np._NoValue):
    _refuse("diff", prepend=prepend, append=append)
    _check(a, "diff")
    if n < 0:
        raise ValueError(f"order must be non-negative but got {n!r}")
    if a.ndim == 0:
        raise ValueError("diff requires input that is at least one dimensional")
    axis = _normalize_axis(int(axis), a.ndim)
    for _ in range(n):
        later, earlier = a[_along(a.ndim, axis, slice(1, None))], \
            a[_along(a.ndim, axis, slice(None, -1))]
        a = later != earlier if a.dtype == _ufuncs.BOOL else later - earlier
    return a


def outer(a, b, out=None):
    _refuse("outer", out=out)
    return _check(a, "outer").ravel()[:, None] * _check(b, "outer").ravel()[None, :]


def _operand(value, what, float_only=False):
    """A remote array as it is; a host scalar as NumPy's asanyarray makes it (a strong
    0-d value: float64 for a Python float, int64 for an int)."""
    if isinstance(value, (RemoteArrayInfo, View)):
        return _check(value, what)
    if isinstance(value, (bool, np.bool_, numbers.Number, np.generic)):
        value = np.asarray(value)[()]
        if float_only and value.dtype.kind != "f":
            value = np.float64(value)
        return value
    raise TypeError(f"{what}: host data cannot be combined with a remote array; upload it "
                    "first (client.put)")


def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    x = _operand(a, "isclose")
    y = _operand(b, "isclose", float_only=True)
    if isinstance(y, (RemoteArrayInfo, View)) and not _is_float(y):
        y = y.astype(np.float64)
    # ufuncs, not operators: a NumPy scalar's operator would not defer to a remote array.
    finite = np.logical_and(np.isfinite(x), np.isfinite(y))
    within = np.less_equal(np.abs(np.subtract(x, y)), atol + rtol * np.abs(y))
    close = np.where(finite, within, np.equal(x, y))
    if equal_nan:
        close = np.logical_or(close, np.logical_and(np.isnan(x), np.isnan(y)))
    return close


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    return bool(isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan).all())


def array_equal(a1, a2, equal_nan=False):
    x, y = _operand(a1, "array_equal"), _operand(a2, "array_equal")
    if np.shape(x) != np.shape(y):
        return False
    equal = np.equal(x, y)
    if equal_nan:
        equal = np.logical_or(equal, np.logical_and(np.isnan(x), np.isnan(y)))
    return bool(equal.all())


def _triangle(m, k, upper):
    what = "triu" if upper else "tril"
    _check(m, what)
    if m.ndim < 2:
        raise ValueError(f"{what}: input must be at least 2-d (NumPy's 1-d case makes a "
                         "matrix; use broadcast_to first)")
    client = _lazy.client_of(m)
    rows = _creation.arange(m.shape[-2], client=client)[:, None]
    columns = _creation.arange(m.shape[-1], client=client)[None, :]
    offset = columns - rows
    keep = offset >= int(k) if upper else offset <= int(k)
    return np.where(keep, m, np.dtype(m.dtype).type(0))


def triu(m, k=0):
    return _triangle(m, k, upper=True)


def tril(m, k=0):
    return _triangle(m, k, upper=False)


# ---- Reductions. ----

def count_nonzero(a, axis=None, *, keepdims=False):
    return np.sum(_check(a, "count_nonzero") != 0, axis=axis, keepdims=keepdims)


def _divide_by_count(total, count, dtype):
    """total / count in `dtype`, as NumPy's nan functions divide: in float64, rounded
    once to `dtype`."""
    quotient = total.astype(np.float64) / count
    return quotient if dtype == np.float64 else quotient.astype(dtype)


def _nan_reduction(kind, fill):
    def function(a, axis=None, dtype=None, out=None, keepdims=False):
        _refuse(f"nan{kind}", dtype=dtype, out=out)
        if not _is_float(_check(a, f"nan{kind}")):
            return getattr(np, kind)(a, axis=axis, keepdims=keepdims)
        values = np.where(np.isnan(a), fill, a)
        result = getattr(np, kind)(values, axis=axis, keepdims=keepdims)
        if kind in ("min", "max"):  # an all-NaN slice is NaN, as NumPy has it
            count = np.sum(~np.isnan(a), axis=axis, keepdims=keepdims)
            result = np.where(count == 0, np.nan, result)
        return result
    function.__name__ = f"nan{kind}"
    return function


def _nan_mean_and_count(a, axis, keepdims):
    """The mean of a's numbers along `axis`, in a's dtype, and how many there were."""
    count = np.sum(~np.isnan(a), axis=axis, keepdims=keepdims)
    total = np.sum(np.where(np.isnan(a), 0, a), axis=axis, keepdims=keepdims)
    return _divide_by_count(total, count, np.dtype(a.dtype)), count


def nanmean(a, axis=None, dtype=None, out=None, keepdims=False):
    _refuse("nanmean", dtype=dtype, out=out)
    if not _is_float(_check(a, "nanmean")):
        return np.mean(a, axis=axis, keepdims=keepdims)
    return _nan_mean_and_count(a, axis, keepdims)[0]


def nanvar(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
    _refuse("nanvar", dtype=dtype, out=out)
    if not _is_float(_check(a, "nanvar")):
        return np.var(a, axis=axis, ddof=ddof, keepdims=keepdims)
    dtype = np.dtype(a.dtype)
    mean, count = _nan_mean_and_count(a, axis, keepdims=True)
    deviation = np.where(np.isnan(a), 0, a - mean)
    squares = np.sum(deviation * deviation, axis=axis, keepdims=keepdims)
    freedom = count - ddof
    if not keepdims:
        freedom = freedom.reshape(squares.shape)
    return np.where(freedom <= 0, np.nan, _divide_by_count(squares, freedom, dtype))


def nanstd(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
    return np.sqrt(nanvar(a, axis=axis, dtype=dtype, out=out, ddof=ddof, keepdims=keepdims))


_INF = float("inf")


def norm(x, ord=None, axis=None, keepdims=False):  # pylint: disable=redefined-builtin
    """numpy.linalg.norm, but for the norms that need singular values (matrix ord 2,
    -2 and 'nuc'), which raise TypeError."""
    _check(x, "norm")
    if not _is_float(x):
        x = x.astype(np.float64)
    if axis is None and (ord is None or (ord in ("f", "fro") and x.ndim == 2)
                         or (ord == 2 and x.ndim == 1)):
        return np.sqrt(np.sum(x * x, keepdims=keepdims))
    axes = _axis_tuple(axis, x.ndim, "norm")
    if len(axes) == 1:
        (axis,) = axes
        if ord == _INF:
            return np.max(np.abs(x), axis=axis, keepdims=keepdims)
        if ord == -_INF:
            return np.min(np.abs(x), axis=axis, keepdims=keepdims)
        if ord == 0:
            return np.sum(x != 0, axis=axis, keepdims=keepdims).astype(x.dtype)
        if ord == 1:
            return np.sum(np.abs(x), axis=axis, keepdims=keepdims)
        if ord is None or ord == 2:
            return np.sqrt(np.sum(x * x, axis=axis, keepdims=keepdims))
        if isinstance(ord, str):
            raise ValueError(f"Invalid norm order '{ord}' for vectors")
        return np.sum(np.abs(x) ** ord, axis=axis, keepdims=keepdims) ** (1.0 / ord)
    if len(axes) != 2:
        raise ValueError("Improper number of dimensions to norm.")
    row, column = axes
    if ord in (2, -2, "nuc"):
        raise TypeError(f"norm: ord={ord!r} needs singular values, which the server does "
                        "not compute")
    if ord in (None, "f", "fro"):
        result = np.sqrt(np.sum(x * x, axis=axes, keepdims=keepdims))
    elif ord in (1, -1, _INF, -_INF):
        extreme = np.max if ord > 0 else np.min
        summed, across = (row, column) if abs(ord) == 1 else (column, row)
        sums = np.sum(np.abs(x), axis=summed, keepdims=keepdims)
        result = extreme(sums, axis=across if keepdims or across < summed else across - 1,
                         keepdims=keepdims)
    else:
        raise ValueError("Invalid norm order for matrices.")
    return result


def ptp(a, axis=None, out=None, keepdims=False):
    _refuse("ptp", out=out)
    _check(a, "ptp")
    return np.subtract(np.max(a, axis=axis, keepdims=keepdims),
                       np.min(a, axis=axis, keepdims=keepdims))


def average(a, axis=None, weights=None, returned=False, *, keepdims=False):
    """mean, or sum(a * w) / sum(w). With weights, a weight sum of zero raises
    ZeroDivisionError as NumPy's does, which reads one reduction's value."""
    _check(a, "average")
    if weights is None:
        result = np.mean(a, axis=axis, keepdims=keepdims)
        scale = result.dtype.type(a.size / max(result.size, 1))
        return (result, np.full_like(result, scale) if result.ndim else scale) \
            if returned else result
    w = _check(weights, "average")
    if tuple(w.shape) != tuple(a.shape):
        if axis is None:
            raise TypeError("Axis must be specified when shapes of a and weights differ.")
        if w.ndim != 1:
            raise TypeError("1D weights expected when shapes of a and weights differ.")
        along = _normalize_axis(int(axis), a.ndim)
        if w.shape[0] != a.shape[along]:
            raise ValueError("Length of weights not compatible with specified axis.")
        w = w.reshape((1,) * along + (-1,) + (1,) * (a.ndim - along - 1))
    floats = _ufuncs.promote(np.dtype(a.dtype), np.dtype(w.dtype))
    if np.dtype(a.dtype).kind in "biu":
        floats = _ufuncs.promote(floats, np.dtype(np.float64))
    total = np.sum(np.broadcast_to(w, a.shape).astype(floats), axis=axis, keepdims=keepdims)
    if bool(np.any(total == 0)):
        raise ZeroDivisionError("Weights sum to zero, can't be normalized")
    result = np.sum(np.multiply(a.astype(floats), w.astype(floats)), axis=axis,
                    keepdims=keepdims) / total
    return (result, total) if returned else result


# ---- Diagonals, through the flat view of a C-ordered matrix (a copy where needed). ----

def diagonal(a, offset=0, axis1=0, axis2=1):
    _check(a, "diagonal")
    if a.ndim != 2 or {_normalize_axis(axis1, 2), _normalize_axis(axis2, 2)} != {0, 1}:
        raise TypeError("diagonal: remote arrays take the diagonal of a 2-d array only")
    if _normalize_axis(axis1, 2) == 1:
        a = a.T
    rows, columns = a.shape
    offset = int(offset)
    start, count = (offset, min(rows, columns - offset)) if offset >= 0 else \
        (-offset * columns, min(rows + offset, columns))
    if count <= 0:
        return a.reshape(-1)[:0]
    return a.reshape(-1)[start:start + (count - 1) * (columns + 1) + 1:columns + 1]


def trace(a, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    _refuse("trace", dtype=dtype, out=out)
    return np.sum(diagonal(a, offset, axis1, axis2))


def diag(v, k=0):
    """A 2-d array's diagonal (a View), or a new matrix with a 1-d array on one."""
    _check(v, "diag")
    if v.ndim == 2:
        return diagonal(v, k)
    if v.ndim != 1:
        raise ValueError("Input must be 1- or 2-d.")
    n = v.shape[0] + abs(int(k))
    result = _creation.zeros((n, n), v.dtype, client=_lazy.client_of(v))
    if v.shape[0]:
        _functions.write(diagonal(result, k), "", [v], what="diag")
    return result


# ---- Products, through matmul (float32 and float64). ----

def tensordot(a, b, axes=2):
    """NumPy's: both operands' summed axes moved last and first, reshaped (copied where
    the strides need it), one matmul, reshaped."""
    _check(a, "tensordot")
    _check(b, "tensordot")
    if isinstance(axes, (numbers.Integral, np.integer)):
        axes_a, axes_b = list(range(-int(axes), 0)), list(range(int(axes)))
    else:
        axes_a, axes_b = ([x] if isinstance(x, (numbers.Integral, np.integer)) else list(x)
                          for x in axes)
    if len(axes_a) != len(axes_b):
        raise ValueError("shape-mismatch for sum")
    axes_a = [_normalize_axis(int(x), a.ndim) for x in axes_a]
    axes_b = [_normalize_axis(int(x), b.ndim) for x in axes_b]
    if any(a.shape[i] != b.shape[j] for i, j in zip(axes_a, axes_b)):
        raise ValueError("shape-mismatch for sum")
    kept_a = [k for k in range(a.ndim) if k not in axes_a]
    kept_b = [k for k in range(b.ndim) if k not in axes_b]
    def extent(x, axes):
        return int(np.prod([x.shape[i] for i in axes], dtype=np.int64))
    summed = extent(a, axes_a)
    left = a.transpose(kept_a + axes_a).reshape(extent(a, kept_a), summed)
    right = b.transpose(axes_b + kept_b).reshape(summed, extent(b, kept_b))
    return np.matmul(left, right).reshape(
        tuple(a.shape[i] for i in kept_a) + tuple(b.shape[j] for j in kept_b))


def inner(a, b):
    _check(a, "inner")
    _check(b, "inner")
    if a.ndim == 0 or b.ndim == 0:
        return np.multiply(a, b)
    return tensordot(a, b, ([-1], [-1]))


def vdot(a, b):
    return np.sum(np.multiply(_check(a, "vdot").ravel(), _check(b, "vdot").ravel()))


def _einsum_parse(subscripts, count):
    if not isinstance(subscripts, str):
        raise TypeError("einsum: remote arrays take the subscripts as a string")
    text = subscripts.replace(" ", "")
    if "." in text:
        raise TypeError("einsum: '...' is not supported on remote arrays; name every axis")
    inputs, arrow, output = text.partition("->")
    terms = inputs.split(",")
    if len(terms) != count:
        raise ValueError("more operands provided to einstein sum function than specified "
                         "in the subscripts string" if count > len(terms) else
                         "fewer operands provided to einstein sum function than specified "
                         "in the subscripts string")
    letters = "".join(terms)
    if not arrow:
        output = "".join(sorted(label for label in set(letters) if letters.count(label) == 1))
    for label in letters + output:
        if not label.isalpha():
            raise ValueError(f"invalid subscript '{label}' in einstein sum subscripts "
                             "string, subscripts must be letters")
    for label in output:
        if label not in letters:
            raise ValueError(f"einstein sum subscripts string included output subscript "
                             f"'{label}' which never appeared in an input")
        if output.count(label) > 1:
            raise ValueError(f"einstein sum subscripts string includes output subscript "
                             f"'{label}' multiple times")
    return terms, output


def einsum(*operands, out=None, optimize=False, **unsupported):
    """NumPy's einsum without '...': a contraction of two operands (each label in exactly
    two of the operands and the output) is tensordot, one matmul; anything else is one
    fused map-reduce of the operands broadcast against each other, with no temporary.
    A label repeated within an operand takes its diagonal (2-d operands)."""
    _refuse("einsum", out=out, **unsupported)
    subscripts, arrays = operands[0], list(operands[1:])
    terms, output = _einsum_parse(subscripts, len(arrays))
    for i, (term, array) in enumerate(zip(terms, arrays)):
        _check(array, "einsum")
        if len(term) != array.ndim:
            raise ValueError(f"operand has more dimensions than subscripts given in einstein "
                             f"sum, but no '...' ellipsis provided to broadcast the extra "
                             f"dimensions." if array.ndim > len(term) else
                             f"einstein sum subscripts string contains too many subscripts "
                             f"for operand {i}")
        if len(set(term)) != len(term):
            if array.ndim != 2:
                raise TypeError("einsum: a label repeated within an operand takes a 2-d "
                                "operand's diagonal only")
            terms[i], arrays[i] = term[0], diagonal(array)
    dtype = _ufuncs.promote(*(np.dtype(array.dtype) for array in arrays))
    if dtype.kind not in "iuf":
        raise TypeError(f"einsum of {dtype}: remote arrays take integer and float operands")
    extents = {}
    for term, array in zip(terms, arrays):
        for label, n in zip(term, array.shape):
            if extents.setdefault(label, n) != n and n != 1 and extents[label] != 1:
                raise ValueError(f"operands could not be broadcast together with remapped "
                                 f"shapes: label '{label}' has extents {extents[label]} "
                                 f"and {n}")
            extents[label] = max(extents[label], n)
    if (len(arrays) == 2 and dtype.kind == "f" and all(
            sum(label in t for t in (terms[0], terms[1], output)) == 2
            for label in set(terms[0] + terms[1]))
            and all(extents[label] == n for term, array in zip(terms, arrays)
                    for label, n in zip(term, array.shape))):
        shared = [label for label in terms[0] if label in terms[1]]
        product = tensordot(arrays[0], arrays[1], ([terms[0].index(label) for label in shared],
                                                   [terms[1].index(label) for label in shared]))
        labels = [label for label in terms[0] + terms[1] if label not in shared]
        return product.transpose([labels.index(label) for label in output]) \
            if labels != list(output) else product
    # The output's labels, then the summed ones: every operand's axes put in that order,
    # with an axis of 1 where it has no label, so that the operands broadcast together.
    order = output + "".join(sorted(set("".join(terms)) - set(output)))
    product = None
    for term, array in zip(terms, arrays):
        present = [label for label in order if label in term]
        if list(term) != present:
            array = array.transpose([term.index(label) for label in present])
        if len(present) != len(order):
            array = array.reshape(tuple(array.shape[present.index(label)] if label in term
                                        else 1 for label in order))
        product = array if product is None else np.multiply(product, array)
    summed = tuple(range(len(output), len(order)))
    result = np.sum(product, axis=summed) if summed else product
    return result if np.dtype(result.dtype) == dtype else result.astype(dtype)


def cov(m, y=None, rowvar=True, bias=False, ddof=None, fweights=None, aweights=None, *,
        dtype=None):
    """NumPy's cov without weights: centred rows, one matmul, in float64."""
    _refuse("cov", fweights=fweights, aweights=aweights, dtype=dtype)

    def rows(x):
        x = _check(x, "cov").astype(np.float64)
        if x.ndim > 2:
            raise ValueError("m has more than 2 dimensions")
        x = x.reshape(1, -1) if x.ndim < 2 else x
        return x.T if not rowvar and x.shape[0] != 1 else x
    x = rows(m)
    if y is not None:
        x = concatenate([x, rows(y)], axis=0)
    if ddof is None:
        ddof = 0 if bias else 1
    with np.errstate(divide="ignore"):
        factor = np.true_divide(1, max(x.shape[1] - ddof, 0))
    centred = np.subtract(x, np.mean(x, axis=1, keepdims=True))
    return np.multiply(np.matmul(centred, centred.T), factor).squeeze()


def corrcoef(x, y=None, rowvar=True, *, dtype=None):
    _refuse("corrcoef", dtype=dtype)
    c = cov(x, y, rowvar)
    if c.ndim == 0:
        return np.true_divide(c, c)
    stddev = np.sqrt(diagonal(c))
    return np.clip(np.true_divide(np.true_divide(c, stddev[:, None]), stddev[None, :]), -1, 1)


# ---- New buffers. ----

def _parts(arrays, what):
    parts = list(arrays)
    if not parts:
        raise ValueError("need at least one array to concatenate")
    for part in parts:
        if not isinstance(part, (RemoteArrayInfo, View)):
            raise TypeError(f"{what}: every array must be a remote array (client.put "
                            f"uploads), not {type(part).__name__}")
        _check(part, what)
    return parts


def concatenate(arrays, axis=0, out=None, *, dtype=None, casting=None):
    """One CreateBuffer, then one write of each part (sent through the session)."""
    _refuse("concatenate", out=out, casting=casting)
    parts = _parts(arrays, "concatenate")
    if axis is None:
        parts, axis = [part.ravel() for part in parts], 0
    first = parts[0]
    if first.ndim == 0:
        raise ValueError("zero-dimensional arrays cannot be concatenated")
    axis = _normalize_axis(int(axis), first.ndim)
    for i, part in enumerate(parts[1:], 1):
        if part.ndim != first.ndim:
            raise ValueError(
                "all the input array dimensions except for the concatenation axis must match "
                f"exactly, but along dimension 0, the array at index 0 has {first.ndim} "
                f"dimension(s) and the array at index {i} has {part.ndim} dimension(s)")
        for d in range(first.ndim):
            if d != axis and part.shape[d] != first.shape[d]:
                raise ValueError(
                    "all the input array dimensions except for the concatenation axis must "
                    f"match exactly, but along dimension {d}, the array at index 0 has size "
                    f"{first.shape[d]} and the array at index {i} has size {part.shape[d]}")
    result_dtype = np.dtype(dtype) if dtype is not None else _ufuncs.promote(
        *(np.dtype(part.dtype) for part in parts))
    shape = list(first.shape)
    shape[axis] = sum(part.shape[axis] for part in parts)
    starts = np.cumsum([0] + [part.shape[axis] for part in parts])
    pieces = [(slice(int(start), int(start) + part.shape[axis]),
               part if part.dtype == result_dtype else part.astype(result_dtype))
              for start, part in zip(starts, parts) if part.shape[axis]]
    return _assembled(shape, result_dtype, _lazy.client_of(*parts), axis, pieces,
                      "concatenate")


def stack(arrays, axis=0, out=None, *, dtype=None, casting=None):
    parts = _parts(arrays, "stack")
    if len({tuple(part.shape) for part in parts}) != 1:
        raise ValueError("all input arrays must have the same shape")
    axis = _normalize_axis(int(axis), parts[0].ndim + 1)
    return concatenate([part.expand_dims(axis) for part in parts], axis=axis, out=out,
                       dtype=dtype, casting=casting)


def vstack(tup, *, dtype=None, casting=None):
    parts = [part if part.ndim >= 2 else part.reshape(1, -1) if part.ndim == 1
             else part.reshape(1, 1) for part in _parts(tup, "vstack")]
    return concatenate(parts, axis=0, dtype=dtype, casting=casting)


def hstack(tup, *, dtype=None, casting=None):
    parts = [part if part.ndim >= 1 else part.reshape(1) for part in _parts(tup, "hstack")]
    return concatenate(parts, axis=0 if parts[0].ndim == 1 else 1, dtype=dtype,
                       casting=casting)


def roll(a, shift, axis=None):
    _check(a, "roll")
    if axis is None:
        return roll(a.ravel(), shift, 0).reshape(a.shape)
    shifts = shift if isinstance(shift, tuple) else (shift,)
    axes = axis if isinstance(axis, tuple) else (axis,)
    if len(shifts) == 1:
        shifts = shifts * len(axes)
    if len(axes) == 1:
        axes = axes * len(shifts)
    if len(shifts) != len(axes):
        raise ValueError("'shift' and 'axis' should be scalars or 1D sequences")
    amounts = [0] * a.ndim
    for s, ax in zip(shifts, axes):
        amounts[_normalize_axis(int(ax), a.ndim)] += int(s)
    for ax, amount in enumerate(amounts):
        extent = a.shape[ax]
        if extent == 0 or amount % extent == 0:
            continue
        amount %= extent
        pieces = [(slice(amount, None), a[_along(a.ndim, ax, slice(None, extent - amount))]),
                  (slice(None, amount), a[_along(a.ndim, ax, slice(extent - amount, None))])]
        a = _assembled(a.shape, a.dtype, _lazy.client_of(a), ax, pieces, "roll")
    return a


def _runs(indices):
    """(start, stop, step, count) slices covering `indices` in order: runs of one
    nonzero step, or single indices."""
    runs, i, n = [], 0, len(indices)
    while i < n:
        j = i
        step = int(indices[i + 1] - indices[i]) if i + 1 < n else 1
        if step != 0:
            while j + 1 < n and indices[j + 1] - indices[j] == step:
                j += 1
        else:
            step = 1
        start, last = int(indices[i]), int(indices[j])
        stop = last + step
        runs.append((start, None if stop < 0 else stop, step, j - i + 1))
        i = j + 1
    return runs


def take(a, indices, axis=None, out=None, mode="raise"):
    """Elements at host `indices` along `axis` (of the flattened array by default): a new
    buffer (one CreateBuffer call) and one write per run of evenly spaced indices."""
    _refuse("take", out=out)
    if mode != "raise":
        raise TypeError(f"take: mode={mode!r} is not supported on remote arrays")
    _check(a, "take")
    if isinstance(indices, (RemoteArrayInfo, View)):
        raise TypeError("take: the indices must be host integers; remote arrays do not "
                        "index remote arrays")
    positions = np.asarray(indices)
    if positions.dtype.kind not in "iu" and positions.size:
        raise IndexError("arrays used as indices must be of integer (or boolean) type")
    if axis is None:
        a, axis = a.ravel(), 0
    axis = _normalize_axis(int(axis), a.ndim)
    extent = a.shape[axis]
    flat = positions.astype(np.int64).reshape(-1)
    wrong = flat[(flat < -extent) | (flat >= extent)]
    if wrong.size:
        raise IndexError(f"index {int(wrong[0])} is out of bounds for axis {axis} with size "
                         f"{extent}")
    flat = flat % extent if extent else flat
    shape = a.shape[:axis] + (len(flat),) + a.shape[axis + 1:]
    pieces, at = [], 0
    for start, stop, step, count in _runs(flat):
        pieces.append((slice(at, at + count), a[_along(a.ndim, axis, slice(start, stop, step))]))
        at += count
    result = _assembled(shape, a.dtype, _lazy.client_of(a), axis, pieces, "take")
    if positions.ndim == 1:
        return result
    return result.reshape(a.shape[:axis] + positions.shape + a.shape[axis + 1:])


def repeat(a, repeats, axis=None):
    """One copy of a broadcast view of `a`, reshaped (repeats: one integer)."""
    _check(a, "repeat")
    if not isinstance(repeats, (numbers.Integral, np.integer)):
        raise TypeError("repeat: repeats must be one integer on remote arrays")
    if repeats < 0:
        raise ValueError("negative dimensions are not allowed")
    if axis is None:
        a, axis = a.ravel(), 0
    axis = _normalize_axis(int(axis), a.ndim)
    spread = a.shape[:axis + 1] + (int(repeats),) + a.shape[axis + 1:]
    result = a.shape[:axis] + (a.shape[axis] * int(repeats),) + a.shape[axis + 1:]
    return a.expand_dims(axis + 1).broadcast_to(spread).copy().reshape(result)


def tile(A, reps):  # pylint: disable=invalid-name
    """One copy of a broadcast view of A, reshaped."""
    _check(A, "tile")
    reps = tuple(int(r) for r in (reps if isinstance(reps, (tuple, list)) else (reps,)))
    if any(r < 0 for r in reps):
        raise ValueError("negative dimensions are not allowed")
    ndim = max(A.ndim, len(reps))
    shape = (1,) * (ndim - A.ndim) + tuple(A.shape)
    reps = (1,) * (ndim - len(reps)) + reps
    a = A.reshape(shape) if ndim != A.ndim else A
    interleaved = a.reshape(tuple(x for n in shape for x in (1, n)))
    spread = tuple(x for r, n in zip(reps, shape) for x in (r, n))
    return interleaved.broadcast_to(spread).copy().reshape(
        tuple(r * n for r, n in zip(reps, shape)))


FUNCTIONS = {
    np.flip: flip, np.fliplr: fliplr, np.flipud: flipud, np.swapaxes: swapaxes,
    np.moveaxis: moveaxis, np.ravel: ravel, np.ndim: array_ndim, np.shape: array_shape,
    np.size: array_size,
    np.zeros_like: zeros_like, np.ones_like: ones_like, np.empty_like: empty_like,
    np.full_like: full_like,
    np.diff: diff, np.outer: outer, np.isclose: isclose, np.allclose: allclose,
    np.array_equal: array_equal, np.triu: triu, np.tril: tril,
    np.count_nonzero: count_nonzero, np.linalg.norm: norm,
    np.nansum: _nan_reduction("sum", 0), np.nanprod: _nan_reduction("prod", 1),
    np.nanmin: _nan_reduction("min", _INF), np.nanmax: _nan_reduction("max", -_INF),
    np.nanmean: nanmean, np.nanvar: nanvar, np.nanstd: nanstd,
    np.concatenate: concatenate, np.stack: stack, np.vstack: vstack, np.hstack: hstack,
    np.roll: roll, np.repeat: repeat, np.tile: tile, np.take: take, np.ptp: ptp,
    np.average: average,
    np.diagonal: diagonal, np.trace: trace, np.diag: diag, np.tensordot: tensordot,
    np.inner: inner, np.vdot: vdot, np.cov: cov, np.corrcoef: corrcoef, np.einsum: einsum,
    np.atleast_1d: atleast_1d, np.atleast_2d: atleast_2d, np.atleast_3d: atleast_3d,
    np.broadcast_arrays: broadcast_arrays, np.meshgrid: meshgrid, np.copy: copy_,
    np.nan_to_num: nan_to_num, np.fix: fix, np.polyval: polyval, np.gradient: gradient,
    np.convolve: convolve, np.correlate: correlate, np.kron: kron, np.cross: cross,
}
for _name in ("trapezoid", "trapz"):  # NumPy 2 renamed trapz
    if hasattr(np, _name):
        FUNCTIONS[getattr(np, _name)] = trapezoid
