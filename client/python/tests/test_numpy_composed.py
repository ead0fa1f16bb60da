"""NumPy's functions that the client builds from the server's operations
(gpucompute._composed), and reshape's copy where the strides allow no view: against
NumPy, on views and pending expressions as well as buffers, with random shapes from a
fixed seed. Nothing may be downloaded on the way: each result is checked to be remote
before it is compared."""

import warnings

import numpy as np
import pytest

from gpucompute._arrays import RemoteArrayInfo
from gpucompute._proto import v1
from gpucompute._views import View

SEED = 4711

pytestmark = pytest.mark.usefixtures("nep50")


def _remote(value):
    assert isinstance(value, (RemoteArrayInfo, View)), type(value)
    return value


def _close(actual, expected):
    expected = np.asarray(expected)
    actual = np.asarray(_remote(actual))
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    if expected.dtype.kind == "f":
        rtol = 1e-5 if expected.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol)
    else:
        np.testing.assert_array_equal(actual, expected)


def _arrays(client, rng, shape, dtype="float64"):
    """(NumPy array, its remote copy) pairs: the buffer, a transposed and strided view of
    a larger buffer with the same values, and a pending expression equal to it."""
    a = (rng.standard_normal(shape) * 4).astype(dtype)
    big = np.zeros(tuple(reversed(shape))[:-1] + (2 * shape[0],) if len(shape) > 1
                   else (2 * shape[0],), dtype)
    if len(shape) > 1:
        big[..., ::2] = a.T
        view = client.put(big)[..., ::2].T
    else:
        big[::2] = a
        view = client.put(big)[::2]
    x = client.put(a)
    return [(a, x), (a, view), (a, x * 1)]


def test_reshape_copies_where_the_strides_allow_no_view(client):
    a = np.arange(24.0).reshape(4, 6)
    x = client.put(a)
    for remote, expected in ((x.T.reshape(-1), a.T.reshape(-1)),
                             (x[:, ::2].reshape(12), a[:, ::2].reshape(12)),
                             (x.T.reshape(3, 8), a.T.reshape(3, 8)),
                             (np.reshape(x.T, (2, 12)), np.reshape(a.T, (2, 12))),
                             (x.T.ravel(), a.T.ravel()), (np.ravel(x[::-1]), np.ravel(a[::-1]))):
        _close(remote, expected)
    # Where the strides allow it, still a View and no call.
    assert isinstance(x.T.reshape(6, 1, 4), View)
    assert isinstance(x[1:3].reshape(-1), View)
    # Column-major buffers reshape in C order, copying.
    f = client.put(np.asfortranarray(a))
    assert f.layout == "F"
    _close(f.reshape(-1), a.reshape(-1))
    _close(f.reshape(3, 8), a.reshape(3, 8))
    # The array API's copy=False never copies; reshape_view is that, as a method.
    xp = x.__array_namespace__()
    assert isinstance(xp.reshape(x.T, (6, 1, 4), copy=False), View)
    for refused in (lambda: xp.reshape(x.T, (24,), copy=False), lambda: x.T.reshape_view(-1),
                    lambda: f.reshape_view(24)):
        with pytest.raises(ValueError, match="into shape \\(24,\\) without copying"):
            refused()
    _close(xp.reshape(x.T, (24,)), a.T.reshape(24))
    _close(xp.reshape(x, (24,), copy=True), a.reshape(24))
    # A pending expression's layout is the server's before it is sent: F where every
    # operand is a whole F buffer of its shape.
    for expression, layout in ((f + 1, "F"), (f * f[:, ::-1][:, ::-1], "F"), (f + x, "C"),
                               (f[1:] * 2, "C"), (f + f.sum(), "C")):
        assert expression.layout == layout
        expression.compute()
        assert expression.info.layout == (v1.LAYOUT_F if layout == "F" else v1.LAYOUT_C)
    # The copy is NumPy's: writing through it leaves the array as it was.
    y = client.put(a.copy())
    copy = y.T.reshape(-1)
    copy[0] = 100.0
    _close(y, a)


