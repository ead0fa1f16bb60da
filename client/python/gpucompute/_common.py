"""What the blocking and the asyncio clients share: options, request builders, the
transfer codecs, and the handle's description of a remote array.

Nothing here makes an RPC; client.py and aio.py do, each in its own style.
"""

import contextlib
import numbers
import os

import grpc
import numpy as np

from . import _progress
from ._proto import enum_name, v1
from .errors import error_for, from_rpc_error

CLIENT_METADATA_KEY = "gpucompute-client"
MAX_CLIENT_NAME_BYTES = 128
# The server's largest message (Limits.max_message_bytes of the reference server) and
# the room a chunk leaves for the framing around it, as in the C++ client.
MAX_MESSAGE_BYTES = 64 << 20
CHUNK_OVERHEAD_BYTES = 64 << 10
MAX_CHUNK_BYTES = MAX_MESSAGE_BYTES - CHUNK_OVERHEAD_BYTES
DEFAULT_CHUNK_BYTES = 4 << 20
TOKEN_ENVIRONMENT = "GPUCOMPUTE_TOKEN"
TRANSPORTS = ("auto", "grpc", "shm")
# Messages the channel accepts beyond the server's limit: a download chunk of the full
# limit plus its framing and the buffer info.
_MESSAGE_SLACK_BYTES = 1 << 20

_DTYPES = {
    np.dtype(np.float32): v1.DTYPE_FLOAT32,
    np.dtype(np.float64): v1.DTYPE_FLOAT64,
    np.dtype(np.int32): v1.DTYPE_INT32,
    np.dtype(np.int64): v1.DTYPE_INT64,
    np.dtype(np.bool_): v1.DTYPE_BOOL,
}
_NUMPY_DTYPES = {number: dtype for dtype, number in _DTYPES.items()}
_LAYOUTS = {"C": v1.LAYOUT_C, "F": v1.LAYOUT_F}
REDUCE_KINDS = ("sum", "prod", "min", "max", "mean", "norm2", "argmin", "argmax")

_SERVICE_METHODS = {
    "BufferService": ("CreateBuffer", "Upload", "BeginUpload", "Download", "GetBuffer",
                      "ListBuffers", "DeleteBuffer", "RenewLease"),
    "StreamService": ("CreateStream", "DeleteStream", "SynchronizeStream", "ListStreams"),
    "OperationService": ("Submit", "GetOperation", "WaitOperation"),
    "ServerService": ("GetServerInfo", "GetStats", "TrimMemoryPool", "StartProfiler",
                      "StopProfiler"),
    "SharedMemoryService": ("RegisterRegion", "UnregisterRegion", "ListRegions",
                            "CopyFromRegion", "CopyToRegion", "ExportBuffer"),
    # Reached through Methods only (Session is a bidirectional stream of
    # SessionRequest/SessionResponse); the Client has no wrapper for them yet.
    "SessionService": ("Session", "RunChain"),
}


def renew_request(buffer, ttl):
    """A RenewLeaseRequest: `ttl` None keeps the buffer's own time-to-live, 0 ends the
    lease, else the lease's new time-to-live in seconds."""
    request = v1.RenewLeaseRequest(buffer=buffer_ref(buffer))
    if ttl is not None:
        request.ttl_seconds = float(ttl)
    return request


