"""Python's operators and NumPy's ufuncs on remote arrays, against NumPy (under NEP 50
promotion, as the server has it) on random shapes from a fixed seed: broadcasting,
non-contiguous views, Python and NumPy scalars, in-place forms and out=."""

import numpy as np
import pytest

import gpucompute
from gpucompute import _dispatch, _ufuncs
from gpucompute.client import Client

RNG_SEED = 31


pytestmark = pytest.mark.usefixtures("nep50")


def _values(rng, shape, dtype):
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(shape) * 3).astype(dtype)
    if np.dtype(dtype).kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(-20, 20, shape).astype(dtype)


def _shapes(rng):
    """Two shapes that broadcast, of 0 to 3 dimensions."""
    ndim = int(rng.integers(0, 4))
    a = [int(rng.integers(1, 5)) for _ in range(ndim)]
    b = list(a[int(rng.integers(0, ndim + 1)):])
    for i in range(len(b)):
        if rng.random() < 0.3:
            b[i] = 1
    return (tuple(b), tuple(a)) if rng.random() < 0.5 else (tuple(a), tuple(b))


def _close(actual, expected, dtype=None):
    expected = np.asarray(expected)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape
    if expected.dtype.kind == "f":
        rtol = 1e-5 if expected.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol, equal_nan=True)
    else:
        np.testing.assert_array_equal(actual, expected)


BINARY_OPERATORS = ["__add__", "__sub__", "__mul__", "__truediv__", "__floordiv__", "__mod__",
                    "__pow__", "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"]
BITWISE_OPERATORS = ["__and__", "__or__", "__xor__", "__lshift__", "__rshift__"]


def _operand_values(rng, op, shape, dtype):
    values = _values(rng, shape, dtype)
    if op in ("__floordiv__", "__mod__", "floor_divide", "remainder", "fmod") \
            and values.dtype.kind == "i":
        values[values == 0] = 3
    if op in ("__pow__", "power"):
        values = np.abs(values) % 4 if values.dtype.kind == "i" else np.abs(values)
    if op in ("__lshift__", "__rshift__", "left_shift", "right_shift"):
        values = np.abs(values) % 8
    return values


@pytest.mark.parametrize("dtypes", [("float32", "float32"), ("float64", "float32"),
                                    ("int32", "int64"), ("int32", "float32")])
@pytest.mark.parametrize("op", BINARY_OPERATORS)
def test_binary_operators_broadcast_as_numpy(client, op, dtypes):
    rng = np.random.default_rng(RNG_SEED)
    for _ in range(3):
        sa, sb = _shapes(rng)
        a = _values(rng, sa, dtypes[0])
        b = _operand_values(rng, op, sb, dtypes[1])
        ra, rb = client.put(a), client.put(b)
        # NumPy 1.24's ** takes a fast path for 0-d exponents that skips promotion.
        expected = np.power(a, b) if op == "__pow__" else getattr(a, op)(b)
        _close(np.asarray(getattr(ra, op)(rb)), expected)


@pytest.mark.parametrize("op", BITWISE_OPERATORS)
def test_bitwise_operators_on_integers(client, op):
    rng = np.random.default_rng(RNG_SEED)
    sa, sb = _shapes(rng)
    a, b = _values(rng, sa, "int32"), _operand_values(rng, op, sb, "int64")
    _close(np.asarray(getattr(client.put(a), op)(client.put(b))), getattr(a, op)(b))


@pytest.mark.parametrize("scalar", [2, -3, 2.5, True, np.float64(1.5), np.float32(0.5),
                                    np.int32(3), np.int64(-2), float("nan"), -float("inf"),
                                    np.float32("inf"), 1e300])
@pytest.mark.parametrize("dtype", ["float32", "int32", "float64", "int64"])
def test_scalars_promote_under_nep50(client, dtype, scalar):
    rng = np.random.default_rng(RNG_SEED)
    a = _values(rng, (3, 4), dtype)
    x = client.put(a)
    for op in ("__add__", "__radd__", "__mul__", "__rsub__", "__gt__", "__truediv__"):
        _close(np.asarray(getattr(x, op)(scalar)), getattr(a, op)(scalar))