def test_views_flip_swapaxes_moveaxis_and_metadata(client):
    rng = np.random.default_rng(SEED)
    for a, x in _arrays(client, rng, (3, 4, 5)):
        for axis in (None, 0, -1, (0, 2)):
            _close(np.flip(x, axis), np.flip(a, axis))
        _close(np.fliplr(x), np.fliplr(a))
        _close(np.flipud(x), np.flipud(a))
        _close(np.swapaxes(x, 0, 2), np.swapaxes(a, 0, 2))
        _close(x.swapaxes(-1, 1), a.swapaxes(-1, 1))
        _close(np.moveaxis(x, 0, -1), np.moveaxis(a, 0, -1))
        _close(np.moveaxis(x, (0, 1), (2, 0)), np.moveaxis(a, (0, 1), (2, 0)))
        assert np.ndim(x) == 3 and np.shape(x) == (3, 4, 5) and np.size(x) == 60
        assert np.size(x, -1) == 5
    x = client.put(np.zeros(3))
    with pytest.raises(ValueError, match="Input must be >= 2-d"):
        np.fliplr(x)
    with pytest.raises(ValueError, match="same number of elements"):
        np.moveaxis(client.put(np.zeros((2, 3))), (0, 1), 0)


def test_like_functions_make_buffers_of_the_arrays_shape_on_its_client(client):
    x = client.put(np.ones((3, 2), np.float32))
    _close(np.zeros_like(x), np.zeros((3, 2), np.float32))
    _close(np.ones_like(x, dtype=np.int64), np.ones((3, 2), np.int64))
    _close(np.full_like(x, 2.5), np.full((3, 2), 2.5, np.float32))
    _close(np.full_like(x, 7, shape=(4,)), np.full(4, 7, np.float32))
    assert np.empty_like(x.T).shape == (2, 3)
    with pytest.raises(TypeError, match="order='F' is not supported"):
        np.zeros_like(x, order="F")


def test_diff_and_outer(client):
    rng = np.random.default_rng(SEED)
    for a, x in _arrays(client, rng, (5, 6)):
        for n in (0, 1, 2, 4):
            for axis in (0, -1):
                _close(np.diff(x, n=n, axis=axis), np.diff(a, n=n, axis=axis))
        _close(np.outer(x[0], x[:, 1]), np.outer(a[0], a[:, 1]))
        _close(np.outer(x, x[1]), np.outer(a, a[1]))
    b = rng.integers(0, 2, 7).astype(bool)
    _close(np.diff(client.put(b)), np.diff(b))  # booleans differ by not_equal
    i = rng.integers(-9, 9, 7).astype(np.int32)
    _close(np.diff(client.put(i), 2), np.diff(i, 2))
    with pytest.raises(ValueError, match="order must be non-negative"):
        np.diff(client.put(i), -1)
    with pytest.raises(TypeError, match="keyword 'prepend' is not supported"):
        np.diff(client.put(i), prepend=0)


def test_isclose_allclose_and_array_equal_hold_numpys_special_values(client):
    specials = np.array([0.0, -0.0, 1.0, 1.0 + 1e-9, 1e-300, np.inf, -np.inf, np.nan,
                         5e-9, -1.0, 1e10, 1e10 * (1 + 1e-6)])
    a = np.repeat(specials, len(specials))
    b = np.tile(specials, len(specials))
    for dtype in ("float64", "float32"):
        x, y = client.put(a.astype(dtype)), client.put(b.astype(dtype))
        for equal_nan in (False, True):
            for rtol, atol in ((1e-5, 1e-8), (0.0, 0.0), (1e-3, 1.0)):
                _close(np.isclose(x, y, rtol, atol, equal_nan),
                       np.isclose(a.astype(dtype), b.astype(dtype), rtol, atol, equal_nan))
            assert np.allclose(x, y, equal_nan=equal_nan) is False
            assert np.allclose(x, x, equal_nan=equal_nan) is equal_nan
        _close(np.isclose(x, 1.0), np.isclose(a.astype(dtype), 1.0))
        _close(np.isclose(0.5, y), np.isclose(0.5, b.astype(dtype)))
    i = client.put(np.arange(-3, 4, dtype=np.int32))
    _close(np.isclose(i, i * 1), np.isclose(np.arange(-3, 4), np.arange(-3, 4)))
    assert np.allclose(i, i)
    assert np.array_equal(x, x * 1) is False  # NaNs
    assert np.array_equal(x, x * 1, equal_nan=True) is True
    assert np.array_equal(x, x[:3]) is False
    assert np.array_equal(i, i + 0) is True and np.array_equal(i, i + 1) is False
    assert np.array_equal(i, i, equal_nan=True) is True


