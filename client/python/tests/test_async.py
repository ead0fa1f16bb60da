"""Futures from the blocking client, and the asyncio client."""

import asyncio
import concurrent.futures

import conftest
import gpucompute
import gpucompute.aio
import grpc
import numpy as np
import pytest

from test_operations import N


def affine_chain(start, steps):
    """x <- 2x + i for i in steps: the result depends on the order of the steps."""
    x = np.array(start, dtype=np.float64)
    for i in steps:
        x = 2 * x + i
    return x


def test_futures_resolve_in_submission_order(client):
    host = np.random.default_rng(5).standard_normal(N)
    x = client.put(host)
    steps = range(20)
    futures = [client.eval("2*x + i", x=x, i=i, out=x, wait=False) for i in steps]
    assert all(isinstance(f, concurrent.futures.Future) for f in futures)
    results = [f.result(timeout=60) for f in futures]
    assert all(r.id == x.id and r.operation.done for r in results)
    assert all(r.timing.device_seconds > 0 for r in results)
    np.testing.assert_allclose(x.get(), affine_chain(host, steps), rtol=1e-15)


def test_many_futures_in_flight_and_then_a_blocking_call(client):
    x = client.put(np.arange(1000.0))
    futures = [client.reduce("sum", x, wait=False) for _ in range(30)]
    futures += [client.rand.uniform(100, seed=s, wait=False) for s in range(10)]
    # A blocking submit goes after the queued ones.
    last = client.eval("x + 1", x=x, out=x)
    assert [f.result(timeout=60).value for f in futures[:30]] == [499500.0] * 30
    np.testing.assert_array_equal(futures[30].result().get(), client.rand.uniform(100, seed=0).get())
    np.testing.assert_array_equal(last.get(), np.arange(1000.0) + 1)


def test_submit_takes_a_request(client):
    x = client.put(np.arange(4.0), name="x")
    request = gpucompute.v1.SubmitRequest()
    request.reduce.input = "x"
    request.reduce.kind = gpucompute.v1.REDUCE_KIND_MAX
    assert client.submit(request).value == 3.0
    assert client.submit(request, wait=False).result().value == 3.0
    assert x.get()[3] == 3.0


def test_a_failing_future_holds_the_error(client):
    x = client.put(np.arange(4.0))
    future = client.eval("x +", x=x, wait=False)
    error = future.exception(timeout=60)
    assert isinstance(error, gpucompute.InvalidArgumentError)
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(gpucompute.InvalidArgumentError):
        future.result()
    # The queue goes on after a failure.
    assert client.reduce("sum", x, wait=False).result(timeout=60).value == 6.0


@pytest.mark.skipif(conftest.BACKEND != "cpu",
                    reason="times operations that take a while only on the CPU backend")
def test_futures_wait_past_the_call_timeout(server_address, client):
    # A Future waits for its operation however long it takes: it repeats WaitOperation
    # within the per-call timeout.
    # Eight operations of about 0.1 s each on two cores queue well past the timeout.
    timeout = 0.4
    x = client.rand.normal(1 << 23, seed=2)
    with gpucompute.connect(server_address, client_name=client.options.client_name,
                            timeout=timeout) as hurried:
        expr = "sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x))))"
        futures = [hurried.eval(expr, x=x, out=x, wait=False) for _ in range(8)]
        results = [f.result(timeout=120) for f in futures]
    assert all(r.operation.done for r in results)
    last = results[-1].timing
    assert last.queued_seconds + last.device_seconds > timeout  # the premise


def test_asyncio_client(server_address, client):
    host = np.random.default_rng(6).standard_normal((40, 30))

    async def main():
        async with gpucompute.aio.connect(server_address,
                                          client_name=client.options.client_name) as c:
            a = await c.put(host, name="a")
            assert (a.shape, a.name) == ((40, 30), "a")
            x = await c.put(np.ones(30))
            y = await c.gemv(a, x)
            s = await c.reduce("sum", y)
            r = await c.rand.normal((5,), seed=1)
            z = await c.eval("a*2 - 1", a=a, wait=False)
            assert z.shape == (40, 30)
            await z.wait()
            assert z.operation.done and z.timing is not None
            gathered = await asyncio.gather(*(c.reduce("max", a) for _ in range(5)))
            with pytest.raises(gpucompute.NotFoundError) as error:
                await c.reduce("sum", "missing")
            assert error.value.code == grpc.StatusCode.NOT_FOUND
            async with await c.put(np.zeros(2)) as temporary:
                pass
            names = [b.id for b in await c.buffers()]
            assert temporary.id not in names
            with pytest.raises(TypeError):
                np.asarray(a)
            return (await y.get(), s.value, await z.get(), [g.value for g in gathered],
                    await r.get())

    y, total, z, maxima, normals = asyncio.run(main())
    np.testing.assert_allclose(y, host.sum(axis=1), rtol=1e-13)
    np.testing.assert_allclose(total, host.sum(), rtol=1e-12)
    np.testing.assert_allclose(z, host * 2 - 1, rtol=1e-15)
    assert maxima == [host.max()] * 5
    np.testing.assert_array_equal(normals, client.rand.normal((5,), seed=1).get())
    assert client.buffer("a").shape == (40, 30)  # the same client name


def test_closing_the_client_resolves_pending_futures(server_address, client):
    x = client.rand.normal(1 << 22, seed=3)
    with gpucompute.connect(server_address, client_name=client.options.client_name) as c:
        expr = "sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x))))"
        futures = [c.eval(expr, x=x.id, wait=False) for _ in range(5)]
    for future in futures:
        error = future.exception(timeout=60)
        if error is not None:  # those done before the close succeeded
            assert isinstance(error, gpucompute.Error)
            assert error.code == grpc.StatusCode.CANCELLED
    assert any(f.exception() is not None for f in futures)