class Options:
    """Connection options, checked as the C++ client checks them.

    client_name: sent as the "gpucompute-client" metadata when not empty (the server
      calls a client without it "default"); buffer names and listings are per client.
    chunk_bytes: upload chunk size, clamped to MAX_CHUNK_BYTES. A server run with a
      smaller --max-message-bytes refuses larger chunks and reports its bound in
      info().limits.max_chunk_bytes; the default always fits it.
    timeout: seconds each unary call may take (None: no limit). Uploads and downloads
      have none: they take as long as the data takes.
    progress: the default for transfers' `progress` argument (see make_progress).
    token: sent as the metadata "authorization: Bearer TOKEN" with every call, streams
      included (a server with a tokens file requires one; it names the tenant). None
      takes $GPUCOMPUTE_TOKEN; "" sends none. token_file: read it instead from the
      first line of this file. Neither the token nor its file's contents appear in
      any message or repr.
    tls: None (the default) connects with TLS when any tls_* option is given; True
      always, verifying the server with the system's CAs unless tls_ca is given;
      False never (and then no tls_* option may be given).
    tls_ca, tls_cert, tls_key: PEM, each a path or the PEM bytes themselves: the CA
      that verifies the server; the client's certificate chain and its private key
      for mutual TLS (both or neither). Files are read once, here.
    tls_server_name: the name the server's certificate must carry, instead of the
      host of `target`.
    transport: the default for put() and get(): "auto" (shared memory when the server
      allows it and runs on this host, else gRPC), "grpc" or "shm" (see _shm).
    shm_max_bytes: the most the shared-memory segment may grow to; 0 lets it grow to
      the largest transfer. Larger transfers move through it in pieces.
    """

    def __init__(self, target, *, client_name=None, chunk_bytes=DEFAULT_CHUNK_BYTES,
                 timeout=None, progress=None, token=None, token_file=None, tls=None,
                 tls_ca=None, tls_cert=None, tls_key=None, tls_server_name=None,
                 transport="auto", shm_max_bytes=0):
        if not target:
            raise ValueError("the server address is empty")
        client_name = client_name or ""
        if not _printable(client_name, MAX_CLIENT_NAME_BYTES):
            raise ValueError(f"the client name must be at most {MAX_CLIENT_NAME_BYTES} "
                             "printable ASCII characters")
        if timeout is not None and not timeout > 0:
            raise ValueError("the call timeout must be positive (or None for no limit)")
        if not isinstance(chunk_bytes, numbers.Integral) or chunk_bytes < 0:
            raise ValueError("chunk_bytes must be a non-negative integer")
        if not isinstance(shm_max_bytes, numbers.Integral) or shm_max_bytes < 0:
            raise ValueError("shm_max_bytes must be a non-negative integer")
        self.target = target
        self.client_name = client_name
        self.chunk_bytes = min(int(chunk_bytes) or DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES)
        self.timeout = timeout
        self.progress = progress
        self.transport = transport_name(transport)
        self.shm_max_bytes = int(shm_max_bytes)
        self.tls_server_name = tls_server_name or None
        self.credentials = _channel_credentials(tls, tls_ca, tls_cert, tls_key,
                                                self.tls_server_name)
        metadata = [(CLIENT_METADATA_KEY, client_name)] if client_name else []
        token = _token(token, token_file)
        if token:
            metadata.append(("authorization", "Bearer " + token))
        self.metadata = tuple(metadata)

    @property
    def tls(self):
        return self.credentials is not None

    @property
    def has_token(self):
        return any(key == "authorization" for key, _ in self.metadata)

    def __repr__(self):
        # Never the token.
        return (f"<Options target={self.target!r} client_name={self.client_name!r} "
                f"tls={self.tls} token={'set' if self.has_token else 'none'} "
                f"transport={self.transport!r}>")

    def progress_for(self, progress):
        """A transfer's progress setting: its own, or the client's default."""
        return self.progress if progress is None else progress

    def transport_for(self, transport):
        """A call's transport: its own, or the client's default."""
        return self.transport if transport is None else transport_name(transport)

    def channel_arguments(self):
        limit = MAX_MESSAGE_BYTES + _MESSAGE_SLACK_BYTES
        # A subchannel pool of the channel's own: each Client then has a connection of
        # its own, where gRPC would share one among the process's channels to a target.
        arguments = [("grpc.max_send_message_length", limit),
                     ("grpc.max_receive_message_length", limit),
                     ("grpc.use_local_subchannel_pool", 1)]
        if self.tls_server_name:
            arguments.append(("grpc.ssl_target_name_override", self.tls_server_name))
        return arguments

    def open_channel(self, grpc_module, channel_options=()):
        """A channel of `grpc_module` (grpc or grpc.aio: they make channels alike) to
        the target, with TLS when configured."""
        arguments = self.channel_arguments() + list(channel_options)
        if self.credentials is None:
            return grpc_module.insecure_channel(self.target, options=arguments)
        return grpc_module.secure_channel(self.target, self.credentials, options=arguments)

    def wait_slice_seconds(self):
        """How long one WaitOperation may ask the server to wait, within the timeout."""
        return self.timeout / 2 if self.timeout is not None else 0.0


def _printable(text, max_length):
    """Metadata values the server accepts: at most max_length printable ASCII characters."""
    return len(text) <= max_length and all(0x20 <= ord(c) <= 0x7E for c in text)