def test_triu_and_tril(client):
    rng = np.random.default_rng(SEED)
    for a, x in _arrays(client, rng, (5, 7)):
        for k in (-6, -1, 0, 2, 9):
            _close(np.triu(x, k), np.triu(a, k))
            _close(np.tril(x, k), np.tril(a, k))
    batch = rng.integers(0, 9, (2, 3, 4)).astype(np.int32)
    _close(np.triu(client.put(batch)), np.triu(batch))
    flags = batch > 4
    _close(np.tril(client.put(flags), 1), np.tril(flags, 1))


def test_count_nonzero_and_the_nan_reductions(client):
    rng = np.random.default_rng(SEED)
    a = rng.standard_normal((4, 5, 6))
    a[rng.random(a.shape) < 0.3] = np.nan
    a[0, 0, :] = np.nan  # an all-NaN slice along the last axis
    a[a > 1.5] = 0.0
    functions = ["nansum", "nanprod", "nanmean", "nanmin", "nanmax", "nanvar", "nanstd"]
    for dtype in ("float64", "float32"):
        values = a.astype(dtype)
        x = client.put(values)
        for axis in (None, 0, -1, (0, 2)):
            for keepdims in (False, True):
                _close(np.count_nonzero(x, axis=axis, keepdims=keepdims),
                       np.count_nonzero(values, axis=axis, keepdims=keepdims))
                for name in functions:
                    with warnings.catch_warnings():  # all-NaN slices, as NumPy warns
                        warnings.simplefilter("ignore")
                        expected = getattr(np, name)(values, axis=axis, keepdims=keepdims)
                    _close(getattr(np, name)(x, axis=axis, keepdims=keepdims), expected)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _close(np.nanvar(x, axis=1, ddof=1), np.nanvar(values, axis=1, ddof=1))
            _close(np.nanstd(x[:, :2], axis=1, ddof=2), np.nanstd(values[:, :2], axis=1,
                                                                   ddof=2))
    i = rng.integers(-5, 5, (3, 4)).astype(np.int64)
    for name in functions:
        _close(getattr(np, name)(client.put(i), axis=0), getattr(np, name)(i, axis=0))


def test_norms(client):
    rng = np.random.default_rng(SEED)
    for a, x in _arrays(client, rng, (4, 6)):
        for ord_ in (None, "fro", 1, -1, np.inf, -np.inf):
            for keepdims in (False, True):
                _close(np.linalg.norm(x, ord_, keepdims=keepdims),
                       np.linalg.norm(a, ord_, keepdims=keepdims))
                _close(np.linalg.norm(x, ord_, axis=(1, 0), keepdims=keepdims),
                       np.linalg.norm(a, ord_, axis=(1, 0), keepdims=keepdims))
        for ord_ in (None, 0, 1, 2, 3, 0.5, np.inf, -np.inf):
            _close(np.linalg.norm(x, ord_, axis=-1), np.linalg.norm(a, ord_, axis=-1))
            _close(np.linalg.norm(x[0], ord_), np.linalg.norm(a[0], ord_))
    cube = rng.standard_normal((2, 3, 4)).astype(np.float32)
    _close(np.linalg.norm(client.put(cube)), np.linalg.norm(cube))
    _close(np.linalg.norm(client.put(cube), axis=(0, 2)), np.linalg.norm(cube, axis=(0, 2)))
    ints = rng.integers(-9, 9, 10)
    _close(np.linalg.norm(client.put(ints)), np.linalg.norm(ints))
    with pytest.raises(TypeError, match="singular values"):
        np.linalg.norm(client.put(cube[0]), 2)
    with pytest.raises(ValueError, match="Improper number of dimensions"):
        np.linalg.norm(client.put(cube), 1)


