"""Reductions over random axis sets, with keepdims and ddof, of buffers, views and
expressions, against NumPy's: values, shapes and result dtypes. A fixed seed and a
bounded count."""

import numpy as np
import pytest

import gpucompute

# N - ddof <= 0 divides by 0 as NumPy does (inf or NaN); NumPy's warning about it is
# expected of the oracle.
pytestmark = pytest.mark.filterwarnings("ignore:Degrees of freedom:RuntimeWarning",
                                        "ignore:invalid value:RuntimeWarning")

SEED = 20240612
CASES = 80
KINDS = ("sum", "prod", "min", "max", "mean", "var", "std", "any", "all")


def _numpy_reduce(kind, host, axis, keepdims, ddof):
    if kind == "norm2":
        return np.sqrt(np.sum(host * host, axis=axis, keepdims=keepdims))
    function = getattr(np, kind)
    if kind in ("var", "std"):
        return function(host, axis=axis, keepdims=keepdims, ddof=ddof)
    return function(host, axis=axis, keepdims=keepdims)


def _random_axis(rng, ndim):
    """None, one axis (an int, maybe negative), or a tuple of distinct axes in any order
    (maybe empty)."""
    choice = rng.random()
    if choice < 0.15 or ndim == 0:
        return None if ndim == 0 or rng.random() < 0.5 else ()
    if choice < 0.4:
        return int(rng.integers(-ndim, ndim))
    count = int(rng.integers(1, ndim + 1))
    axes = rng.choice(ndim, count, replace=False)
    return tuple(int(axis) - (ndim if rng.random() < 0.3 else 0) for axis in axes)


def _check(result, expected, kind, context):
    expected = np.asarray(expected)
    got = result.get()
    assert got.shape == expected.shape, context
    assert got.dtype == expected.dtype, context
    if kind in ("any", "all", "min", "max"):
        np.testing.assert_array_equal(got, expected, err_msg=str(context))
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12, err_msg=str(context))
    if expected.size <= 4096:
        np.testing.assert_allclose(np.asarray(result.value, dtype=got.dtype), got,
                                   rtol=0, atol=0)


def test_random_axes_keepdims_and_ddof_against_numpy(client):
    rng = np.random.default_rng(SEED)
    for case in range(CASES):
        ndim = int(rng.integers(0, 5))
        shape = tuple(int(rng.integers(1, 6)) for _ in range(ndim))
        kind = str(rng.choice(KINDS))
        host = rng.uniform(0.5, 1.5, shape)
        if kind in ("any", "all"):
            host = np.where(rng.random(shape) < 0.2, 0.0, host)
        x = client.put(host)
        axis = _random_axis(rng, ndim)
        keepdims = bool(rng.random() < 0.5)
        ddof = int(rng.integers(0, 2)) if kind in ("var", "std") else 0
        context = (case, kind, shape, axis, keepdims, ddof)
        result = client.reduce(kind, x, axis, keepdims=keepdims, ddof=ddof)
        _check(result, _numpy_reduce(kind, host, axis, keepdims, ddof), kind, context)
        for handle in (x, result):
            handle.delete()


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool", "float32"])
def test_result_dtypes_follow_numpy(client, dtype):
    rng = np.random.default_rng(SEED + 1)
    host = rng.integers(0, 3, (3, 4, 5)).astype(dtype)
    x = client.put(host)
    for kind in KINDS:
        if kind in ("min", "max", "prod") and dtype == "bool":
            continue
        expected = _numpy_reduce(kind, host, (0, 2), False, 0)
        if dtype == "float32" and kind in ("var", "std", "mean", "sum", "prod"):
            got = client.reduce(kind, x, (0, 2)).get()
            assert got.dtype == expected.dtype, kind
            np.testing.assert_allclose(got, expected, rtol=1e-5)
            continue
        _check(client.reduce(kind, x, (0, 2)), expected, kind, (dtype, kind))