def _token(token, token_file):
    """The bearer token: `token`, else the first line of `token_file`, else
    $GPUCOMPUTE_TOKEN; "" for none. Messages never quote it: gRPC's own error for a
    malformed metadata value would."""
    if token is not None and token_file is not None:
        raise ValueError("give token or token_file, not both")
    source = "the token"
    if token_file is not None:
        source = f"the token in {os.fspath(token_file)}"
        try:
            with open(token_file, encoding="utf-8", errors="replace") as file:
                token = file.readline().strip()
        except OSError as error:
            raise ValueError(f"cannot read the token file {os.fspath(token_file)}: "
                             f"{error.strerror}") from None
        if not token:
            raise ValueError(f"the token file {os.fspath(token_file)} is empty")
    elif token is None:
        source = f"the token in ${TOKEN_ENVIRONMENT}"
        token = os.environ.get(TOKEN_ENVIRONMENT, "")
    if not isinstance(token, str):
        raise TypeError(f"the token must be a str, not {type(token).__name__}")
    # No limit on the length: the server's tokens file has none.
    if not _printable(token, len(token)):
        raise ValueError(f"{source} must be one line of printable ASCII characters")
    return token


def _pem(what, value):
    """PEM bytes from a path or from the bytes themselves."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    try:
        with open(value, "rb") as file:
            return file.read()
    except OSError as error:
        raise ValueError(f"cannot read {what} {os.fspath(value)}: {error.strerror}") from None


def _channel_credentials(tls, ca, cert, key, server_name):
    """grpc.ChannelCredentials for TLS, or None for plaintext."""
    given = [name for name, value in (("tls_ca", ca), ("tls_cert", cert), ("tls_key", key),
                                      ("tls_server_name", server_name)) if value is not None]
    if tls is None:
        tls = bool(given)
    if not tls:
        if given:
            raise ValueError(f"{', '.join(given)} need TLS, which tls=False turns off")
        return None
    if (cert is None) != (key is None):
        raise ValueError("a TLS client certificate and its key go together: give both "
                         "tls_cert and tls_key or neither")
    return grpc.ssl_channel_credentials(root_certificates=_pem("the TLS CA", ca),
                                        private_key=_pem("the TLS key", key),
                                        certificate_chain=_pem("the TLS certificate", cert))


def transport_name(transport):
    if transport not in TRANSPORTS:
        raise ValueError(f"transport is 'auto', 'grpc' or 'shm', not {transport!r}")
    return transport


class Methods:
    """The multi-callables of the five services on one channel (blocking or grpc.aio:
    both channels make them the same way). Upload takes messages serialized by
    upload_messages and Download yields decode_download's pairs, so chunks skip a
    protobuf copy each way."""

    def __init__(self, channel):
        for service, methods in _SERVICE_METHODS.items():
            for method in methods:
                path = f"/{v1.DESCRIPTOR.package}.{service}/{method}"
                descriptor = v1.DESCRIPTOR.services_by_name[service].methods_by_name[method]
                request = getattr(v1, descriptor.input_type.name)
                response = getattr(v1, descriptor.output_type.name)
                if method == "Upload":
                    callable_ = channel.stream_unary(
                        path, request_serializer=None, response_deserializer=response.FromString)
                elif method == "Session":
                    callable_ = channel.stream_stream(
                        path, request_serializer=request.SerializeToString,
                        response_deserializer=response.FromString)
                elif method == "Download":
                    callable_ = channel.unary_stream(
                        path, request_serializer=request.SerializeToString,
                        response_deserializer=decode_download)
                else:
                    callable_ = channel.unary_unary(
                        path, request_serializer=request.SerializeToString,
                        response_deserializer=response.FromString)
                setattr(self, method, callable_)


# ---------------------------------------------------------------------------
# Values and references


def dtype_enum(dtype):
    """The DType for a NumPy dtype or its name; None gives DTYPE_UNSPECIFIED."""
    if dtype is None:
        return v1.DTYPE_UNSPECIFIED
    try:
        numpy_dtype = np.dtype(dtype)
    except TypeError as error:
        raise TypeError(f"not a dtype: {dtype!r}") from error
    number = _DTYPES.get(numpy_dtype.newbyteorder("="))
    if number is None:
        raise TypeError(f"gpucompute has no {numpy_dtype} arrays; it has float32, float64, "
                        "int32, int64 and bool")
    return number


def numpy_dtype(number):
    """The NumPy dtype of a DType."""
    dtype = _NUMPY_DTYPES.get(number)
    if dtype is None:
        raise TypeError(f"the server sent an unknown dtype {number}")
    return dtype


def layout_enum(layout):
    try:
        return _LAYOUTS[layout.upper()]
    except (KeyError, AttributeError):
        raise ValueError(f"layout must be 'C' or 'F', not {layout!r}") from None


def buffer_ref(value):
    """A buffer's id or name, from a handle or a string."""
    if isinstance(value, RemoteArrayInfo):
        return value.id
    if isinstance(value, str):
        return value
    if isinstance(value, (np.ndarray, list, tuple)):
        raise TypeError("pass a remote array (a handle, id or name), not host data: "
                        "upload it with put() first")
    raise TypeError(f"not a remote array, id or name: {type(value).__name__}")


