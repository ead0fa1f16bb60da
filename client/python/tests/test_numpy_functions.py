"""NumPy's functions on remote arrays (__array_function__), the reductions and methods,
matmul, the creation functions and the array API namespace, against NumPy on random
shapes from a fixed seed."""

import numpy as np
import pytest

import gpucompute
from gpucompute import _dispatch
from gpucompute.client import Client

SEED = 3117
REDUCTIONS = ["sum", "mean", "prod", "min", "max", "std", "var", "argmin", "argmax", "any",
              "all"]


pytestmark = pytest.mark.usefixtures("nep50")


def _close(actual, expected):
    expected = np.asarray(expected)
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    if expected.dtype.kind == "f":
        rtol = 2e-5 if expected.dtype == np.float32 else 1e-11
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol)
    else:
        np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("kind", REDUCTIONS)
def test_reductions_with_axis_and_keepdims(client, kind):
    rng = np.random.default_rng(SEED)
    for dtype in ("float64", "float32", "int32"):
        shape = tuple(int(n) for n in rng.integers(1, 5, 3))
        a = (rng.standard_normal(shape) * 3).astype(dtype)
        if kind == "prod":
            a = (np.sign(a) + (a == 0)).astype(dtype)  # no overflow, exact
        x = client.put(a)
        function = getattr(np, kind)
        axes = [None, 0, -1] + ([] if kind.startswith("arg") else [(0, 2), ()])
        for axis in axes:
            for keepdims in (False, True):
                _close(function(x, axis=axis, keepdims=keepdims),
                       function(a, axis=axis, keepdims=keepdims))
        _close(getattr(x, kind)(axis=1), getattr(a, kind)(axis=1))
        # A reduction of a non-contiguous view, and of a pending expression.
        _close(function(x[:, ::-2].T, axis=0), function(a[:, ::-2].T, axis=0))
        if kind not in ("any", "all") and dtype != "int32":
            _close(function(x * 2 - 1, axis=-1), function(a * 2 - 1, axis=-1))


def test_reductions_take_dtype_and_out(client):
    rng = np.random.default_rng(SEED)
    a = rng.standard_normal((4, 5)) * 1e3
    i = rng.integers(-2**31, 2**31 - 1, (4, 5)).astype(np.int32)
    x, j = client.put(a), client.put(i)
    for kind in ("sum", "mean", "prod", "std", "var"):
        function = getattr(np, kind)
        source, remote = (i, j) if kind == "sum" else (a[:, :3] / 1e3, x[:, :3] / 1e3)
        integer = (np.int64,) if kind in ("sum", "mean", "prod") else ()
        for dtype in (np.float32, np.float64) + integer:
            for axis in (None, 1):
                expected = function(source, axis=axis, dtype=dtype)
                _close(function(remote, axis=axis, dtype=dtype), expected)
    # An int32 sum in int32 wraps as NumPy's does.
    _close(np.sum(j, axis=0, dtype=np.int32), np.sum(i, axis=0, dtype=np.int32))
    _close(x.sum(axis=0, dtype=np.float32), a.sum(axis=0, dtype=np.float32))
    # out: written, and returned.
    for kind in REDUCTIONS:
        expected = getattr(np, kind)(a, axis=1)
        out = client.put(np.zeros(4, expected.dtype))
        assert getattr(np, kind)(x, axis=1, out=out) is out
        _close(out, expected)
    out = client.put(np.zeros((1, 5)))
    np.max(x, axis=0, keepdims=True, out=out)
    _close(out, a.max(axis=0, keepdims=True))
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        np.var(x, dtype=np.int64)
    with pytest.raises(ValueError, match="non-broadcastable output operand"):
        np.sum(x, axis=0, out=client.put(np.zeros(4)))


def test_std_and_var_take_ddof(client):
    a = np.random.default_rng(SEED).standard_normal((5, 6))
    x = client.put(a)
    _close(np.std(x, axis=0, ddof=1), np.std(a, axis=0, ddof=1))
    _close(x.var(ddof=2), a.var(ddof=2))


