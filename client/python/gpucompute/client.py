"""The blocking client, and futures for operations that should not block."""

from __future__ import annotations

import abc
import collections
import concurrent.futures
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Tuple

import grpc
import numpy.typing as npt

from . import (_arrays, _chain, _connection, _dispatch, _interop, _operations, _operators,
               _protocols, _requests, _session, _shm, _transfers, _views)
from ._proto import v1
from ._types import ArrayLike, ArrayRef, DTypeLike, Message, Progress, ShapeLike, StreamRef
from .errors import Error, NotFoundError, error_for, from_rpc_error

if TYPE_CHECKING:
    from ._lazy import LazyArray
    from ._program import Program

# gRPC channel arguments: (name, value) pairs.
ChannelOptions = Sequence[Tuple[str, Any]]


def connect(target: str, *, channel_options: ChannelOptions = (), **options: Any) -> Client:
    """Returns a Client of the server at `target` ("host:port"), and makes it the one
    the module functions (gpucompute.zeros, ...) use by default.

    No RPC is made, so an unreachable server shows up as UnavailableError on the
    first call. The options are those of _connection.Options: client_name, chunk_bytes,
    timeout, progress; token (default $GPUCOMPUTE_TOKEN) or token_file; tls, tls_ca,
    tls_cert, tls_key, tls_server_name; transport ("auto", "grpc" or "shm") and
    shm_max_bytes; tenant (default $GPUCOMPUTE_TENANT). `channel_options` are extra gRPC
    channel arguments, e.g. [("grpc.keepalive_time_ms", 10000)].

    Replicas: a server that serves the tenant on another replica refuses a call with
    FailedPreconditionError and that replica's address; the client then reconnects
    there, once in its life, makes the call again (every call but an asynchronous
    submission) and talks to that replica from then on. A second redirect is raised.
    """
    from . import _creation  # pylint: disable=import-outside-toplevel
    client = Client(target, channel_options=channel_options, **options)
    _creation.set_default(client)
    return client


class RemoteArray(_operators.ArrayOperators, _arrays.RemoteArrayInfo,
                  _protocols.ZeroCopyMethods, metaclass=abc.ABCMeta):
    """A handle to an array resident on the server.

    get() downloads it as a NumPy array, and so does np.asarray(handle). It takes
    NumPy's operators, ufuncs and functions, run on the server (see _operators and
    _lazy). A handle from put(), create(), buffer(), eval() and the other calls is
    freed by delete(), or by leaving a `with` block; dropping it does not: the buffer
    stays on the server until deleted (other handles, ids and names may refer to it).
    Arrays the NumPy layer makes (2 * x, np.sin(x), gpucompute.zeros) are freed when
    collected. On the server's host, CuPy, PyTorch and Numba map it without a copy
    (__cuda_array_interface__, __dlpack__: see gpucompute._interop).
    """

    def get(self, *, progress: Progress = None,
            transport: Optional[str] = None) -> npt.NDArray[Any]:
        """Downloads the array (shape, dtype and memory order as on the server), once
        the operations sent before have run; blocks until it is here. `transport` as
        for Client.put."""
        array, self.transfer = self._client._download(self, progress, transport)
        return array

    def delete(self) -> None:
        """Deletes the buffer on the server (a blocking call): its memory is freed once
        its pending work is done."""
        self._client.delete(self)

    def __array__(self, dtype: DTypeLike = None,
                  copy: Optional[bool] = None) -> npt.NDArray[Any]:
        # NumPy 2 passes copy=False to ask for a view, which a download cannot be.
        if copy is False:
            raise ValueError("a RemoteArray has no host memory to view: converting it "
                             "downloads a copy (use copy=None or True, or get())")
        array = self.get()
        if dtype is not None:
            array = array.astype(dtype, copy=False)
        return array

    def __enter__(self) -> RemoteArray:
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.delete()
        except NotFoundError:
            pass  # already deleted


# A view of a remote array is a remote array, as NumPy's views are ndarrays: x[1, 2] is a
# 0-d RemoteArray. It stays a View underneath (a virtual subclass, inheriting nothing), so
# that writing through it (x[1, 2] += 1, out=x[k]) keeps writing the viewed buffer.
RemoteArray.register(_views.View)


