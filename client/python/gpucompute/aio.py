"""The asyncio client, on grpc.aio: the same calls as gpucompute.Client, as coroutines.

    async with gpucompute.aio.connect("127.0.0.1:50051") as c:
        x = await c.put(np.arange(10.0))
        y = await c.eval("2*x", x=x)
        print(await y.get())

Create the client inside the event loop that uses it. Every coroutine here sends its
call when awaited and returns when the server has answered; none blocks the loop.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, NoReturn, Optional

import grpc
import grpc.aio
import numpy.typing as npt

from . import (_aio_session, _arrays, _connection, _operations, _requests, _shm, _transfers,
               _views)
from ._proto import v1
from ._types import ArrayLike, ArrayRef, DTypeLike, Message, Progress, ShapeLike, StreamRef
from .errors import Error, NotFoundError, from_rpc_error

if TYPE_CHECKING:
    from .client import ChannelOptions


def connect(target: str, *, channel_options: ChannelOptions = (), **options: Any) -> Client:
    """Returns an asyncio Client of the server at `target`; the options are those of
    gpucompute.connect. No RPC is made (not a coroutine)."""
    return Client(target, channel_options=channel_options, **options)


class RemoteArray(_arrays.RemoteArrayInfo):
    """A handle to an array resident on the server: `await get()`, `await delete()`,
    `async with`. A handle from an operation submitted with wait=False describes its
    output at once; `await wait()` waits for the operation and fills in its timing."""

    async def get(self, *, progress: Progress = None,
                  transport: Optional[str] = None) -> npt.NDArray[Any]:
        """Downloads the array (shape, dtype and memory order as on the server);
        `transport` as for Client.put."""
        array, self.transfer = await self._client._download(self, progress, transport)
        return array

    async def delete(self) -> None:
        """Deletes the buffer on the server (as Client.delete)."""
        await self._client.delete(self)

    async def wait(self) -> RemoteArray:
        """Waits for the operation that produces this array (WaitOperation calls, where
        it is not done); returns self."""
        if self.operation is not None and not self.operation.done:
            self.operation = await self._client._wait_operation(self.operation)
            self.info = _operations.output_of(self.operation)
        return self

    def __array__(self, dtype: DTypeLike = None, copy: Optional[bool] = None) -> NoReturn:
        raise TypeError("an asyncio RemoteArray downloads with `await handle.get()`")

    async def __aenter__(self) -> RemoteArray:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            await self.delete()
        except NotFoundError:
            pass  # already deleted


class Client(_operations.Operations):
    """An asyncio client of one server. Operations (eval, reduce, gemv, rand.*, submit)
    are coroutines: with wait=True (the default) they return the finished result's
    RemoteArray; with wait=False they return it as soon as the server has queued the
    operation, so awaiting one submission after another keeps them in order while the
    server runs them asynchronously. Run several at once with asyncio.gather. Creating
    it opens the channel and sends nothing.
    """

    def __init__(self, target: str, *, channel_options: ChannelOptions = (),
                 **options: Any) -> None:
        self.options = _connection.Options(target, **options)
        self._channel_options = channel_options
        self._channel = self.options.open_channel(grpc.aio, channel_options)
        self._rpc = _connection.Methods(self._channel)
        self._server_limits = None  # asked for once, by _limits()
        # The channel a redirect replaced (_connection.follow_redirect).
        self._replaced = []
        self._shm = _shm.Transport(self.options.shm_max_bytes)
        # One transfer at a time goes through the shared-memory segment.
        self._shm_lock = asyncio.Lock()

    async def close(self) -> None:
        """As Client.close."""
        if not self._shm_lock.locked():
            async with self._shm_lock:
                try:
                    await self._run_shm(self._shm.release())
                except Error:
                    pass  # the server is gone, and the region with it
        for channel in self._replaced:
            await channel.close()
        await self._channel.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _routed(self, call):
        """As Client._routed, awaiting call()."""
        try:
            return await call()
        except Error as error:
            if not _connection.follow_redirect(self, error, grpc.aio, self._channel_options):
                raise
        return await call()

    async def _call(self, method, request, timeout=True):
        async def call():
            try:
                return await getattr(self._rpc, method)(
                    request, metadata=self.options.metadata,
                    timeout=self.options.timeout if timeout else None)
            except grpc.RpcError as error:
                raise from_rpc_error(error) from None
        return await self._routed(call)

    async def _run_shm(self, steps):
        return await _shm.run_async(
            steps, lambda call: self._call(call.method, call.request, call.unary))

    async def info(self) -> Message:
        """As Client.info."""
        return await self._call("GetServerInfo", v1.GetServerInfoRequest())

    async def stats(self) -> Message:
        """As Client.stats."""
        return await self._call("GetStats", v1.GetStatsRequest())

    async def put(self, array: ArrayLike, *, name: Optional[str] = None,
                  device: Optional[int] = None, into: Optional[ArrayRef] = None,
                  offset_bytes: int = 0, progress: Progress = None,
                  transport: Optional[str] = None) -> RemoteArray:
        """As Client.put."""
        header, data = _transfers.upload_header(array, name, device, into, offset_bytes)
        transport = self.options.transport_for(transport)
        if transport != "grpc":
            setting = self.options.progress_for(progress)
            async with self._shm_lock:
                result = await self._run_shm(self._shm.upload(transport, header, data, setting))
            if result is not None:
                return RemoteArray(self, result[0], transfer=result[1])
        async def upload():
            reporter = _transfers.upload_progress(self.options, progress, data.nbytes)
            failure = []
            call = self._rpc.Upload(
                _transfers.upload_messages(header, data, self.options.chunk_bytes, reporter,
                                           failure),
                metadata=self.options.metadata)
            with _transfers.streaming_call(call, reporter, failure):
                return await call
        response = await self._routed(upload)
        return RemoteArray(self, response.buffer, transfer=response.transfer)

    async def download(self, buffer: ArrayRef, *, progress: Progress = None,
                       transport: Optional[str] = None) -> npt.NDArray[Any]:
        """As Client.download."""
        return (await self._download(buffer, progress, transport))[0]

    async def _download(self, buffer, progress, transport):
        transport = _views.download_transport(buffer, self.options.transport_for(transport))
        if transport != "grpc":
            setting = self.options.progress_for(progress)
            async with self._shm_lock:
                result = await self._run_shm(
                    self._shm.download(transport, _arrays.buffer_ref(buffer), setting))
            if result is not None:
                return result
        request = _requests.download_request(buffer, self.options.chunk_bytes)

        async def download():
            assembler = _transfers.DownloadAssembler(self.options, progress)
            call = self._rpc.Download(request, metadata=self.options.metadata)
            with _transfers.streaming_call(call, assembler):
                async for message, data in call:
                    assembler.add(message, data)
                return assembler.result(), assembler.transfer
        return await self._routed(download)

    async def create(self, shape: ShapeLike, dtype: DTypeLike, *, fill: Optional[Any] = None,
                     name: Optional[str] = None, layout: str = "C",
                     device: Optional[int] = None) -> RemoteArray:
        """As Client.create (no `exportable`)."""
        response = await self._call(
            "CreateBuffer", _requests.create_request(shape, dtype, fill, name, layout, device))
        return RemoteArray(self, response.buffer)

    async def buffer(self, buffer: ArrayRef) -> RemoteArray:
        """As Client.buffer."""
        info = await self._call("GetBuffer",
                                v1.GetBufferRequest(buffer=_arrays.buffer_ref(buffer)))
        return RemoteArray(self, info)

    async def buffers(self) -> list[RemoteArray]:
        """As Client.buffers."""
        response = await self._call("ListBuffers", v1.ListBuffersRequest())
        return [RemoteArray(self, info) for info in response.buffers]

    async def renew(self, buffer: ArrayRef, ttl: Optional[float] = None) -> RemoteArray:
        """As Client.renew."""
        response = await self._call("RenewLease", _requests.renew_request(buffer, ttl))
        return RemoteArray(self, response.buffer)

    async def regions(self) -> list[Message]:
        """As Client.regions."""
        return list((await self._call("ListRegions", v1.ListRegionsRequest())).regions)

    async def delete(self, buffer: ArrayRef) -> None:
        """Deletes a buffer (handle, id or name): its id and name stop resolving at once;
        its memory is freed when queued work using it is done."""
        await self._call("DeleteBuffer", v1.DeleteBufferRequest(buffer=_arrays.buffer_ref(buffer)))

    async def synchronize(self, stream: StreamRef = None, timeout: float = 0.0) -> bool:
        """As Client.synchronize."""
        request = v1.SynchronizeStreamRequest(stream_id=_arrays.stream_ref(stream),
                                              timeout_seconds=timeout)
        return (await self._call("SynchronizeStream", request)).idle

    async def submit(self, request: Message, *, wait: bool = True) -> RemoteArray:
        """As Client.submit, except that wait=False returns the RemoteArray of the
        queued operation (its `operation.done` false until `await handle.wait()`)."""
        submitted = v1.SubmitRequest()
        submitted.CopyFrom(request)
        submitted.wait = wait
        operation = await self._call("Submit", submitted)
        return RemoteArray(self, _operations.output_of(operation), operation)

    def session(self, stream: StreamRef = None) -> _aio_session.AsyncSession:
        """A session (gpucompute._aio_session.AsyncSession), opened by `async with` or
        its first submit: as Client.session, with coroutines. Calling this sends
        nothing (not a coroutine)."""
        return _aio_session.AsyncSession(self, stream)

    async def _limits(self):
        """The server's Limits, asked for once."""
        if self._server_limits is None:
            self._server_limits = (await self.info()).limits
        return self._server_limits

    def _result(self, operation):
        return RemoteArray(self, _operations.output_of(operation), operation)

    async def _wait_operation(self, operation):
        request = v1.WaitOperationRequest(operation_id=operation.id,
                                          timeout_seconds=self.options.wait_slice_seconds())
        while not operation.done:
            operation = await self._call("WaitOperation", request)
        return operation