def test_where_clip_round_dot_matmul(client):
    rng = np.random.default_rng(SEED)
    a, b = rng.standard_normal((4, 5)), rng.standard_normal((5, 3))
    x, y = client.put(a), client.put(b)
    _close(np.where(x > 0, x, -1.0), np.where(a > 0, a, -1.0))
    _close(np.where(x > 0, 1.0, 0.0), np.where(a > 0, 1.0, 0.0))
    _close(np.clip(x, -0.5, 0.5), np.clip(a, -0.5, 0.5))
    _close(np.clip(x, None, 0.5), np.clip(a, None, 0.5))
    _close(np.round(x * 100, 1), np.round(a * 100, 1))
    _close(np.round(x * 100, -1), np.round(a * 100, -1))
    _close(np.around(x), np.around(a))
    _close(np.dot(x, y), np.dot(a, b))
    _close(np.matmul(x, y), np.matmul(a, b))
    _close(x @ y, a @ b)
    _close(x.T[:3] @ x[:, 0], a.T[:3] @ a[:, 0])
    _close(np.dot(x[0], x[1]), np.dot(a[0], a[1]))
    _close((x.astype(np.float32) @ y.astype(np.float32)), a.astype(np.float32) @ b.astype(
        np.float32))
    batch = rng.standard_normal((2, 3, 4))
    _close(client.put(batch) @ x, batch @ a)


def test_shape_functions_make_views(client):
    a = np.arange(24.0).reshape(2, 3, 4)
    x = client.put(a)
    for function, args in [(np.transpose, ()), (np.transpose, ((1, 0, 2),)),
                           (np.reshape, ((4, 6),)), (np.reshape, ((-1,),)),
                           (np.expand_dims, (1,)), (np.broadcast_to, ((5, 2, 3, 4),))]:
        view = function(x, *args)
        assert isinstance(view, gpucompute.View)
        _close(view, function(a, *args))
    _close(np.squeeze(x[:, :1]), np.squeeze(a[:, :1]))
    _close(x.T, a.T)
    assert (x.shape, x.ndim, x.size, x.nbytes, x.dtype) == (a.shape, 3, 24, 192, a.dtype)


def test_astype_and_copy(client):
    a = np.linspace(-3, 3, 13)
    x = client.put(a)
    _close(x.astype(np.int32), a.astype(np.int32))
    _close(x.astype("float32"), a.astype(np.float32))
    _close((x > 0).astype(np.int64), (a > 0).astype(np.int64))
    copy = x.copy()
    x += 1
    _close(copy, a)
    assert x.astype(np.float64, copy=False) is x
    with pytest.raises(TypeError, match="gpucompute has no complex128 arrays"):
        x.astype(np.complex128)


def test_creation_functions_upload_nothing(client, monkeypatch):
    uploads = []
    original = Client.put
    monkeypatch.setattr(Client, "put", lambda self, *a, **k: uploads.append(a) or original(
        self, *a, **k))
    _close(gpucompute.zeros((2, 3), client=client), np.zeros((2, 3)))
    _close(client.ones(4, dtype=np.int32), np.ones(4, np.int32))
    _close(gpucompute.full((3,), 2.5, client=client), np.full((3,), 2.5))
    _close(gpucompute.full((3,), 7, client=client), np.full((3,), 7))
    _close(gpucompute.empty((2, 2), client=client).shape, (2, 2))
    x = client.put(np.ones((2, 5), np.float32))
    uploads.clear()
    _close(gpucompute.zeros_like(x), np.zeros((2, 5), np.float32))
    _close(gpucompute.ones_like(x, dtype=np.int64), np.ones((2, 5), np.int64))
    _close(gpucompute.full_like(x, 3), np.full((2, 5), 3, np.float32))
    _close(client.arange(3, 50, 7), np.arange(3, 50, 7))
    _close(client.linspace(0, 1, 11), np.linspace(0, 1, 11))
    _close(client.eye(3), np.eye(3))
    _close(gpucompute.eye(3, 5, k=1, dtype=np.int32, client=client), np.eye(3, 5, k=1,
                                                                       dtype=np.int32))
    _close(gpucompute.array_api.eye(4, 2, k=-1, device=client), np.eye(4, 2, k=-1))
    assert uploads == []  # arange, linspace and eye: one index() expression each


@pytest.mark.parametrize("args", [(10,), (2, 11), (0.5, 3, 0.25), (5, -5, -2), (1, 2, 0.1),
                                  (0,), (7, 3)])
def test_arange_matches_numpy(client, args):
    _close(client.arange(*args), np.arange(*args))


@pytest.mark.parametrize("args", [(0, 1, 5), (-2.5, 7, 100), (1, 1, 3), (0, 1, 1),
                                  (0, 10, 7, False), (3, -3, 4)])