def test_concatenate_stack_and_their_dtypes(client):
    rng = np.random.default_rng(SEED)
    a = rng.standard_normal((3, 4))
    b = rng.standard_normal((2, 4)).astype(np.float32)
    c = rng.integers(-5, 5, (3, 4)).astype(np.int32)
    x, y, z = client.put(a), client.put(b), client.put(c)
    _close(np.concatenate([x, y]), np.concatenate([a, b]))
    _close(np.concatenate([x, z * 2], axis=1), np.concatenate([a, c * 2], axis=1))
    _close(np.concatenate([y, y.T.T[::-1]], axis=0), np.concatenate([b, b[::-1]]))
    _close(np.concatenate([x.T, z.T], axis=-1), np.concatenate([a.T, c.T], axis=-1))
    _close(np.concatenate([x, z], axis=None), np.concatenate([a, c], axis=None))
    _close(np.concatenate([z, z], dtype=np.float32), np.concatenate([c, c]).astype(np.float32))
    _close(np.concatenate([x[:0], y]), np.concatenate([a[:0], b]))
    _close(np.stack([x, z]), np.stack([a, c]))
    _close(np.stack([x, x * 2, x + 1], axis=-1), np.stack([a, a * 2, a + 1], axis=-1))
    _close(np.vstack([x, y, x[0]]), np.vstack([a, b, a[0]]))
    _close(np.hstack([x, z]), np.hstack([a, c]))
    _close(np.hstack([x[0], y[1]]), np.hstack([a[0], b[1]]))
    wide = client.put(np.zeros((3, 5)))
    before = {buffer.id for buffer in client.buffers()}
    for call, message in ((lambda: np.concatenate([x, wide]),
                           "along dimension 1, the array at index 0 has size 4"),
                          (lambda: np.concatenate([x, x[0]]), "has 2 dimension"),
                          (lambda: np.stack([x, y]), "must have the same shape"),
                          (lambda: np.concatenate([]), "need at least one array")):
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(TypeError, match="every array must be a remote array"):
        np.concatenate([x, a])
    assert {buffer.id for buffer in client.buffers()} <= before  # refused: nothing made


def test_empty_arrays_of_several_axes_take_elementwise_operations(client):
    # A dense (3, 0) has stride 0 on its axis of 3; the server once took it for a
    # broadcast output and refused to write it.
    for shape in ((3, 0), (4, 5, 0), (0, 5), (2, 0, 3)):
        a = np.zeros(shape, np.float32)
        x = client.put(a)
        _close(client.eval("x + 1", x=x), a + 1)
        _close(x * 2 - 1, a * 2 - 1)
        _close(np.repeat(x, 0, axis=-1), np.repeat(a, 0, axis=-1))


def test_roll_repeat_and_tile(client):
    rng = np.random.default_rng(SEED)
    for a, x in _arrays(client, rng, (4, 5)):
        for shift, axis in ((1, None), (-3, None), (2, 0), (7, 1), ((1, -2), (0, 1)),
                            (3, (0, 0)), (0, 1), (5, 1)):
            _close(np.roll(x, shift, axis), np.roll(a, shift, axis))
        for repeats, axis in ((2, None), (3, 0), (1, -1), (0, 1)):
            _close(np.repeat(x, repeats, axis), np.repeat(a, repeats, axis))
        for reps in (2, (2, 1), (1, 3), (2, 1, 2), (0, 2)):
            _close(np.tile(x, reps), np.tile(a, reps))
    with pytest.raises(TypeError, match="one integer"):
        np.repeat(x, [1, 2, 3, 4], axis=0)


