"""matmul against numpy.matmul: random shapes (matrices, batches, a 2-D operand against
a batch, vectors), both layouts, transposes, views, alpha and beta into an existing C,
float32 and float64; gemv of views. A fixed seed and a bounded count."""

import numpy as np
import pytest

import gpucompute

SEED = 20240613
CASES = 40
RTOL = {np.float32: 1e-5, np.float64: 1e-12}


def _random_operands(rng):
    """(a shape, b shape) that numpy.matmul takes."""
    m, k, n = (int(rng.integers(1, 9)) for _ in range(3))
    batch = int(rng.integers(1, 4))
    form = rng.choice(["2d", "batch", "batch_a", "batch_b", "vec_a", "vec_b", "one"])
    return {
        "2d": ((m, k), (k, n)),
        "batch": ((batch, m, k), (batch, k, n)),
        "batch_a": ((batch, m, k), (k, n)),
        "batch_b": ((m, k), (batch, k, n)),
        "vec_a": ((k,), (k, n)),
        "vec_b": ((m, k), (k,)),
        "one": ((1, m, k), (batch, k, n)),
    }[str(form)]


def _put(client, rng, host):
    """Uploads `host` in C or F order, at random (F for matrices: a 3-D F buffer's
    matrices have no unit stride, which BLAS needs)."""
    if host.ndim == 2 and rng.random() < 0.5:
        host = np.asfortranarray(host)
    return client.put(host)


def test_random_shapes_against_numpy(client):
    rng = np.random.default_rng(SEED)
    for case in range(CASES):
        dtype = np.float32 if rng.random() < 0.4 else np.float64
        a_shape, b_shape = _random_operands(rng)
        a_host = rng.uniform(-1, 1, a_shape).astype(dtype)
        b_host = rng.uniform(-1, 1, b_shape).astype(dtype)
        a, b = _put(client, rng, a_host), _put(client, rng, b_host)
        c = client.matmul(a, b)
        expected = np.matmul(a_host.astype(np.float64), b_host.astype(np.float64))
        got = c.get()
        assert (got.shape, got.dtype) == (expected.shape, dtype), (case, a_shape, b_shape)
        np.testing.assert_allclose(got, expected, rtol=RTOL[dtype], atol=RTOL[dtype],
                                   err_msg=f"{a_shape} @ {b_shape}")
        for handle in (a, b, c):
            handle.delete()


def test_transposes_views_alpha_and_beta(client):
    rng = np.random.default_rng(SEED + 1)
    for case in range(CASES):
        m, k, n = (int(rng.integers(1, 9)) for _ in range(3))
        transpose_a, transpose_b = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
        # Stored as op() undoes: A is (k, m) when transposed.
        a_host = rng.uniform(-1, 1, (k, m) if transpose_a else (m, k))
        b_host = rng.uniform(-1, 1, (n, k) if transpose_b else (k, n))
        # Each operand is a view half the time: every other row of a larger buffer, or
        # the transpose of its transpose.
        a_big = rng.uniform(-1, 1, (2 * a_host.shape[0], a_host.shape[1]))
        a_big[::2] = a_host
        a_remote = client.put(a_big)
        a = a_remote[::2] if rng.random() < 0.5 else client.put(a_host)
        b_remote = client.put(np.ascontiguousarray(b_host.T))
        b = b_remote.T
        alpha = float(rng.uniform(-2, 2))
        beta = float(rng.uniform(-2, 2))
        c_host = rng.uniform(-1, 1, (m, n))
        c = client.put(c_host)
        client.matmul(a, b, c, transpose_a=transpose_a, transpose_b=transpose_b, alpha=alpha,
                      beta=beta)
        op_a = a_host.T if transpose_a else a_host
        op_b = b_host.T if transpose_b else b_host
        expected = alpha * np.matmul(op_a, op_b) + beta * c_host
        np.testing.assert_allclose(c.get(), expected, rtol=1e-12, atol=1e-12,
                                   err_msg=f"case {case}")
        for handle in (a_remote, b_remote, c) + (() if isinstance(a, gpucompute.View) else (a,)):
            handle.delete()


def test_a_new_c_ignores_beta_and_can_be_named(client):
    a = client.put(np.eye(3))
    b = client.put(np.arange(9.0).reshape(3, 3))
    c = client.matmul(a, b, beta=5.0, name="product")
    assert c.name == "product"
    np.testing.assert_array_equal(c.get(), np.arange(9.0).reshape(3, 3))
    assert c.operation.kind == gpucompute.v1.OPERATION_KIND_MATMUL


def test_shapes_that_do_not_match_are_refused_and_create_nothing(client):
    a = client.put(np.zeros((3, 4)))
    b = client.put(np.zeros((3, 4)))
    ints = client.put(np.zeros((4, 4), dtype=np.int64))
    before = {buffer.id for buffer in client.buffers()}
    with pytest.raises(gpucompute.InvalidArgumentError) as error:
        client.matmul(a, b, name="never")
    assert "(3,4)" in str(error.value).replace(" ", "")
    with pytest.raises(gpucompute.InvalidArgumentError):
        client.matmul(a, ints, name="never")
    assert {buffer.id for buffer in client.buffers()} == before


def test_gemv_reads_views(client):
    rng = np.random.default_rng(SEED + 2)
    a_host = rng.uniform(-1, 1, (8, 6))
    x_host = rng.uniform(-1, 1, 10)
    a, x = client.put(a_host), client.put(x_host)
    y = client.gemv(a[::2, 1:], x[::-2], alpha=2.0)
    np.testing.assert_allclose(y.get(), 2.0 * a_host[::2, 1:] @ x_host[::-2], rtol=1e-12)
    y_t = client.gemv(a.T[1:5], x[0:4], transpose=True)
    np.testing.assert_allclose(y_t.get(), a_host.T[1:5].T @ x_host[0:4], rtol=1e-12)
