"""The transfer codecs of both clients: an upload as serialized messages whose chunks
come straight from the array's memory, a download's messages parsed without copying
their data and assembled into one array, and the handling of a streaming call's
errors and progress.
"""

import contextlib

import grpc
import numpy as np

from . import _progress
from ._arrays import buffer_ref, host_bytes, layout_enum, numpy_dtype
from ._proto import v1
from .errors import error_for, from_rpc_error


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
            # With a view, the message describes the view: its shape, C order.
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