def stream_ref(stream):
    """A stream id, from a string, a StreamInfo or None (the default stream)."""
    if stream is None:
        return ""
    if isinstance(stream, str):
        return stream
    stream_id = getattr(stream, "id", None)
    if isinstance(stream_id, str):
        return stream_id
    raise TypeError(f"not a stream: {stream!r}")


def scalar_message(value):
    """A Scalar: Python and NumPy bools, integers and floats."""
    scalar = v1.Scalar()
    if isinstance(value, (bool, np.bool_)):
        scalar.bool_value = bool(value)
    elif isinstance(value, numbers.Integral):
        scalar.int_value = int(value)
    elif isinstance(value, numbers.Real):
        scalar.float_value = float(value)
    else:
        raise TypeError(f"not a scalar: {type(value).__name__}")
    return scalar


def scalar_value(scalar):
    which = scalar.WhichOneof("value")
    return getattr(scalar, which) if which else None


def operand_message(value):
    operand = v1.Operand()
    if isinstance(value, (numbers.Number, np.bool_)):
        operand.scalar.CopyFrom(scalar_message(value))
    else:
        operand.buffer = buffer_ref(value)
    return operand


def output_message(out=None, name=None, dtype=None):
    output = v1.Output()
    if out is not None:
        if name is not None:
            raise ValueError("name names a new buffer; it cannot be given with out")
        output.buffer = buffer_ref(out)
    elif name is not None:
        output.name = name
    output.dtype = dtype_enum(dtype)
    return output


# ---------------------------------------------------------------------------
# Requests


def _submit_request(stream, field):
    request = v1.SubmitRequest(stream_id=stream_ref(stream))
    return request, getattr(request, field)


def elementwise_request(expression, inputs, out=None, name=None, dtype=None, stream=None):
    request, op = _submit_request(stream, "elementwise")
    op.expression = expression
    for variable, value in inputs.items():
        op.inputs[variable].CopyFrom(operand_message(value))
    op.output.CopyFrom(output_message(out, name, dtype))
    return request


def reduce_request(kind, x, axis=None, out=None, name=None, dtype=None, stream=None):
    if kind not in REDUCE_KINDS:
        raise ValueError(f"unknown reduction {kind!r}; one of {', '.join(REDUCE_KINDS)}")
    request, op = _submit_request(stream, "reduce")
    op.input = buffer_ref(x)
    op.kind = getattr(v1, f"REDUCE_KIND_{kind.upper()}")
    if axis is not None:
        op.axis = axis
    op.output.CopyFrom(output_message(out, name, dtype))
    return request


def gemv_request(a, x, y=None, transpose=False, alpha=1.0, beta=0.0, name=None, stream=None):
    request, op = _submit_request(stream, "gemv")
    op.a = buffer_ref(a)
    op.x = buffer_ref(x)
    op.y.CopyFrom(output_message(y, name))
    op.transpose = bool(transpose)
    op.alpha = float(alpha)
    op.beta = float(beta)
    return request


def random_request(distribution, shape, dtype, seed, offset=0, out=None, name=None,
                   layout="C", stream=None, **parameters):
    request, op = _submit_request(stream, "random")
    op.distribution = getattr(v1, f"DISTRIBUTION_{distribution.upper()}")
    if out is None:
        op.shape.extend(_shape(shape))
        op.layout = layout_enum(layout)
    op.output.CopyFrom(output_message(out, name, None if out is not None else dtype))
    op.seed = seed
    op.offset = offset
    for parameter, value in parameters.items():
        setattr(op, parameter, value)
    return request