class Client(_operations.Operations):
    """A blocking client of one server; safe to use from many threads.

    Every call names the client (metadata "gpucompute-client") when client_name is set;
    unary calls carry the `timeout` deadline. Errors raise gpucompute.Error subclasses
    with the gRPC code and the server's message.

    Operations (eval, reduce, gemv, rand.*, submit) wait for their result and return a
    RemoteArray; with wait=False they return a concurrent.futures.Future of it at once.
    Submissions reach the server in the order they were made, so a chain of dependent
    operations runs in order; downloads, deletes and uploads into existing buffers wait
    until earlier submissions have reached the server.

    Creating it opens the channel and sends nothing; each method says what it sends
    and whether it blocks. The creation methods (zeros ones full empty eye arange
    linspace random randn normal uniform integers) are gpucompute's functions of the
    same names on this client.
    """

    if TYPE_CHECKING:
        # Set after the class, for the names listed there.
        zeros = ones = full = empty = eye = arange = linspace = random = randn = normal = \
            uniform = integers = _creation_method("")

    def __init__(self, target: str, *, channel_options: ChannelOptions = (),
                 **options: Any) -> None:
        self.options = _connection.Options(target, **options)
        self._channel_options = channel_options
        self._channel = self.options.open_channel(grpc, channel_options)
        self._rpc = _connection.Methods(self._channel)
        self._server_limits = None  # asked for once, by _limits()
        # The channel a redirect replaced (_connection.follow_redirect).
        self._replaced = []
        self._submissions = _Submissions(self)
        self._shm = _shm.Transport(self.options.shm_max_bytes)
        # One transfer at a time goes through the shared-memory segment.
        self._shm_lock = threading.Lock()
        # Buffers of collected arrays, deleted with the array layer's next call.
        self._released = collections.deque()
        self._deleting = set()  # DeleteBuffer calls of released arrays, in flight
        self._array_session = None  # the array layer's (gpucompute._dispatch)
        self._array_last = None  # the last operation it sent
        self._has_index = None  # whether the server's expressions have index(k)

    def close(self) -> None:
        """Unregisters the shared-memory region, if any, and closes the channel (blocking
        calls); calls and futures still in flight fail with CANCELLED."""
        # A transfer still using the segment keeps it: its region then idles out.
        if self._shm_lock.acquire(blocking=False):
            try:
                self._run_shm(self._shm.release())
            except Error:
                pass  # the server is gone, and the region with it
            finally:
                self._shm_lock.release()
        _dispatch.close(self)
        for channel in self._replaced:
            channel.close()
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _routed(self, call):
        """call(), made again once on the replica a redirect names (see connect)."""
        try:
            return call()
        except Error as error:
            if not _connection.follow_redirect(self, error, grpc, self._channel_options):
                raise
        return call()

    def _call(self, method, request, timeout=True):
        def call():
            try:
                return getattr(self._rpc, method)(
                    request, metadata=self.options.metadata,
                    timeout=self.options.timeout if timeout else None)
            except grpc.RpcError as error:
                raise from_rpc_error(error) from None
        return self._routed(call)

    def _run_shm(self, steps):
        return _shm.run(steps, lambda call: self._call(call.method, call.request, call.unary))

    # Server ---------------------------------------------------------------

    def info(self) -> Message:
        """The ServerInfo message: backend, devices, memory, limits, version (a blocking
        call)."""
        return self._call("GetServerInfo", v1.GetServerInfoRequest())

    def stats(self) -> Message:
        """The Stats message: per-kind counts, device time and traffic; pools (a
        blocking call)."""
        return self._call("GetStats", v1.GetStatsRequest())

    def trim_memory_pool(self, device: Optional[int] = None, keep_bytes: int = 0) -> Message:
        """Asks the server to give its memory pool's unused memory back, down to
        `keep_bytes`, on `device` or every device (a blocking call; a server with tokens
        takes it from an admin token only).
        Returns the TrimMemoryPoolResponse."""
        request = v1.TrimMemoryPoolRequest(keep_bytes=keep_bytes)
        if device is not None:
            request.device = device
        return self._call("TrimMemoryPool", request)

    # Buffers --------------------------------------------------------------

    def put(self, array: ArrayLike, *, name: Optional[str] = None, device: Optional[int] = None,
            into: Optional[ArrayRef] = None, offset_bytes: int = 0, progress: Progress = None,
            transport: Optional[str] = None) -> RemoteArray:
        """Uploads a NumPy array (or anything np.asarray takes) and returns its handle;
        blocks until the server has the bytes. An upload `into` a buffer first waits
        for the operations sent before.

        A new buffer, optionally named, gets the array's dtype, shape and memory order
        (Fortran-ordered arrays stay so). With `into`, the bytes overwrite
        [offset_bytes, offset_bytes + array.nbytes) of that existing buffer instead.
        Nothing changes unless every byte arrives. `progress`: see make_progress.

        `transport` (default: the client's): "grpc" streams the bytes; "shm" copies them
        through shared memory (FailedPreconditionError where the server does not allow
        it or runs on another host); "auto" takes shared memory where it can, else gRPC.
        Through shared memory a transfer larger than shm_max_bytes changes a buffer
        piece by piece.

        A CUDA array of another library (CuPy, PyTorch, Numba: C- or F-contiguous) is
        copied on the device through CUDA IPC instead, with no host round trip
        (gpucompute._interop); `progress` and `transport` do not apply.
        """
        if _interop.is_device_array(array):
            response = _interop.put_device(self, array, name=name, device=device, into=into,
                                           offset_bytes=offset_bytes)
            return self.buffer(into) if response is None else RemoteArray(
                self, response.buffer, transfer=getattr(response, "transfer", None))
        header, data = _transfers.upload_header(array, name, device, into, offset_bytes)
        transport = self.options.transport_for(transport)
        if into is not None:
            self._before_write(into)
            self._submissions.wait_idle()
            _dispatch.wait_idle(self)
        if transport != "grpc":
            setting = self.options.progress_for(progress)
            with self._shm_lock:
                result = self._run_shm(self._shm.upload(transport, header, data, setting))
            if result is not None:
                return RemoteArray(self, result[0], transfer=result[1])
        def upload():
            reporter = _transfers.upload_progress(self.options, progress, data.nbytes)
            failure = []
            call = self._rpc.Upload.future(
                _transfers.upload_messages(header, data, self.options.chunk_bytes, reporter,
                                           failure),
                metadata=self.options.metadata)
            with _transfers.streaming_call(call, reporter, failure):
                return call.result()
        response = self._routed(upload)
        return RemoteArray(self, response.buffer, transfer=response.transfer)

    def download(self, buffer: ArrayRef, *, progress: Progress = None,
                 transport: Optional[str] = None) -> npt.NDArray[Any]:
        """Downloads a buffer (handle, id or name) into a new NumPy array, once the
        operations sent before have run; blocks until it is here. `transport` as for
        put. A View downloads as a C-ordered array of its shape, over gRPC."""
        return self._download(buffer, progress, transport)[0]

    def _download(self, buffer, progress, transport):
        """The array and the download's TransferStats."""
        _dispatch.refuse_in_trace("a download (np.asarray(), get(), download())")
        transport = _views.download_transport(buffer, self.options.transport_for(transport))
        self._submissions.wait_idle()
        _dispatch.wait_idle(self)
        if transport != "grpc":
            setting = self.options.progress_for(progress)
            with self._shm_lock:
                result = self._run_shm(
                    self._shm.download(transport, _arrays.buffer_ref(buffer), setting))
            if result is not None:
                return result
        request = _requests.download_request(buffer, self.options.chunk_bytes)

        def download():
            assembler = _transfers.DownloadAssembler(self.options, progress)
            call = self._rpc.Download(request, metadata=self.options.metadata)
            with _transfers.streaming_call(call, assembler):
                for message, data in call:
                    assembler.add(message, data)
                return assembler.result(), assembler.transfer
        return self._routed(download)

    def create(self, shape: ShapeLike, dtype: DTypeLike, *, fill: Optional[Any] = None,
               name: Optional[str] = None, layout: str = "C", device: Optional[int] = None,
               exportable: bool = False) -> RemoteArray:
        """Allocates a buffer on the server (a blocking call; nothing is uploaded),
        filled with `fill` if given, else with zeros. An
        `exportable` one (CUDA backend, --allow-cuda-ipc) can be mapped by CuPy, PyTorch
        and Numba on the server's host without a copy."""
        request = _requests.create_request(shape, dtype, fill, name, layout, device)
        if exportable:
            return _interop.create_exportable(self, request, RemoteArray)
        return RemoteArray(self, self._call("CreateBuffer", request).buffer)

    def buffer(self, buffer: ArrayRef) -> RemoteArray:
        """A handle to an existing buffer, by id or name (a blocking call, which fails
        with NotFoundError for an unknown one)."""
        return RemoteArray(self, self._call("GetBuffer",
                                            v1.GetBufferRequest(buffer=_arrays.buffer_ref(buffer))))

    def buffers(self) -> list[RemoteArray]:
        """Handles to this client's buffers, oldest first (a blocking call)."""
        response = self._call("ListBuffers", v1.ListBuffersRequest())
        return [RemoteArray(self, info) for info in response.buffers]

    def renew(self, buffer: ArrayRef, ttl: Optional[float] = None) -> RemoteArray:
        """Renews a buffer's lease now, a blocking call (see BufferService.RenewLease):
        `ttl` None keeps its time-to-live, 0 ends the lease, else sets a new one in
        seconds. Returns a fresh handle, whose info has the lease's ttl_seconds and
        expire time."""
        response = self._call("RenewLease", _requests.renew_request(buffer, ttl))
        return RemoteArray(self, response.buffer)

    def regions(self) -> list[Message]:
        """This client's shared-memory regions (RegionInfo messages), oldest first (a
        blocking call)."""
        return list(self._call("ListRegions", v1.ListRegionsRequest()).regions)

    def delete(self, buffer: ArrayRef) -> None:
        """Deletes a buffer (handle, id or name) in a blocking call, after waiting for
        the operations sent so far: its id and name stop resolving at once;
        its memory is freed when queued work using it is done."""
        self._before_write(buffer)
        self._submissions.wait_idle()
        _dispatch.wait_idle(self)
        self._call("DeleteBuffer", v1.DeleteBufferRequest(buffer=_arrays.buffer_ref(buffer)))

    def _before_write(self, buffer):
        """Sends the array layer's pending expressions that read `buffer`."""
        from . import _lazy  # pylint: disable=import-outside-toplevel
        _lazy.before_write(self, _lazy.ref_of(buffer)[0])

    # Streams --------------------------------------------------------------

    def create_stream(self, device: Optional[int] = None) -> Message:
        """A new stream on the server (a StreamInfo; pass it, or its id, as `stream=`);
        a blocking call."""
        request = v1.CreateStreamRequest()
        if device is not None:
            request.device = device
        return self._call("CreateStream", request)

    def delete_stream(self, stream: StreamRef) -> None:
        """Deletes a stream on the server (a blocking call)."""
        self._call("DeleteStream", v1.DeleteStreamRequest(stream_id=_arrays.stream_ref(stream)))

    def streams(self) -> list[Message]:
        """This client's streams (StreamInfo messages; a blocking call)."""
        return list(self._call("ListStreams", v1.ListStreamsRequest()).streams)

    def synchronize(self, stream: StreamRef = None, timeout: float = 0.0) -> bool:
        """Blocks until the work submitted to `stream` (None: the default stream) is done,
        or `timeout` seconds pass (0: no limit but the call's); True if it went idle."""
        self._submissions.wait_idle()
        _dispatch.wait_idle(self)
        request = v1.SynchronizeStreamRequest(stream_id=_arrays.stream_ref(stream),
                                              timeout_seconds=timeout)
        return self._call("SynchronizeStream", request).idle

    # Sessions and chains ---------------------------------------------------

    def session(self, stream: StreamRef = None) -> _session.Session:
        """Opens a session (gpucompute._session.Session), a call to the server that
        stays open until it is closed: operations sent without a
        round trip each, whose Pendings resolve as the server answers; a context
        manager. Its operations run on `stream` where they name none."""
        return _session.Session(self, stream)

    def chain(self, stream: StreamRef = None) -> _chain.Chain:
        """A new, empty Chain (gpucompute._chain.Chain) of operations that run
        together in one RunChain call, on `stream` where they name none. Made here:
        nothing is sent until its run()."""
        return _chain.Chain(self, stream)

    def program(self, fn: Callable[..., Any]) -> Program:
        """gpucompute.program(fn, client=self): `fn` traced into a chain of this client
        and run on its server as one RunChain call (gpucompute._program)."""
        from . import _program  # pylint: disable=import-outside-toplevel
        return _program.Program(fn, self)

    def _limits(self):
        """The server's Limits, asked for once."""
        if self._server_limits is None:
            self._server_limits = self.info().limits
        return self._server_limits

    # Operations -----------------------------------------------------------

    def submit(self, request: Message, *, wait: bool = True) -> Any:
        """Submits a SubmitRequest (the builders in _requests make them; eval, reduce,
        gemv and rand.* call this). With wait, returns the result's RemoteArray when
        the operation is done; without, a concurrent.futures.Future of it, resolved
        from gRPC's threads (many can be in flight from one thread). A failed
        operation raises (or the future holds) an Error with its code and message.
        Either way it first waits for the NumPy layer's operations sent so far, and
        sends the request at once.
        """
        # The array layer's operations sent so far write what this may read.
        _dispatch.wait_idle(self)
        if not wait:
            return self._submissions.submit(request)
        sync_request = v1.SubmitRequest()
        sync_request.CopyFrom(request)
        sync_request.wait = True
        self._submissions.wait_idle()
        # The call's deadline bounds the wait, as for every unary call.
        return self._result(self._call("Submit", sync_request))

    def operation(self, operation_id: str) -> Message:
        """The Operation message (state, timing, outputs) of an operation id (a blocking
        call)."""
        return self._call("GetOperation", v1.GetOperationRequest(operation_id=operation_id))

    def _result(self, operation):
        return RemoteArray(self, _operations.output_of(operation), operation)


