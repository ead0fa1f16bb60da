"""The asyncio client's session (gpucompute.aio.Client.session): the blocking session's
protocol (_session) on grpc.aio, in the event loop that uses it.

    async with c.session() as s:
        y = await s.eval("x + 1", x=x)    # a Pending, once queued
        z = await s.eval("2 * y", y=y)
        print(await (await z.array()).get())
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from types import TracebackType
from typing import Any, Optional, Type

import grpc

from . import _operations
from ._session import MAX_BATCH_BYTES, Pending, SessionState, session_op_bytes, stream_suffix
from ._types import Message, StreamRef
from .errors import Error, error_for, from_rpc_error


class AsyncPending(Pending):
    """A Pending of the asyncio session: result(), exception(), buffer_id() and array()
    are coroutines (their `timeout` as asyncio.wait_for's); done() and ref as in
    Pending. They send nothing: they wait for the session's reader."""

    __slots__ = ("_waiter",)

    def __init__(self, session: Any, seq: int, tag: str) -> None:
        super().__init__(session, seq, tag)
        self._waiter = None  # a Future, once something awaits the answer

    def _answered(self):
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _until_answered(self):
        if not self.done():
            if self._waiter is None:
                self._waiter = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._waiter)

    async def result(self, timeout: Optional[float] = None) -> Message:  # type: ignore[override]
        """As Pending.result, awaited."""
        await asyncio.wait_for(self._until_answered(), timeout)
        self._observed = True
        if self._error is not None:
            raise self._error
        return self._operation

    async def exception(  # type: ignore[override]
            self, timeout: Optional[float] = None) -> Optional[Error]:
        """As Pending.exception, awaited."""
        try:
            await self.result(timeout)
        except Error as error:
            return error
        return None

    async def buffer_id(self, timeout: Optional[float] = None) -> str:  # type: ignore[override]
        """As Pending.buffer_id, awaited."""
        return _operations.output_of(await self.result(timeout)).id

    async def array(self, timeout: Optional[float] = None) -> Any:  # type: ignore[override]
        """The output as a RemoteArray of the asyncio client."""
        return self._session._client._result(await self.result(timeout))


class AsyncSession(SessionState, _operations.Operations):
    """As gpucompute.Session, for asyncio: the call opens when the `async with` block
    starts (or at the first submit), and submit() and the operations are coroutines
    that return an AsyncPending once the operation is queued, at once unless a full
    message (Limits.max_session_in_flight operations) waits to be sent. Leaving the
    block (close()) waits for every answer and raises the first failure nobody looked
    at; an exception inside it cancels the session. Temporaries die with the session.
    Creating it sends nothing.
    """

    def __init__(self, client: Any, stream: StreamRef = None) -> None:
        super().__init__()
        self._client = client
        self._suffix = stream_suffix(stream)
        self._max_ops = None
        self._queued = collections.deque()
        self._count = itertools.count(1)
        self._own_tags = set()
        self._changed = asyncio.Event()  # the queue, or the state, changed
        self._closing = False
        self._call = None
        self._reader = None

    async def open(self) -> AsyncSession:
        """Opens the call (asking the server's limits once per client); the first
        submit does too."""
        if self._call is None:
            self._max_ops = max(1, (await self._client._limits()).max_session_in_flight)
            if self._call is None:
                self._call = self._client._rpc.Session(self._messages(),
                                                       metadata=self._client.options.metadata)
                self._reader = asyncio.ensure_future(self._read())
        return self

    async def submit(self, request: Message, *, wait: bool = False,
                     tag: Optional[str] = None) -> AsyncPending:
        """As Session.submit; awaits only while a full message waits."""
        del wait  # a session never waits; AsyncPending.result() does
        if self._closing:
            raise ValueError("the session is closed")
        await self.open()
        if tag is not None:
            if not isinstance(tag, str) or not tag or tag.startswith("#"):
                raise ValueError(
                    f"a tag is a non-empty string not starting with '#', not {tag!r}")
            if tag in self._own_tags:
                raise ValueError(f"tag '{tag}' is already used in this session")
            self._own_tags.add(tag)
        data = request.SerializeToString()
        if self._suffix and not request.stream_id:
            data += self._suffix
        seq = next(self._count)
        pending = AsyncPending(self, seq, f"#{seq}" if tag is None else tag)
        while len(self._queued) >= self._max_ops and not self._ended:
            await self._next_change()
        if self._ended:
            self._unanswered[pending.tag] = pending
            self._fail_unanswered(pending.tag, self._end_error)
            return pending
        self._unanswered[pending.tag] = pending
        self._queued.append(session_op_bytes(pending.tag, data))
        self._changed.set()
        return pending

    async def _next_change(self):
        self._changed.clear()
        await self._changed.wait()

    async def _messages(self):
        queued = self._queued
        while True:
            while not queued and not self._closing and not self._ended:
                await self._next_change()
            if self._ended or not queued:
                return
            batch = [queued.popleft()]
            size = len(batch[0])
            while queued and len(batch) < self._max_ops and size < MAX_BATCH_BYTES:
                batch.append(queued.popleft())
                size += len(batch[-1])
            self._changed.set()  # room for submits waiting
            yield b"".join(batch)

    async def _read(self):
        error = None
        try:
            async for response in self._call:
                self._resolve(response)
        except grpc.RpcError as rpc_error:
            error = from_rpc_error(rpc_error)
        except asyncio.CancelledError:
            if not self._cancelled:
                raise
            # grpc.aio ends a call cancelled here this way, not with an RpcError.
            error = error_for(grpc.StatusCode.CANCELLED, "the session was cancelled")
        self._end(error)
        self._queued.clear()
        self._changed.set()

    async def wait(self, timeout: Optional[float] = None) -> None:
        """Waits until every operation submitted so far is answered."""
        pendings = list(self._unanswered.values())
        await asyncio.wait_for(asyncio.gather(*(p._until_answered() for p in pendings)),
                               timeout)

    async def close(self, timeout: Optional[float] = None) -> None:
        """As Session.close."""
        self._closing = True
        self._changed.set()
        if self._reader is not None:
            await asyncio.wait_for(asyncio.shield(self._reader), timeout)
        error = self._error_at_close()
        if error is not None:
            raise error

    async def cancel(self) -> None:
        """As Session.cancel."""
        self._closing = True
        self._cancelled = True
        self._changed.set()
        if self._call is not None:
            self._call.cancel()
            await self._reader

    async def __aenter__(self) -> AsyncSession:
        return await self.open()

    async def __aexit__(self, exc_type: Optional[Type[BaseException]],
                        exc: Optional[BaseException],
                        traceback: Optional[TracebackType]) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self.cancel()