def create_request(shape, dtype, fill=None, name=None, layout="C", device=None):
    request = v1.CreateBufferRequest(dtype=dtype_enum(dtype), shape=_shape(shape),
                                     layout=layout_enum(layout), name=name or "")
    if fill is not None:
        request.fill.CopyFrom(scalar_message(fill))
    if device is not None:
        request.device = device
    return request


def _shape(shape):
    if isinstance(shape, numbers.Integral):
        return [int(shape)]
    return [int(extent) for extent in shape]


# ---------------------------------------------------------------------------
# Uploads


def host_bytes(array):
    """The array as (dtype, shape, layout, memoryview of its bytes), copying only when
    the memory is not contiguous or not little-endian."""
    if isinstance(array, RemoteArrayInfo):
        raise TypeError("the array is already remote")
    array = np.asarray(array)
    number = dtype_enum(array.dtype)
    if array.dtype.byteorder not in ("=", "|"):
        array = array.astype(array.dtype.newbyteorder("="))
    layout = "C"
    if array.ndim >= 2 and array.flags.f_contiguous and not array.flags.c_contiguous:
        layout = "F"
    elif not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    # ravel(order="K") of a contiguous array is a view in memory order.
    data = memoryview(array.ravel(order="K").view(np.uint8))
    return number, array.shape, layout, data


def upload_header(array, name=None, device=None, into=None, offset_bytes=0):
    """The UploadHeader and the bytes to send after it."""
    number, shape, layout, data = host_bytes(array)
    header = v1.UploadHeader(size_bytes=data.nbytes)
    if into is not None:
        if name is not None or device is not None:
            raise ValueError("name and device describe a new buffer; they cannot be given "
                             "with into")
        header.buffer = buffer_ref(into)
        header.offset_bytes = offset_bytes
    else:
        if offset_bytes:
            raise ValueError("offset_bytes needs into")
        header.create.CopyFrom(v1.CreateBufferRequest(
            dtype=number, shape=shape, layout=layout_enum(layout), name=name or ""))
        if device is not None:
            header.create.device = device
    return header, data


def _varint(value):
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# UploadRequest.chunk: field 2, length-delimited.
_CHUNK_TAG = b"\x12"


def upload_messages(header, data, chunk_bytes, progress, failure):
    """Yields the serialized UploadRequests: the header, then each chunk.

    A chunk is written as its field's tag, length and bytes, joined straight from the
    array's memory: one copy, where building an UploadRequest would take two. If the
    progress reporter raises, the exception is stored in `failure` (a list) and the
    stream ends short, which the server rejects without changing anything.
    """
    yield v1.UploadRequest(header=header).SerializeToString()
    total = data.nbytes
    sent = 0
    while sent < total:
        chunk = data[sent:sent + chunk_bytes]
        yield b"".join((_CHUNK_TAG, _varint(chunk.nbytes), chunk))
        sent += chunk.nbytes
        try:
            progress.update(sent)
        except BaseException as error:  # noqa: B036 - handed to the caller
            failure.append(error)
            return


def upload_progress(options, setting, total):
    return _progress.make_progress(options.progress if setting is None else setting, "put",
                                   total)


@contextlib.contextmanager
def streaming_call(call, reporter, failure=()):
    """Around an upload or download `call` (blocking or grpc.aio): raises its gRPC
    error as an Error (or the exception in `failure` that cut an upload short),
    cancels it when anything else interrupts it (the server then changes nothing),
    and closes the progress reporter."""
    try:
        yield
    except grpc.RpcError as error:
        if failure:
            raise failure[0] from None
        raise from_rpc_error(error) from None
    except BaseException:
        call.cancel()
        raise
    finally:
        reporter.close()


# ---------------------------------------------------------------------------
# Downloads