def _creation_method(name: str) -> Callable[..., LazyArray]:
    def method(self: Client, *args: Any, **kwargs: Any) -> LazyArray:
        from . import _creation  # pylint: disable=import-outside-toplevel
        return getattr(_creation, name)(*args, client=self, **kwargs)
    method.__name__ = name
    method.__doc__ = (f"gpucompute.{name} on this client's server (no upload): an array "
                      "freed when it is garbage collected.")
    return method


for _name in ("zeros", "ones", "full", "empty", "eye", "arange", "linspace", "random", "randn",
              "normal", "uniform", "integers"):
    setattr(Client, _name, _creation_method(_name))


class _Submissions:
    """Operations submitted with wait=False.

    One Submit RPC is in flight at a time and the next starts when it is answered, so
    they reach the server in order; each then waits for its operation with
    WaitOperation, concurrently with the others. Everything runs in gRPC's callbacks,
    which never block.
    """

    def __init__(self, client):
        self._client = client
        self._condition = threading.Condition()
        self._queue = collections.deque()
        self._busy = False

    def submit(self, request):
        future = concurrent.futures.Future()
        # The operation cannot be taken back once submitted, so neither can the future.
        future.set_running_or_notify_cancel()
        async_request = v1.SubmitRequest()
        async_request.CopyFrom(request)
        async_request.wait = False
        with self._condition:
            if self._busy:
                self._queue.append((async_request, future))
                return future
            self._busy = True
        self._send(async_request, future)
        return future

    def wait_idle(self):
        """Blocks until every queued submission has been answered."""
        with self._condition:
            self._condition.wait_for(lambda: not self._busy)

    def _send(self, request, future):
        client = self._client
        try:
            call = client._rpc.Submit.future(request, metadata=client.options.metadata,
                                             timeout=client.options.timeout)
        except ValueError as error:  # the channel is closed
            self._next()
            future.set_exception(error_for(grpc.StatusCode.CANCELLED, str(error)))
            return

        def on_submitted(call):
            self._next()
            self._on_reply(call, future)

        call.add_done_callback(on_submitted)

    def _next(self):
        with self._condition:
            if not self._queue:
                self._busy = False
                self._condition.notify_all()
                return
            request, future = self._queue.popleft()
        self._send(request, future)

    def _on_reply(self, call, future):
        client = self._client
        if call.cancelled():
            future.set_exception(error_for(grpc.StatusCode.CANCELLED, "the call was cancelled"))
            return
        if call.exception() is not None:
            future.set_exception(from_rpc_error(call.exception()))
            return
        operation = call.result()
        if operation.done:
            try:
                future.set_result(client._result(operation))
            except Error as error:
                future.set_exception(error)
            return
        # The server bounds each wait by the request's timeout; a wait that returns
        # before the operation is done is repeated.
        request = v1.WaitOperationRequest(operation_id=operation.id,
                                          timeout_seconds=client.options.wait_slice_seconds())
        try:
            wait = client._rpc.WaitOperation.future(request, metadata=client.options.metadata,
                                                    timeout=client.options.timeout)
        except ValueError as error:  # the channel is closed
            future.set_exception(error_for(grpc.StatusCode.CANCELLED, str(error)))
            return
        wait.add_done_callback(lambda call: self._on_reply(call, future))
