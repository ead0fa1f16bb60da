"""Operations against NumPy, with float64 references."""

import numpy as np
import pytest

N = 10_001  # not a multiple of any vector width or thread count


@pytest.fixture
def xs():
    rng = np.random.default_rng(1)
    return rng.uniform(-3, 3, N), rng.uniform(-3, 3, N)


def test_eval_scalar_times_array_plus_one(client, xs):
    x_host, _ = xs
    x = client.put(x_host, name="x")
    y = client.eval("a*x + 1", a=2.0, x=x)
    assert (y.shape, y.dtype) == ((N,), np.float64)
    np.testing.assert_allclose(y.get(), 2.0 * x_host + 1, rtol=1e-15, atol=0)
    timing = y.timing
    assert timing is not None and timing.device_seconds > 0
    assert (timing.bytes_read, timing.bytes_written) == (x.nbytes, y.nbytes)
    assert y.operation.done


def test_eval_reference_expression_against_float64(client, xs):
    x_host, _ = xs
    x = client.put(x_host.astype(np.float32))
    expr = "sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x))))"
    y = client.eval(expr, x=x)
    assert y.dtype == np.float32
    xd = x_host.astype(np.float32).astype(np.float64)
    reference = np.sqrt(np.abs(np.exp(-np.sin(xd * xd)) / (np.sqrt(np.abs(xd)) * np.tanh(xd))))
    np.testing.assert_allclose(y.get(), reference, rtol=2e-6)


def test_eval_by_name_with_buffers_and_inputs_mapping(client, xs):
    x_host, y_host = xs
    client.put(x_host, name="x")
    client.put(y_host, name="y")
    # "name" and "out" are keywords of eval(): such variables go in the mapping.
    z = client.eval("where(x > name, x, name*2) - y", {"name": 0.5}, x="x", y="y", name="z")
    assert z.name == "z"
    np.testing.assert_allclose(z.get(), np.where(x_host > 0.5, x_host, 1.0) - y_host, rtol=1e-15)


def test_eval_follows_numpy_2_promotion(client):
    i = client.put(np.arange(5, dtype=np.int32))
    f = client.put(np.linspace(0, 1, 5).astype(np.float32))
    assert client.eval("i + f", i=i, f=f).dtype == np.float64  # int32 + float32
    assert client.eval("i * 3", i=i).dtype == np.int32  # weak scalar
    assert client.eval("i / 2", i=i).dtype == np.float64  # true division
    cmp = client.eval("f < 0.5", f=f)
    assert cmp.dtype == np.bool_
    np.testing.assert_array_equal(cmp.get(), np.linspace(0, 1, 5).astype(np.float32) < 0.5)


def test_eval_into_out_and_dtype(client, xs):
    x_host, _ = xs
    x = client.put(x_host)
    y = client.eval("x*x", x=x, dtype="float32")
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.get(), (x_host * x_host).astype(np.float32), rtol=1e-7)
    z = client.eval("x + 1", x=x, out=x)
    assert z.id == x.id
    np.testing.assert_allclose(x.get(), x_host + 1, rtol=1e-15)


@pytest.mark.parametrize("kind", ["sum", "prod", "min", "max", "mean", "norm2", "argmin",
                                  "argmax"])
def test_reduce_whole_array(client, kind):
    # Near 1, so that the float32 product neither overflows nor underflows.
    host = np.random.default_rng(2).uniform(0.99, 1.01, N)
    reference = {
        "sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max, "mean": np.mean,
        "norm2": np.linalg.norm, "argmin": np.argmin, "argmax": np.argmax,
    }[kind](host)
    x = client.put(host.astype(np.float32))
    r = client.reduce(kind, x)
    assert r.shape == ()
    assert r.dtype == (np.int64 if kind.startswith("arg") else np.float32)
    if kind.startswith("arg"):
        # float32 rounding could tie values float64 keeps apart; the picked one matches.
        assert host.astype(np.float32)[r.value] == host.astype(np.float32)[reference]
    else:
        np.testing.assert_allclose(r.value, reference, rtol=1e-5)
    assert r.get()[()] == r.value