def _read_varint(raw, position):
    result = 0
    shift = 0
    while True:
        byte = raw[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7


def decode_download(raw):
    """Parses a DownloadResponse into (message without data, memoryview of data).

    The data field is left where gRPC put it, and copied once, into the array; the
    other fields are small and parsed by protobuf.
    """
    view = memoryview(raw)
    rest = []
    data = view[0:0]
    position = 0
    while position < len(raw):
        start = position
        key, position = _read_varint(raw, position)
        wire_type = key & 7
        if key >> 3 == 0:
            raise ValueError("field number 0 in a DownloadResponse")
        if wire_type == 0:
            _, position = _read_varint(raw, position)
        elif wire_type == 2:
            length, position = _read_varint(raw, position)
            if key >> 3 == 3:  # data
                data = view[position:position + length]
                position += length
                continue
            position += length
        elif wire_type == 1:
            position += 8
        elif wire_type == 5:
            position += 4
        else:
            raise ValueError(f"unexpected wire type {wire_type} in a DownloadResponse")
        rest.append(view[start:position])
    if position != len(raw):
        raise ValueError("truncated DownloadResponse")
    return v1.DownloadResponse.FromString(b"".join(rest)), data


class DownloadAssembler:
    """Places a download's chunks into one preallocated array of the buffer's shape,
    dtype and layout, checking that they arrive in order and complete."""

    def __init__(self, options, progress_setting):
        self._options = options
        self._setting = options.progress if progress_setting is None else progress_setting
        self._array = None
        self._flat = None
        self._progress = None
        self._received = 0
        self.info = None
        self.transfer = None

    def add(self, message, data):
        if self._array is None:
            if not message.HasField("buffer"):
                raise error_for(13, "the server's first download message does not describe "
                                    "the buffer")
            self.info = message.buffer
            layout = "F" if self.info.layout == v1.LAYOUT_F else "C"
            self._array = np.empty(tuple(self.info.shape), numpy_dtype(self.info.dtype),
                                   order=layout)
            if self._array.nbytes != self.info.size_bytes:
                raise error_for(13, f"the buffer's size {self.info.size_bytes} does not match "
                                    f"its shape and dtype")
            self._flat = self._array.ravel(order="K").view(np.uint8)
            self._progress = _progress.make_progress(self._setting, "get", self._array.nbytes)
        size = data.nbytes
        if size:
            if message.offset_bytes != self._received or size > self._flat.size - self._received:
                raise error_for(13, f"the server sent {size} bytes at offset "
                                    f"{message.offset_bytes} where "
                                    f"{self._flat.size - self._received} bytes at offset "
                                    f"{self._received} remained")
            self._flat[self._received:self._received + size] = np.frombuffer(data, np.uint8)
            self._received += size
            self._progress.update(self._received)
        if message.HasField("transfer"):
            self.transfer = message.transfer

    def close(self):
        if self._progress is not None:
            self._progress.close()

    def result(self):
        if self._array is None:
            raise error_for(13, "the download ended without a message")
        if self._received != self._flat.size:
            raise error_for(13, f"the download ended after {self._received} of "
                                f"{self._flat.size} bytes")
        return self._array


# ---------------------------------------------------------------------------
# Results


def finished(operation):
    """Raises the operation's error if it failed; returns it otherwise."""
    if operation.state == v1.Operation.STATE_FAILED:
        raise error_for(operation.error_code, operation.error_message, operation)
    return operation


def output_of(operation):
    """The BufferInfo of the operation's result; raises its error if it failed."""
    finished(operation)
    if not operation.outputs:
        raise error_for(13, f"operation {operation.id} has no output")
    return operation.outputs[0]


class RemoteArrayInfo:
    """What a handle knows of its remote array, without asking the server.

    id, name, shape, dtype (NumPy), layout ("C" or "F"), size, nbytes, device; the
    operation that produced it (None for uploads and created buffers) with its
    timing; transfer: the TransferStats (bytes, seconds, GB/s) of the handle's last
    upload or download through get() (None before one); value: a reduction's result
    as the server returned it inline (a NumPy scalar, or an array along an axis).
    """

    def __init__(self, client, info, operation=None, transfer=None):
        self._client = client
        self.info = info
        self.operation = operation
        self.transfer = transfer

    @property
    def id(self):
        return self.info.id

    @property
    def name(self):
        return self.info.name or None

    @property
    def shape(self):
        return tuple(self.info.shape)

    @property
    def ndim(self):
        return len(self.info.shape)

    @property
    def dtype(self):
        return numpy_dtype(self.info.dtype)

    @property
    def layout(self):
        return "F" if self.info.layout == v1.LAYOUT_F else "C"

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self):
        return self.info.size_bytes

    @property
    def device(self):
        return self.info.device

    @property
    def timing(self):
        """The operation's Timing (device and queued seconds, bytes, GB/s, GFLOP/s)."""
        if self.operation is None or not self.operation.HasField("timing"):
            return None
        return self.operation.timing

    @property
    def value(self):
        if self.operation is None or not self.operation.values:
            return None
        values = np.array([scalar_value(s) for s in self.operation.values], dtype=self.dtype)
        if values.size != self.size:
            return None
        return values.reshape(self.shape)[()]

    def _describe(self):
        text = f"{self.id}"
        if self.name:
            text += f" ({self.name})"
        text += f" {self.dtype}{list(self.shape)}"
        if self.layout == "F":
            text += " F"
        timing = self.timing
        if timing is not None:
            kind = enum_name("OperationKind", self.operation.kind)
            text += (f" {kind.removeprefix('OPERATION_KIND_').lower()} "
                     f"{timing.device_seconds * 1e3:.3f} ms {timing.gbps:.2f} GB/s")
        if self.transfer is not None:
            text += f" transferred in {self.transfer.seconds:.3f} s {self.transfer.gbps:.2f} GB/s"
        return text

    def __repr__(self):
        return f"<{type(self).__name__} {self._describe()}>"