def test_ptp_and_average(client):
    rng = np.random.default_rng(SEED)
    for a, x in _arrays(client, rng, (4, 5)):
        for axis in (None, 0, -1):
            _close(np.ptp(x, axis=axis), np.ptp(a, axis=axis))
            _close(np.average(x, axis=axis), np.average(a, axis=axis))
        w = np.abs(rng.standard_normal((4, 5))) + 0.1
        for axis in (None, 0, 1):
            _close(np.average(x, axis=axis, weights=client.put(w)),
                   np.average(a, axis=axis, weights=w))
        for axis in (None, 1):
            for remote, expected in zip(np.average(x, axis=axis, returned=True),
                                        np.average(a, axis=axis, returned=True)):
                np.testing.assert_allclose(np.asarray(remote), expected, rtol=1e-12)
        row = np.arange(1.0, 6.0)
        result, total = np.average(x, axis=1, weights=client.put(row), returned=True)
        expected, expected_total = np.average(a, axis=1, weights=row, returned=True)
        _close(result, expected)
        _close(total, expected_total)
    i = rng.integers(0, 9, (3, 4)).astype(np.int32)
    _close(np.average(client.put(i), axis=0, weights=client.put(np.arange(1, 4))),
           np.average(i, axis=0, weights=np.arange(1, 4)))
    with pytest.raises(ZeroDivisionError, match="Weights sum to zero"):
        np.average(client.put(i), axis=0, weights=client.put(np.array([1.0, -1.0, 0.0])))
    with pytest.raises(TypeError, match="Axis must be specified"):
        np.average(client.put(i), weights=client.put(np.ones(4)))


def test_diagonal_trace_and_diag(client):
    rng = np.random.default_rng(SEED)
    for shape in ((4, 6), (6, 4), (5, 5)):
        for a, x in _arrays(client, rng, shape):
            for k in (-7, -2, 0, 1, 3, 8):
                _close(np.diagonal(x, k), np.diagonal(a, k))
                _close(np.trace(x, k), np.trace(a, k))
                _close(np.diag(x, k), np.diag(a, k))
            _close(np.diagonal(x, 1, 1, 0), np.diagonal(a, 1, 1, 0))
    v = rng.standard_normal(4).astype(np.float32)
    for k in (-2, 0, 3):
        _close(np.diag(client.put(v), k), np.diag(v, k))
        _close(np.diag(client.put(v)[::-1], k), np.diag(v[::-1], k))


def test_tensordot_inner_vdot_cov_and_corrcoef(client):
    rng = np.random.default_rng(SEED)
    a = rng.standard_normal((3, 4, 5))
    b = rng.standard_normal((4, 5, 2))
    x, y = client.put(a), client.put(b)
    _close(np.tensordot(x, y), np.tensordot(a, b))
    _close(np.tensordot(x[..., :4], y, 1), np.tensordot(a[..., :4], b, 1))
    _close(np.tensordot(x, y, ([1, 2], [0, 1])), np.tensordot(a, b, ([1, 2], [0, 1])))
    _close(np.tensordot(x, y.transpose(2, 1, 0), ([2, 1], [1, 2])),
           np.tensordot(a, b.transpose(2, 1, 0), ([2, 1], [1, 2])))
    _close(np.tensordot(x[0, 0], x[1, 1], 0), np.tensordot(a[0, 0], a[1, 1], 0))
    with pytest.raises(ValueError, match="shape-mismatch for sum"):
        np.tensordot(x, y, ([0], [0]))
    _close(np.inner(x, x[1]), np.inner(a, a[1]))
    _close(np.inner(x[:, 0], x[:, 1].T.T), np.inner(a[:, 0], a[:, 1]))
    _close(np.vdot(x[0], x[1]), np.vdot(a[0], a[1]))
    m = rng.standard_normal((3, 7)).astype(np.float32)
    z = client.put(m)
    for kwargs in ({}, {"bias": True}, {"ddof": 2}, {"rowvar": False}):
        _close(np.cov(z, **kwargs), np.cov(m, **kwargs))
        _close(np.corrcoef(z, rowvar=kwargs.get("rowvar", True)),
               np.corrcoef(m, rowvar=kwargs.get("rowvar", True)))
    _close(np.cov(z[0], z[1]), np.cov(m[0], m[1]))
    _close(np.cov(z[0]), np.cov(m[0]))
    _close(np.corrcoef(z[0], z[2]), np.corrcoef(m[0], m[2]))
    with pytest.raises(TypeError, match="keyword 'aweights' is not supported"):
        np.cov(z, aweights=z[0])