def test_unary_operators(client):
    a = _values(np.random.default_rng(RNG_SEED), (4, 3), "float32")
    i = _values(np.random.default_rng(RNG_SEED), (4, 3), "int64")
    x, y = client.put(a), client.put(i)
    _close(np.asarray(-x), -a)
    _close(np.asarray(+x), +a)
    _close(np.asarray(abs(x)), abs(a))
    _close(np.asarray(~y), ~i)
    _close(np.asarray(~(x > 0)), ~(a > 0))


def _ufunc_dtypes(name):
    rule = _ufuncs.UFUNCS[name][2]
    if rule in ("bits", "shift"):
        return ["int32", "int64"]
    if name in ("logical_not", "logical_and", "logical_or", "logical_xor"):
        return ["bool", "float32"]
    return ["float32", "float64", "int32"]


UFUNC_NAMES = sorted(name for name in _ufuncs.UFUNCS
                     if hasattr(np, name) and isinstance(getattr(np, name), np.ufunc))


@pytest.mark.parametrize("name", UFUNC_NAMES)
def test_every_ufunc_matches_numpy(client, name):
    rng = np.random.default_rng(RNG_SEED)
    ufunc = getattr(np, name)
    for dtype in _ufunc_dtypes(name):
        if dtype == "int32" and _ufuncs.UFUNCS[name][2] in ("float",) and ufunc.nin == 1 \
                and name in ("arccosh",):
            continue
        sa, sb = _shapes(rng)
        args = [_operand_values(rng, name, sa, dtype)]
        if ufunc.nin == 2:
            args.append(_operand_values(rng, name, sb, dtype))
        remote = [client.put(arg) for arg in args]
        with np.errstate(all="ignore"):
            expected = ufunc(*args)
        if name in ("floor", "ceil", "trunc") and expected.dtype.kind == "i":
            # The server's rule (docs/expressions.md): float64, as NumPy before 2.3.
            expected = expected.astype(np.float64)
        _close(np.asarray(ufunc(*remote)), expected)


def test_ufuncs_with_scalars_and_out(client):
    rng = np.random.default_rng(RNG_SEED)
    a, b = _values(rng, (5, 4), "float64"), _values(rng, (4,), "float64")
    x, y = client.put(a), client.put(b)
    _close(np.asarray(np.maximum(x, 0)), np.maximum(a, 0))
    z = client.put(np.zeros((5, 4)))
    assert np.add(x, y, out=z) is z
    _close(z.get(), a + b)
    np.multiply(y, 2.0, out=z)  # a result broadcast into out, as NumPy does
    _close(z.get(), np.broadcast_to(b * 2.0, (5, 4)))
    with pytest.raises(TypeError, match="Cannot cast ufunc 'add' output from float64 to int32"):
        np.add(x, 1, out=client.put(np.zeros((5, 4), np.int32)))