# ---------------------------------------------------------------------------
# Operations, the same for both clients: each builds its request and hands it to the
# client's submit(), which blocks, returns a Future, or is a coroutine.


class Operations:
    """eval, reduce, gemv and rand.*, on top of the client's submit(request, wait)."""

    def eval(self, expression, inputs=None, *, out=None, name=None, dtype=None, stream=None,
             wait=True, **named_inputs):
        """out = expression(inputs), elementwise, in one fused pass.

        Inputs are remote arrays (handles, ids or names) and scalars, given as keyword
        arguments (`eval("a*x + 1", a=2.0, x=x)`) or, for names that clash with this
        method's own keywords, in the `inputs` mapping. The result goes to a new buffer
        (optionally named, of `dtype` or the expression's NumPy 2 result type), or
        into `out`.
        """
        bound = dict(inputs or {})
        bound.update(named_inputs)
        return self.submit(elementwise_request(expression, bound, out, name, dtype, stream),
                           wait=wait)

    def reduce(self, kind, x, axis=None, *, out=None, name=None, dtype=None, stream=None,
               wait=True):
        """sum prod min max mean norm2 argmin argmax over the whole array, or along `axis`
        of a 2-D one. The handle's `value` holds the result (up to 4096 values)."""
        return self.submit(reduce_request(kind, x, axis, out, name, dtype, stream), wait=wait)

    def gemv(self, a, x, y=None, *, transpose=False, alpha=1.0, beta=0.0, name=None,
             stream=None, wait=True):
        """y = alpha * op(a) @ x + beta * y, into `y` or a new buffer."""
        return self.submit(gemv_request(a, x, y, transpose, alpha, beta, name, stream),
                           wait=wait)

    @property
    def rand(self):
        """Counter-based random fills: rand.uniform, rand.normal, rand.integers."""
        return Random(self)


class Random:
    """Philox4x32-10 fills keyed by (seed, offset): the same request gives the same
    numbers on every backend and run. A result's `operation.next_offset` continues the
    sequence. With `out`, the fill overwrites that buffer and `shape` is ignored."""

    def __init__(self, client):
        self._client = client

    def uniform(self, shape, dtype="float64", *, seed=0, offset=0, out=None, name=None,
                layout="C", stream=None, wait=True):
        """Uniform on [0, 1), float32 or float64."""
        return self._fill("uniform", shape, dtype, seed, offset, out, name, layout, stream, wait)

    def normal(self, shape, dtype="float64", *, seed=0, offset=0, mean=0.0, stddev=1.0,
               out=None, name=None, layout="C", stream=None, wait=True):
        """Normal(mean, stddev), float32 or float64."""
        return self._fill("normal", shape, dtype, seed, offset, out, name, layout, stream, wait,
                          mean=float(mean), stddev=float(stddev))

    def integers(self, shape, low, high, dtype="int64", *, seed=0, offset=0, out=None,
                 name=None, layout="C", stream=None, wait=True):
        """Uniform integers on [low, high), int32 or int64."""
        return self._fill("integers", shape, dtype, seed, offset, out, name, layout, stream,
                          wait, low=int(low), high=int(high))

    def _fill(self, distribution, shape, dtype, seed, offset, out, name, layout, stream, wait,
              **parameters):
        request = random_request(distribution, shape, dtype, seed, offset, out, name, layout,
                                 stream, **parameters)
        return self._client.submit(request, wait=wait)