def test_einsum(client):
    rng = np.random.default_rng(SEED)
    a = rng.standard_normal((3, 4))
    b = rng.standard_normal((4, 5))
    c = rng.standard_normal((3, 5))
    t = rng.standard_normal((2, 3, 4))
    i = rng.integers(-50, 50, (3, 4)).astype(np.int32)
    x, y, z, u, j = (client.put(v) for v in (a, b, c, t, i))
    cases = [("ij,jk->ik", (x, y), (a, b)), ("ij,jk", (x, y), (a, b)),
             ("ij,jk->ki", (x, y), (a, b)), ("ij,ij->i", (x, x * 2), (a, a * 2)),
             ("ij,ij->", (x, x), (a, a)), ("ij,ij", (x, x), (a, a)), ("ij->ji", (x,), (a,)),
             ("ij->", (x,), (a,)), ("ij->j", (x.T.T,), (a,)), ("i,j->ij", (x[0], y[1]),
                                                               (a[0], b[1])),
             ("bij,jk->bik", (u, y), (t, b)), ("bij,bij->b", (u, u), (t, t)),
             ("ij,jk,ik->i", (x, y, z), (a, b, c)), ("ii->i", (x[:3, :3],), (a[:3, :3],)),
             ("ii", (x[:, :3].T,), (a[:, :3].T,)), ("ij,kj->ik", (x, x[:2]), (a, a[:2])),
             ("ij,j->i", (j, j[0]), (i, i[0])), ("ij->i", (j,), (i,)),
             ("ji,jk->ik", (x.T, y), (a.T, b))]
    for subscripts, remote, local in cases:
        _close(np.einsum(subscripts, *remote), np.einsum(subscripts, *local))
    # A contraction is one matmul; anything else one fused map-reduce, no temporary.
    assert np.einsum("ij,jk->ik", x, y).base.operation.kind == v1.OPERATION_KIND_MATMUL
    assert np.einsum("ij,ij->i", x, x).operation.kind == v1.OPERATION_KIND_REDUCE
    for subscripts, message in (("ij,jk->il", "output subscript 'l' which never appeared"),
                                ("ij,jk->ii", "output subscript 'i' multiple times"),
                                ("ijk,jk->i", "too many subscripts for operand 0"),
                                ("ij,ij,ij->i", "fewer operands provided")):
        with pytest.raises(ValueError, match=message):
            np.einsum(subscripts, x, y if "jk" in subscripts else x)
    with pytest.raises(TypeError, match="'...' is not supported"):
        np.einsum("...j,jk->...k", x, y)


def test_take_and_host_integer_indexing(client):
    rng = np.random.default_rng(SEED)
    for a, x in _arrays(client, rng, (6, 5)):
        for indices in ([0, 2, 5], [5, 4, 3, 0], [1, 1, 1], [-1, 0, -6], [3], [],
                        np.array([[0, 1], [5, 3]]), list(rng.integers(0, 6, 20))):
            for axis in (0, 1, None):
                if axis == 1:
                    indices = [i % 5 for i in np.ravel(indices)]
                _close(np.take(x, indices, axis=axis), np.take(a, indices, axis=axis))
            _close(x[np.asarray(indices, dtype=np.int64)], a[np.asarray(indices,
                                                                        dtype=np.int64)])
        # Runs of evenly spaced indices are one write each.
        _close(x[[0, 2, 4, 5, 4, 3]], a[[0, 2, 4, 5, 4, 3]])
    remote_indices = client.put(np.arange(2))
    before = {buffer.id for buffer in client.buffers()}
    with pytest.raises(IndexError, match="index 6 is out of bounds for axis 0 with size 6"):
        x[[0, 6]]
    with pytest.raises(IndexError, match="index -7 is out of bounds"):
        np.take(x, [-7], axis=0)
    with pytest.raises(TypeError, match="must be host integers"):
        np.take(x, remote_indices)
    assert {buffer.id for buffer in client.buffers()} <= before