def test_linspace_matches_numpy_exactly(client, args):
    np.testing.assert_array_equal(np.asarray(client.linspace(*args)), np.linspace(*args))
    _close(gpucompute.linspace(0, 9, 10, dtype=np.int32, client=client),
           np.linspace(0, 9, 10, dtype=np.int32))


def test_random_family_is_reproducible(client):
    a = gpucompute.random((1000,), seed=5, client=client).get()
    assert a.min() >= 0 and a.max() < 1 and abs(a.mean() - 0.5) < 0.05
    np.testing.assert_array_equal(a, gpucompute.random(1000, seed=5, client=client).get())
    gpucompute.seed(9, client=client)
    first = [gpucompute.rand(3, 4, client=client).get(), client.randn(10).get()]
    gpucompute.seed(9, client=client)
    again = [gpucompute.rand(3, 4, client=client).get(), client.randn(10).get()]
    for one, other in zip(first, again):
        np.testing.assert_array_equal(one, other)
    assert not np.array_equal(first[0].ravel()[:10], first[1])
    n = client.normal(2.0, 0.5, (4000,), seed=1).get()
    assert abs(n.mean() - 2.0) < 0.05 and abs(n.std() - 0.5) < 0.05
    u = client.uniform(-2, 2, (1000,), seed=1).get()
    assert u.min() >= -2 and u.max() < 2
    i = client.integers(3, 9, (1000,), seed=1).get()
    assert i.dtype == np.int64 and i.min() == 3 and i.max() == 8


def test_array_api_namespace(client):
    a = np.random.default_rng(SEED).standard_normal((3, 4))
    x = client.put(a)
    xp = x.__array_namespace__()
    assert xp is gpucompute.array_api and xp.__array_api_version__ == "2023.12"
    _close(xp.sin(x), np.sin(a))
    _close(xp.atan2(x, xp.abs(x) + 1), np.arctan2(a, np.abs(a) + 1))
    _close(xp.pow(x, 2), a ** 2)
    _close(xp.sum(x, axis=1, keepdims=True), a.sum(axis=1, keepdims=True))
    _close(xp.var(x, correction=1), a.var(ddof=1))
    _close(xp.permute_dims(x, (1, 0)), a.T)
    _close(xp.matrix_transpose(x), a.T)
    _close(xp.matmul(x, xp.matrix_transpose(x)), a @ a.T)
    _close(xp.vecdot(x, x), (a * a).sum(axis=-1))
    _close(xp.argmax(x, axis=0), a.argmax(axis=0))
    _close(xp.where(x > 0, x, 0.0), np.where(a > 0, a, 0.0))
    _close(xp.any(x > 2), np.any(a > 2))
    _close(xp.reshape(x, (2, 6)), a.reshape(2, 6))
    _close(xp.arange(5, device=client), np.arange(5))
    _close(xp.zeros((2,), dtype=xp.int32, device=client), np.zeros(2, np.int32))
    assert xp.result_type(x, xp.float32) == np.float64
    assert xp.isdtype(xp.int32, "integral") and not xp.isdtype(xp.float32, "integral")
    with pytest.raises(NotImplementedError, match="array_api.cumulative_sum is not supported"):
        xp.cumulative_sum(x)


def test_dispatch_gives_ids_before_results(client):
    x = client.put(np.arange(5.0))
    request = gpucompute._requests.elementwise_request("x + 1", {"x": x})
    pending = _dispatch.submit(client, request)
    assert pending.ref.startswith("tag:")  # a reference at once, in the session
    assert pending.buffer_id().startswith("buf-")
    following = _dispatch.submit(client, gpucompute._requests.elementwise_request(
        "y * 2", {"y": pending.ref}))
    assert following.result().state == gpucompute.v1.Operation.STATE_SUCCEEDED
    np.testing.assert_array_equal(client.download(following.buffer_id()),
                                  (np.arange(5.0) + 1) * 2)
    # What the server refuses raises at the result, naming the problem.
    failing = _dispatch.submit(client, gpucompute._requests.elementwise_request(
        "log(x)", {"x": x}, out=client.put(np.zeros(5, np.int32))))
    with pytest.raises(gpucompute.InvalidArgumentError,
                       match="the result is float64 and cannot be written as int32"):
        failing.result()