def test_reduce_integers_and_axes(client):
    host = np.random.default_rng(3).integers(-1000, 1000, size=(37, 53), dtype=np.int32)
    x = client.put(host)
    total = client.reduce("sum", x)
    assert total.dtype == np.int64 and total.value == host.sum(dtype=np.int64)
    for axis in (0, 1, -1):
        along = client.reduce("max", x, axis=axis)
        np.testing.assert_array_equal(along.value, host.max(axis=axis))
        np.testing.assert_array_equal(along.get(), host.max(axis=axis))
    means = client.reduce("mean", x, axis=0)
    assert means.dtype == np.float64
    np.testing.assert_allclose(means.get(), host.mean(axis=0, dtype=np.float64), rtol=1e-14)


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("transpose", [False, True])
def test_gemv(client, order, transpose):
    rng = np.random.default_rng(4)
    a_host = np.asarray(rng.standard_normal((67, 45)), order=order)
    x_host = rng.standard_normal(67 if transpose else 45)
    a = client.put(a_host)
    assert a.layout == order
    x = client.put(x_host)
    y = client.gemv(a, x, transpose=transpose)
    op = a_host.T if transpose else a_host
    np.testing.assert_allclose(y.get(), op @ x_host, rtol=1e-12, atol=1e-12)

    y0_host = rng.standard_normal(y.shape[0])
    y0 = client.put(y0_host)
    out = client.gemv(a, x, y0, transpose=transpose, alpha=0.5, beta=-2.0)
    assert out.id == y0.id
    np.testing.assert_allclose(y0.get(), 0.5 * (op @ x_host) - 2.0 * y0_host, rtol=1e-12,
                               atol=1e-12)


def test_rand_normal_is_reproducible_and_continues(client):
    a = client.rand.normal((1000,), "float64", seed=7)
    b = client.rand.normal((1000,), "float64", seed=7)
    c = client.rand.normal((1000,), "float64", seed=8)
    a_host = a.get()
    np.testing.assert_array_equal(a_host, b.get())
    assert not np.array_equal(a_host, c.get())
    # float64 normals take 2 per counter: two halves continue one sequence.
    first = client.rand.normal((500,), "float64", seed=7)
    second = client.rand.normal((500,), "float64", seed=7,
                                offset=first.operation.next_offset)
    np.testing.assert_array_equal(np.concatenate([first.get(), second.get()]), a_host)

    big = client.rand.normal((200, 500), np.float32, seed=1, mean=3.0, stddev=2.0)
    assert (big.shape, big.dtype) == ((200, 500), np.float32)
    values = big.get().astype(np.float64)
    assert abs(values.mean() - 3.0) < 0.05 and abs(values.std() - 2.0) < 0.05


def test_rand_normal_defaults_to_v2_and_can_ask_for_v3_and_v1(client):
    default = client.rand.normal((256,), "float32", seed=11).get()
    v3 = client.rand.normal((256,), "float32", seed=11, transform="v3").get()
    v2 = client.rand.normal((256,), "float32", seed=11, transform="v2").get()
    v1 = client.rand.normal((256,), "float32", seed=11, transform="v1").get()
    np.testing.assert_array_equal(default, v2)
    # float64 v3 is v2's values
    np.testing.assert_array_equal(client.rand.normal((64,), "float64", seed=3, transform="v3").get(),
                                  client.rand.normal((64,), "float64", seed=3).get())
    # v3 is a different transform of the same words; v1 and v2 are both Box-Muller, to
    # float32 rounding apart from the last bits of the math.
    assert np.count_nonzero(v3 == v2) < 8
    assert not np.array_equal(v1, v2)
    np.testing.assert_allclose(v1, v2, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="transform must be 'v1', 'v2' or 'v3'"):
        client.rand.normal((4,), "float32", transform="v4")


def test_rand_uniform_and_integers(client):
    u = client.rand.uniform(50_000, "float32", seed=3).get()
    assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1
    assert abs(u.astype(np.float64).mean() - 0.5) < 0.01
    i = client.rand.integers((100, 100), -5, 5, "int32", seed=3)
    values = i.get()
    assert values.dtype == np.int32
    assert set(np.unique(values)) == set(range(-5, 5))


def test_rand_into_existing_buffer(client):
    x = client.create((64,), "float64", fill=0.0)
    filled = client.rand.uniform(None, out=x, seed=5)
    assert filled.id == x.id
    np.testing.assert_array_equal(x.get(), client.rand.uniform(64, seed=5).get())
