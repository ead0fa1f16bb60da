"""A program that uses the client as a user does, with annotations of its own:
test_typing.py checks it with mypy --strict against the package's annotations, and
runs it against a server."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import numpy as np
import numpy.typing as npt

import gpucompute
import gpucompute.aio


def blocking(c: gpucompute.Client) -> float:
    """The blocking client: uploads, NumPy's way, views, sessions, chains, downloads."""
    x = c.put(np.linspace(0.1, 2.0, 48).reshape(6, 8))
    y = np.sqrt(np.abs(x * x - 1.5)) / (x + 1)       # one fused expression, lazy
    centered = x - x.mean(axis=0, keepdims=True)
    variance = float(((x - x.mean()) ** 2).mean())   # the value comes with the operation
    view: gpucompute.View = x[1:, ::2].T
    host: npt.NDArray[np.float64] = view.get()
    assert host.shape == (4, 5)

    z = gpucompute.zeros((6, 8), client=c)
    z[1:, ::2] += 1
    z += centered
    r = c.rand.normal((6, 8), "float64", seed=1)
    w = gpucompute.random((6, 8), seed=2, client=c)
    product = (x @ x.T).sum()
    picked = np.where(x > 1, x, 0.0).sum(axis=0)
    shape: tuple[int, ...] = picked.shape

    evaluated: gpucompute.RemoteArray = c.eval("a*x + 1", a=2.0, x=x)
    reduced = c.reduce("std", x, axis=(0, 1), keepdims=True, ddof=1)
    future: Future[gpucompute.RemoteArray] = c.eval("2*x", x=x, wait=False)
    seconds = float(evaluated.timing.device_seconds) if evaluated.timing is not None else 0.0

    with c.session() as session:
        pending: gpucompute.Pending = session.eval("x + 1", x=x)
        doubled = session.eval("2 * p", p=pending)
        from_session = doubled.array().get()

    chain = c.chain()
    step: gpucompute.Step = chain.eval("2*x", x=x)
    chain.eval("t + 1", t=step, out=z)
    result: gpucompute.ChainResult = chain.run(keep=[step])
    kept = result.array(step)
    prepared: bool = result.prepared

    try:
        c.buffer("no such buffer")
    except gpucompute.NotFoundError as error:
        assert error.code.name == "NOT_FOUND" and error.details

    queued = future.result()
    downloads = [np.asarray(y), z.get(), np.asarray(r), w.get(), queued.get(), from_session]
    for handle in (x, evaluated, reduced, kept, r, queued):   # these stay until deleted
        handle.delete()
    xp = z.__array_namespace__()
    assert xp is gpucompute.array_api
    return (variance + float(product) + seconds + len(shape) + float(prepared)
            + float(sum(float(d.sum()) for d in downloads)))


async def asynchronous(address: str) -> float:
    """The asyncio client: the same calls, awaited."""
    async with gpucompute.aio.connect(address) as c:
        x = await c.put(np.arange(10.0))
        y = await c.eval("sqrt(x)", x=x)
        async with c.session() as session:
            pending = await session.eval("y + 1", y=y)
            plus_one = await (await pending.array()).get()
        largest = await c.reduce("max", y)
        values = await y.get()
        for handle in (x, y, largest):
            await handle.delete()
        return float(largest.value) + float(values.sum()) + float(plus_one.sum())


def main(address: str) -> float:
    """Both, against the server at `address`."""
    with gpucompute.connect(address) as c:
        total = blocking(c)
    return total + asyncio.run(asynchronous(address))