def test_shape_helpers_meshgrid_copy_nan_to_num_and_fix(client):
    rng = np.random.default_rng(SEED)
    scalar, vector, matrix, cube = (rng.standard_normal(s) for s in ((), (3,), (2, 3),
                                                                      (2, 3, 4)))
    remote = [client.put(v) for v in (scalar, vector, matrix, cube)]
    for function in (np.atleast_1d, np.atleast_2d, np.atleast_3d):
        for r, a in zip(remote, (scalar, vector, matrix, cube)):
            _close(function(r), function(a))
        for r, a in zip(function(*remote[1:3]), function(vector, matrix)):
            _close(r, a)
    for r, a in zip(np.broadcast_arrays(remote[1], remote[2][:1].T[:1]),
                    np.broadcast_arrays(vector, matrix[:1].T[:1])):
        _close(r, a)
    x, y = client.put(np.arange(3.0)), client.put(np.arange(4, dtype=np.int32))
    for kwargs in ({}, {"indexing": "ij"}, {"sparse": True}, {"copy": False}):
        for r, a in zip(np.meshgrid(x, y, **kwargs),
                        np.meshgrid(np.arange(3.0), np.arange(4, dtype=np.int32), **kwargs)):
            _close(r, a)
    _close(np.copy(remote[2].T), matrix.T.copy())
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 1.5, -2.5, 1e300])
    for dtype in ("float64", "float32"):
        with np.errstate(over="ignore"):
            values = special.astype(dtype)  # 1e300 is inf in float32
        z = client.put(values)
        _close(np.nan_to_num(z), np.nan_to_num(values))
        _close(np.nan_to_num(z, nan=-1.0, posinf=9.0, neginf=-9.0),
               np.nan_to_num(values, nan=-1.0, posinf=9.0, neginf=-9.0))
        _close(np.fix(z), np.fix(values))
    i = client.put(np.arange(-2, 3, dtype=np.int32))
    _close(np.nan_to_num(i), np.arange(-2, 3, dtype=np.int32))


def test_polyval_trapezoid_gradient(client):
    rng = np.random.default_rng(SEED)
    trapezoid = getattr(np, "trapezoid", None) or np.trapz
    for dtype in ("float64", "float32"):
        for local, remote in _arrays(client, rng, (4, 6), dtype):
            for p in ([2.0, -1.0, 0.5], [3], [1, 0, -2, 1], np.array([0.25, 1.5],
                                                                     np.float32)):
                _close(np.polyval(p, remote), np.polyval(p, local))
            _close(np.polyval(client.put(np.array([1.0, 2.0, -3.0])), remote),
                   np.polyval(np.array([1.0, 2.0, -3.0]), local))
            for axis in (-1, 0):
                _close(trapezoid(remote, axis=axis), trapezoid(local, axis=axis))
                _close(trapezoid(remote, dx=0.5, axis=axis), trapezoid(local, dx=0.5,
                                                                       axis=axis))
            x = np.cumsum(np.abs(rng.standard_normal(6)))
            _close(trapezoid(remote, client.put(x)), trapezoid(local, x))
            _close(trapezoid(remote, client.put(x[:4]), axis=0), trapezoid(local, x[:4],
                                                                            axis=0))
            for remote_grad, local_grad in zip(np.gradient(remote), np.gradient(local)):
                _close(remote_grad, local_grad)
            _close(np.gradient(remote, 0.5, axis=1), np.gradient(local, 0.5, axis=1))
            _close(np.gradient(remote[:2], axis=0), np.gradient(local[:2], axis=0))
    i = rng.integers(-9, 9, 7).astype(np.int32)
    _close(np.gradient(client.put(i)), np.gradient(i))
    _close(np.polyval([2, 1], client.put(i)), np.polyval([2, 1], i))