def test_argmin_and_argmax_along_one_axis_of_n_d(client):
    rng = np.random.default_rng(SEED + 2)
    host = rng.integers(0, 4, (3, 4, 5)).astype(np.float64)  # ties: the first one wins
    x = client.put(host)
    for kind in ("argmin", "argmax"):
        for axis in (None, 0, 1, 2, -1):
            expected = getattr(np, kind)(host, axis=axis)
            got = client.reduce(kind, x, axis).get()
            assert got.dtype == np.int64
            np.testing.assert_array_equal(got, expected, err_msg=f"{kind} {axis}")


def test_reductions_of_views(client):
    rng = np.random.default_rng(SEED + 3)
    host = rng.uniform(-2, 2, (6, 5, 4))
    x = client.put(host)
    views = [
        (x[::2], host[::2]),
        (x.T, host.T),
        (x[..., ::-1], host[..., ::-1]),
        (x[1:5, None, ::3].transpose(3, 1, 0, 2), host[1:5, None, ::3].transpose(3, 1, 0, 2)),
        (x[2].broadcast_to(3, 5, 4), np.broadcast_to(host[2], (3, 5, 4))),
        (x.reshape(30, 4)[::7], host.reshape(30, 4)[::7]),
    ]
    for case, (view, view_host) in enumerate(views):
        for _ in range(4):
            kind = str(rng.choice(KINDS[:7]))
            axis = _random_axis(rng, view_host.ndim)
            keepdims = bool(rng.random() < 0.5)
            ddof = 1 if kind in ("var", "std") else 0
            _check(client.reduce(kind, view, axis, keepdims=keepdims, ddof=ddof),
                   _numpy_reduce(kind, view_host, axis, keepdims, ddof), kind,
                   (case, kind, axis, keepdims))


def test_reductions_of_expressions_in_one_pass(client):
    rng = np.random.default_rng(SEED + 4)
    x_host = rng.uniform(-1, 1, (64, 48))
    y_host = rng.uniform(-1, 1, (64, 48))
    x, y = client.put(x_host), client.put(y_host)

    dot = client.reduce("sum", "x*y", x=x, y=y)
    np.testing.assert_allclose(dot.value, np.sum(x_host * y_host), rtol=1e-12)

    m_host = x_host.mean(axis=1, keepdims=True)
    m = client.put(m_host)
    spread = client.reduce("sum", "(x - m)**2", axis=1, x=x, m=m)
    np.testing.assert_allclose(spread.get(), np.sum((x_host - m_host) ** 2, axis=1), rtol=1e-12)

    inside = client.reduce("mean", "where(x*x + y*y <= 1, 1, 0)", x=x, y=y)
    assert inside.value == np.mean(np.where(x_host**2 + y_host**2 <= 1, 1, 0))

    error = client.reduce("max", "abs(a - b)", inputs={"a": x, "b": y[::-1]})
    assert error.value == np.max(np.abs(x_host - y_host[::-1]))

    # Views and broadcasting inside the expression, over an axis set with keepdims.
    fused = client.reduce("var", "x * r", axis=(0,), keepdims=True, ddof=1, x=x.T,
                          r=y[0, None].T)
    np.testing.assert_allclose(fused.get(),
                               np.var(x_host.T * y_host[0, None].T, axis=(0,), keepdims=True,
                                      ddof=1), rtol=1e-12)


def test_bad_axes_are_refused_and_create_nothing(client):
    x = client.put(np.zeros((3, 4)))
    before = {buffer.id for buffer in client.buffers()}
    for axis in ((0, 0), (1, -1), (2,), (-3,)):
        with pytest.raises(gpucompute.InvalidArgumentError):
            client.reduce("sum", x, axis, name="never")
    with pytest.raises(gpucompute.InvalidArgumentError):
        client.reduce("argmax", x, (0, 1), name="never")
    with pytest.raises(ValueError, match="unknown reduction"):
        client.reduce("median", x)
    assert {buffer.id for buffer in client.buffers()} == before