def test_in_place_operators_write_through(client):
    rng = np.random.default_rng(RNG_SEED)
    a = _values(rng, (4, 6), "float32")
    x = client.put(a)
    handle_id = x.id
    x += 1
    x *= 2.0
    x[:, ::2] -= 3  # a non-contiguous view, written through
    x[1] = 0.5
    expected = (a + 1) * 2
    expected[:, ::2] -= 3
    expected[1] = 0.5
    assert x.id == handle_id
    _close(x.get(), expected)
    i = client.put(np.arange(12, dtype=np.int64).reshape(3, 4))
    i //= 2
    i <<= 1
    i %= 5
    _close(i.get(), ((np.arange(12).reshape(3, 4) // 2) << 1) % 5)


def test_operators_on_non_contiguous_views(client):
    rng = np.random.default_rng(RNG_SEED)
    a = _values(rng, (6, 8), "float64")
    x = client.put(a)
    _close(np.asarray(x[::2, 1::3] * x.T[1::3, ::2].T), a[::2, 1::3] * a.T[1::3, ::2].T)
    _close(np.asarray(np.sin(x.T[::-1]) + x[:, 0]), np.sin(a.T[::-1]) + a[:, 0])
    _close(np.asarray(x.reshape(4, 12)[:, None, 2] - 1), a.reshape(4, 12)[:, None, 2] - 1)


def test_errors_at_the_line(client):
    x = client.put(np.ones((3, 4), np.float32))
    y = client.put(np.ones((5,), np.float32))
    with pytest.raises(ValueError, match=r"add: operands could not be broadcast together "
                                         r"with shapes \(3, 4\) \(5,\)"):
        x + y
    with pytest.raises(TypeError, match="ufunc 'bitwise_and' not supported for the input "
                                        "types"):
        x & 1
    with pytest.raises(TypeError, match="ufunc 'add' of a bool array"):
        (x > 0) + 1
    with pytest.raises(TypeError, match="host data cannot be combined with a remote array"):
        x + np.ones((3, 4))
    with pytest.raises(OverflowError, match="does not fit int64"):
        x + 2**70
    with pytest.raises(TypeError, match="ufunc 'logaddexp' is not supported on remote arrays"):
        np.logaddexp(x, x)
    with pytest.raises(TypeError, match="ufunc 'add': keyword 'where' is not supported"):
        np.add(x, x, where=True)
    assert (x == None) is False  # noqa: E711 (Python's default for foreign operands)


def test_float_int_bool_of_one_element(client):
    a = np.arange(12, dtype=np.float64).reshape(3, 4) / 4
    x = client.put(a)
    element = x[1, 2]
    assert element.shape == ()
    assert float(element) == a[1, 2]
    assert int(x[2, 3] * 4) == 11
    assert bool(x[0, 0]) is False
    with pytest.raises(TypeError, match="only arrays of one element"):
        float(x)
    assert isinstance(2 * x, gpucompute.RemoteArray)


def test_one_element_is_a_0d_remote_array_read_and_written_in_place(client, monkeypatch):
    a = np.arange(12, dtype=np.float64).reshape(3, 4) / 4
    x = client.put(a)
    element = x[1, 2]
    assert isinstance(element, gpucompute.RemoteArray)
    assert isinstance(x[-1, ...][0], gpucompute.RemoteArray)
    assert element.shape == () and element.ndim == 0 and element.dtype == np.float64
    assert float(element) == a[1, 2] and int(x[2, 3] * 4) == 11 and bool(x[0, 0]) is False
    host = np.asarray(element)
    assert host.shape == () and host.dtype == np.float64 and host[()] == a[1, 2]

    # An operand read through its view: one elementwise operation, no download, no copy.
    sent = []

    def observe(client_, request, pending):
        sent.append(request)

    def refuse(*args, **kwargs):
        raise AssertionError("downloaded")

    _dispatch.observers.append(observe)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(Client, "_download", refuse)
            y = (x * x[1, 2] + x[0, 3]).compute()
            y.operation  # waits for it
    finally:
        _dispatch.observers.remove(observe)
    assert [request.WhichOneof("op") for request in sent] == ["elementwise"]
    operands = sent[0].elementwise.inputs.values()
    assert sorted(len(operand.view) for operand in operands) == [0, 1, 1]
    assert {operand.buffer for operand in operands} == {x.id}
    _close(y.get(), a * a[1, 2] + a[0, 3])

    # Writes through a single element.
    expected = a.copy()
    x[1, 2] = 7.0
    expected[1, 2] = 7.0
    x[0, 1] += 1
    expected[0, 1] += 1
    element = x[2, 0]
    element *= 3
    expected[2, 0] *= 3
    client.eval("2 * a", a=client.put(np.float64(5.0)), out=x[2, 3])
    expected[2, 3] = 10.0
    np.add(x[0, 0], 0.5, out=x[0, 0])
    expected[0, 0] += 0.5
    _close(x.get(), expected)
    assert float(x[1, 2]) == 7.0
