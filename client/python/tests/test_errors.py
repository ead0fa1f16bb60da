"""Bad input: the exact exception and gRPC code, and a rejected request changes nothing."""

import socket

import conftest
import gpucompute
import grpc
import numpy as np
import pytest

from conftest import MEMORY_LIMIT_BYTES


def state(client):
    """What a rejected request must leave as it was: this client's buffers and their
    contents, and the server's memory use."""
    buffers = {b.id: (b.name, b.shape, b.dtype, b.get().tobytes()) for b in client.buffers()}
    return buffers, client.stats().memory_used_bytes


def rejects(client, error_class, code, call, match=None):
    before = state(client)
    with pytest.raises(error_class, match=match) as error:
        call()
    assert isinstance(error.value, gpucompute.Error)
    assert error.value.code == code
    assert state(client) == before
    return error.value


@pytest.fixture
def x(client):
    return client.put(np.arange(6.0), name="x")


def test_bad_expression_names_the_position(client, x):
    out = client.put(np.full(6, 9.0))
    error = rejects(client, gpucompute.InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT,
                    lambda: client.eval("x + * 2", x=x, out=out))
    assert "position" in error.details
    assert str(error).startswith("INVALID_ARGUMENT: ")


def test_unbound_name_and_shape_mismatch(client, x):
    y = client.put(np.arange(5.0))
    rejects(client, gpucompute.InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT,
            lambda: client.eval("x + z", x=x))
    rejects(client, gpucompute.InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT,
            lambda: client.eval("x + y", x=x, y=y))


def test_unknown_buffer(client, x):
    rejects(client, gpucompute.NotFoundError, grpc.StatusCode.NOT_FOUND,
            lambda: client.reduce("sum", "no-such-buffer"))
    rejects(client, gpucompute.NotFoundError, grpc.StatusCode.NOT_FOUND,
            lambda: client.eval("x + 1", x="buf-" + "0" * 32))
    rejects(client, gpucompute.NotFoundError, grpc.StatusCode.NOT_FOUND,
            lambda: client.download("no-such-buffer"))


def test_taken_name(client, x):
    rejects(client, gpucompute.AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS,
            lambda: client.put(np.zeros(3), name="x"))
    rejects(client, gpucompute.AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS,
            lambda: client.eval("x * 2", x=x, name="x"))


def test_beyond_the_memory_limit(client, x):
    rejects(client, gpucompute.ResourceExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED,
            lambda: client.create((MEMORY_LIMIT_BYTES // 8 + 1,), "float64"))


def test_upload_beyond_the_buffer_changes_nothing(client, x):
    rejects(client, gpucompute.InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT,
            lambda: client.put(np.ones(3), into=x, offset_bytes=4 * 8))


def test_bad_operation_arguments(client, x):
    a = client.put(np.ones((3, 4)))
    rejects(client, gpucompute.InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT,
            lambda: client.gemv(a, x))  # x has 6 elements, A 4 columns
    rejects(client, gpucompute.InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT,
            lambda: client.reduce("sum", x, axis=1))  # x is 1-D
    rejects(client, gpucompute.InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT,
            lambda: client.rand.integers(4, 0, 10, "float64"))
    ints = client.put(np.arange(3))
    # Float into int is not a "same_kind" cast.
    rejects(client, gpucompute.InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT,
            lambda: client.eval("i * 2.5", i=ints, out=ints))


def test_default_stream_cannot_be_deleted(client):
    default = next(s for s in client.streams() if s.is_default)
    with pytest.raises(gpucompute.FailedPreconditionError) as error:
        client.delete_stream(default)
    assert error.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert any(s.id == default.id for s in client.streams())


def test_host_side_mistakes_raise_before_any_call(client, x):
    before = state(client)
    with pytest.raises(TypeError, match="float16"):
        client.put(np.zeros(3, np.float16))
    with pytest.raises(TypeError, match="put"):
        client.eval("x + y", x=x, y=np.ones(6))
    with pytest.raises(ValueError, match="reduction"):
        client.reduce("median", x)
    with pytest.raises(ValueError, match="out"):
        client.eval("x + 1", x=x, out=x, name="y")
    assert state(client) == before


def test_bad_connection_options(server_address):
    with pytest.raises(ValueError, match="client name"):
        gpucompute.connect(server_address, client_name="x" * 129)
    with pytest.raises(ValueError, match="client name"):
        gpucompute.connect(server_address, client_name="tab\there")
    with pytest.raises(ValueError, match="timeout"):
        gpucompute.connect(server_address, timeout=0)
    with pytest.raises(ValueError, match="empty"):
        gpucompute.connect("")


def test_unreachable_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends
    with gpucompute.connect(f"127.0.0.1:{port}", timeout=5) as c:
        with pytest.raises(gpucompute.UnavailableError) as error:
            c.info()
        assert error.value.code == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(gpucompute.UnavailableError):
            c.put(np.zeros(3))


@pytest.mark.skipif(conftest.BACKEND != "cpu",
                    reason="times operations that take a while only on the CPU backend")
def test_timeout_bounds_an_operation(server_address, client):
    x = client.rand.normal(1 << 22, seed=1)
    with gpucompute.connect(server_address, client_name=client.options.client_name,
                            timeout=0.001) as hurried:
        with pytest.raises(gpucompute.DeadlineExceededError) as error:
            hurried.eval("sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x))))", x=x.id)
    assert error.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