def test_convolve_correlate_kron_cross(client):
    rng = np.random.default_rng(SEED)
    for n, k in ((9, 3), (8, 4), (5, 5), (3, 7), (6, 1)):
        a = rng.standard_normal(n)
        v = rng.standard_normal(k)
        x, w = client.put(a), client.put(v)
        for mode in ("full", "same", "valid"):
            _close(np.convolve(x, w, mode), np.convolve(a, v, mode))
            _close(np.correlate(x, w, mode), np.correlate(a, v, mode))
        _close(np.convolve(x[::-1], w * 2), np.convolve(a[::-1], v * 2))
    with pytest.raises(ValueError, match="v cannot be empty"):
        np.convolve(client.put(np.ones(3)), client.put(np.ones(0)))
    for sa, sb in (((2, 3), (3, 2)), ((3,), (2,)), ((2, 2), (3,)), ((2, 1, 2), (2, 3))):
        a, b = rng.standard_normal(sa), rng.standard_normal(sb)
        _close(np.kron(client.put(a), client.put(b)), np.kron(a, b))
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    _close(np.cross(client.put(a), client.put(b)), np.cross(a, b))
    _close(np.cross(client.put(a), client.put(b[0])), np.cross(a, b[0]))
    with pytest.raises(TypeError, match="3-vectors only"):
        np.cross(client.put(a[:, :2]), client.put(b[:, :2]))
    with pytest.raises(ValueError, match="dimension must be 2 or 3"):
        np.cross(client.put(a[:1]), client.put(b[:1]).T)


def test_functions_it_cannot_build_still_name_themselves(client):
    x = client.put(np.zeros((2, 2)))
    for key, message in ((x > 0, "a boolean mask's result has a shape"),
                         (np.array([True, False]), "np.where\\(mask, x, 0\\)"),
                         ((slice(None), [0, 1]), "integer arrays index only alone"),
                         (x.astype(np.int64), "integer arrays index only alone")):
        with pytest.raises(IndexError, match=message):
            x[key]
    for function, name in ((np.sort, "numpy.sort"), (np.linalg.solve, "numpy.linalg.solve"),
                           (np.cumsum, "numpy.cumsum"), (np.median, "numpy.median")):
        with pytest.raises(TypeError, match=f"{name} is not supported on remote arrays"):
            function(*((x, x) if function is np.linalg.solve else (x,)))


def test_the_array_api_namespace_has_them_too(client):
    rng = np.random.default_rng(SEED)
    a = rng.standard_normal((3, 4))
    x = client.put(a)
    xp = x.__array_namespace__()
    _close(xp.concat([x, x * 2], axis=1), np.concatenate([a, a * 2], axis=1))
    _close(xp.concat([x, x], axis=None), np.concatenate([a, a], axis=None))
    _close(xp.stack([x, x], axis=-1), np.stack([a, a], axis=-1))
    _close(xp.flip(x, axis=1), np.flip(a, axis=1))
    _close(xp.roll(x, 2, axis=1), np.roll(a, 2, axis=1))
    _close(xp.moveaxis(x, 0, 1), np.moveaxis(a, 0, 1))
    _close(xp.repeat(x, 2, axis=0), np.repeat(a, 2, axis=0))
    _close(xp.tile(x, (2, 2)), np.tile(a, (2, 2)))
    _close(xp.count_nonzero(x > 0, axis=0), np.count_nonzero(a > 0, axis=0))
    _close(xp.tril(x, k=1), np.tril(a, 1))
    _close(xp.triu(x), np.triu(a))
    for r, e in zip(xp.meshgrid(x[0], x[1, :2], indexing="ij"),
                    np.meshgrid(a[0], a[1, :2], indexing="ij")):
        _close(r, e)
