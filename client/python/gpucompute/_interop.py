"""Zero-copy between the server's buffers and GPU array libraries (CuPy, PyTorch, Numba,
anything that speaks __cuda_array_interface__ or DLPack) in a process on the server's
host, through CUDA IPC (the server needs --backend=cuda and --allow-cuda-ipc).

Out of the server: a handle or View maps its buffer's memory into this process
(ExportBuffer, then cudaIpcOpenMemHandle) and describes it, view offset and strides
included, so the consumer reads and writes the buffer itself. The server can export only
buffers created exportable (Client.create(..., exportable=True)): other buffers give
__cuda_array_interface__ a ZeroCopyError, and __dlpack__ (unless copy=False) a copy made
on the device into a new exportable buffer, which lives until the consumer lets go of it.

Into the server: Client.put and from_dlpack register the consumer's allocation as a
CUDA IPC region and copy it into a buffer on the device (CopyFromRegion).

Ordering: an export waits, on the client, for the operations that write the buffer
before it returns, so the consumer may read it on any stream. A consumer that writes the
memory must synchronize its own stream before the server next touches the buffer; an
import waits for the producer's work itself. client/python/README.md states these
rules, and the lifetimes, for users.
"""

from __future__ import annotations

import socket
import threading
import weakref
from typing import TYPE_CHECKING, Any, Optional

import grpc
import numpy as np

from . import _arrays, _cuda, _dlpack, _shm, _strides
from ._proto import v1
from .errors import Error, FailedPreconditionError, from_rpc_error

if TYPE_CHECKING:
    from .client import Client, RemoteArray


class ZeroCopyError(FailedPreconditionError, BufferError):
    """The memory cannot be shared without a copy: the server does not allow CUDA IPC,
    runs the CPU backend or on another host, or the buffer was not created exportable
    (and the protocol may not copy it)."""

    def __init__(self, details: str) -> None:
        super().__init__(grpc.StatusCode.FAILED_PRECONDITION, details)


def check_server(client):
    """The ServerInfo, if CUDA IPC can be used with the server; else ZeroCopyError."""
    info = client.info()
    if info.backend != "cuda":
        raise ZeroCopyError(
            f"zero-copy needs the server's CUDA backend, and it runs the {info.backend} "
            "backend: the buffer is in host memory there; download it with get() or "
            "np.asarray()")
    if not info.cuda_ipc_enabled:
        raise ZeroCopyError("the server does not allow CUDA IPC: start it with "
                            "--allow-cuda-ipc (only for trusted clients on its host)")
    if info.hostname != socket.gethostname() or info.boot_id != _shm.boot_id():
        raise ZeroCopyError(f"the server runs on another host ({info.hostname}) than this "
                            f"client ({socket.gethostname()}); CUDA IPC needs both on one host")
    return info


# Calls made where nothing may wait for them (finalizers, DLPack deleters): their
# futures are kept until answered, since gRPC cancels a call whose future is collected.
_pending_calls = set()
_pending_lock = threading.Lock()


def _call_later(client, method, request):
    try:
        future = getattr(client._rpc, method).future(request, metadata=client.options.metadata,
                                                     timeout=client.options.timeout)
    except ValueError:
        return  # the channel is closed: the server releases the rest itself
    with _pending_lock:
        _pending_calls.add(future)

    def forget(done):
        with _pending_lock:
            _pending_calls.discard(done)

    future.add_done_callback(forget)


def _release(client, pointer, region_id, copy_id):
    # The mapping closes before the server may free the memory under it.
    try:
        _cuda.runtime().close_handle(pointer)
    except _cuda.CudaError:
        pass  # the process's CUDA context is gone, and the mapping with it
    if region_id:
        _call_later(client, "UnregisterRegion", v1.UnregisterRegionRequest(region_id=region_id))
    if copy_id:
        _call_later(client, "DeleteBuffer", v1.DeleteBufferRequest(buffer=copy_id))


class Mapping:
    """A buffer's memory mapped into this process from its CUDA IPC handle. Released
    (mapping closed, then the export's region unregistered and a copy deleted) by
    release() or when collected."""

    def __init__(self, client, response, copied):
        region_id = response.region.id
        copy_id = response.buffer.id if copied else ""
        try:
            self.pointer = _cuda.runtime().open_handle(response.handle)
            self.device = _cuda.pointer_device(self.pointer)
        except BaseException:
            if getattr(self, "pointer", None):
                _cuda.runtime().close_handle(self.pointer)
            _release_server_side(client, region_id, copy_id)
            raise
        self.buffer = response.buffer
        self.copied = copied
        # The export's region stays while the mapping does: it holds the memory should
        # the buffer be deleted meanwhile (a copy too: it is listed with the others).
        _learn_device(client, response.buffer.device, self.device)
        self._finalizer = weakref.finalize(self, _release, client, self.pointer, region_id,
                                           copy_id)

    def release(self):
        self._finalizer()


def _release_server_side(client, region_id, copy_id):
    for method, request in (("UnregisterRegion", v1.UnregisterRegionRequest(region_id=region_id)),
                            ("DeleteBuffer", v1.DeleteBufferRequest(buffer=copy_id))):
        if request.ListFields():
            try:
                client._call(method, request)
            except Error:
                pass


def _learn_device(client, server_device, local_device):
    """Remembers which of this process's devices a server device is (CUDA_VISIBLE_DEVICES
    may number them differently)."""
    client.__dict__.setdefault("_zero_copy_devices", {})[server_device] = local_device


def local_device(client, server_device):
    """This process's ordinal of a server device: as learned from a mapping, else the
    same number."""
    return client.__dict__.get("_zero_copy_devices", {}).get(server_device, server_device)


def _wait_for_writers(client, buffer_id, nbytes):
    """Returns once the operations writing the buffer are done: a download waits for
    them, and one byte of it is enough."""
    client._submissions.wait_idle()
    if not nbytes:
        return
    request = v1.DownloadRequest(buffer=buffer_id, size_bytes=1)
    try:
        for _ in client._rpc.Download(request, metadata=client.options.metadata,
                                      timeout=client.options.timeout):
            pass
    except grpc.RpcError as error:
        raise from_rpc_error(error) from None


# Held while a handle's mapping is made: two threads making one each would leave a
# consumer of the first with a pointer whose mapping the second's replaced and closed.
_mapping_lock = threading.Lock()


def _export_existing(client, handle):
    """The handle's Mapping of its buffer itself (made once, kept by the handle), or None
    if the buffer was not created exportable."""
    with _mapping_lock:
        mapping = handle.__dict__.get("_zero_copy_mapping")
        if mapping is None and handle.__dict__.get("_exportable", True):
            try:
                response = client._call("ExportBuffer",
                                        v1.ExportBufferRequest(buffer=handle.id))
            except FailedPreconditionError:
                # check_server() ruled out the other reasons: the buffer is not exportable.
                handle._exportable = False
                return None
            mapping = Mapping(client, response, copied=False)
            handle._exportable = True
            handle._zero_copy_mapping = mapping
        return mapping


def _export_copy(client, source, shape, dtype, device):
    """A Mapping of a new exportable buffer holding a copy of `source` made on the device,
    in C order."""
    from ._requests import elementwise_request
    create = v1.CreateBufferRequest(dtype=_arrays.dtype_enum(dtype), shape=shape,
                                    layout=v1.LAYOUT_C, device=device)
    response = client._call("ExportBuffer", v1.ExportBufferRequest(create=create))
    try:
        client.submit(elementwise_request("x", {"x": source}, out=response.buffer.id))
    except BaseException:
        _release_server_side(client, response.region.id, response.buffer.id)
        raise
    return Mapping(client, response, copied=True)


class _Export:
    """What one protocol call hands out: the mapping and where the array lies in it."""

    def __init__(self, mapping, dtype, offset, shape, strides):
        itemsize = np.dtype(dtype).itemsize
        self.mapping = mapping
        self.dtype = np.dtype(dtype)
        self.pointer = mapping.pointer + offset * itemsize
        self.shape = shape
        self.strides = strides
        self.strides_bytes = tuple(stride * itemsize for stride in strides)
        self.broadcast = any(extent > 1 and stride == 0 for extent, stride in zip(shape, strides))


def _parts(value):
    """(client, handle, steps) of a handle or a View of one, of the blocking client."""
    from ._views import View
    from .client import Client
    handle, steps = (value.base, value.steps) if isinstance(value, View) else (value, ())
    if not isinstance(handle, _arrays.RemoteArrayInfo):
        raise TypeError("a view of an id or name has no client to export it: view a "
                        "handle (client.buffer(name)) instead")
    if not isinstance(handle._client, Client):
        raise TypeError("zero-copy exports go through the blocking client "
                        "(gpucompute.connect), not gpucompute.aio")
    return handle._client, handle, steps


def export(value, *, copy=None):
    """An _Export of a handle or View: the buffer itself where it was created exportable
    (copy False or None), else a device copy (copy True or None)."""
    client, handle, steps = _parts(value)
    check_server(client)
    shape = handle.shape
    offset, view_shape, strides = _strides.view_layout(shape, handle.layout, steps)
    if copy is not True:
        mapping = _export_existing(client, handle)
        if mapping is not None:
            _wait_for_writers(client, handle.id, handle.nbytes)
            return _Export(mapping, handle.dtype, offset, view_shape, strides)
        if copy is False:
            raise ZeroCopyError(_not_exportable(handle))
    mapping = _export_copy(client, value, view_shape, handle.dtype, handle.device)
    return _Export(mapping, handle.dtype, *_strides.dense_layout(view_shape))


def capsule(value, stream, max_version, dl_device, copy):
    """ZeroCopyMethods.__dlpack__."""
    del stream  # export() has waited for the writers: the values are ready for any stream
    exported = export(value, copy=copy)
    device = exported.mapping.device
    if dl_device is not None and tuple(dl_device) != (_dlpack.KDL_CUDA, device):
        raise BufferError(f"the array is on CUDA device {device}; it cannot be exported "
                          f"to device {tuple(dl_device)}")
    versioned = max_version is not None and tuple(max_version)[0] >= _dlpack.VERSION[0]
    flags = (_dlpack.FLAG_IS_COPIED if exported.mapping.copied else 0) | (
        _dlpack.FLAG_READ_ONLY if exported.broadcast else 0)
    mapping = exported.mapping
    # The capsule holds the mapping until its consumer deletes the tensor; a copy's
    # mapping is the capsule's alone, and goes then.
    release = mapping.release if mapping.copied else (lambda: mapping)
    return _dlpack.make_capsule(exported.pointer, exported.shape, exported.strides,
                                exported.dtype, device, release=release, versioned=versioned,
                                flags=flags)


def interface(value):
    """ZeroCopyMethods.__cuda_array_interface__."""
    exported = export(value, copy=False)
    return _dlpack.cuda_array_interface(exported.pointer, exported.shape,
                                        exported.strides_bytes, exported.dtype,
                                        read_only=exported.broadcast)


def dlpack_device(value):
    """ZeroCopyMethods.__dlpack_device__."""
    client, handle, _ = _parts(value)
    check_server(client)
    return _dlpack.KDL_CUDA, local_device(client, handle.device)


def from_dlpack(value: Any, client: Client, *, name: Optional[str] = None,
                device: Optional[int] = None) -> RemoteArray:
    """A new buffer on `client`'s server holding a copy of `value`: a CUDA array of
    another library (anything with __dlpack__ or __cuda_array_interface__) is copied on
    the device through CUDA IPC, with no host round trip; host memory is uploaded. Blocks
    until the buffer holds the copy (Client.put)."""
    if not is_device_array(value):
        return client.put(np.from_dlpack(value), name=name, device=device)
    return client.put(value, name=name, device=device)


def create_exportable(client, request, handle_class):
    """Client.create(..., exportable=True): ExportBuffer's `create`, whose export region
    is let go at once (the buffer holds its memory; each mapping exports it again)."""
    check_server(client)
    response = client._call("ExportBuffer", v1.ExportBufferRequest(create=request))
    _release_server_side(client, response.region.id, "")
    handle = handle_class(client, response.buffer)
    handle._exportable = True
    return handle


def _not_exportable(handle):
    return (f"buffer {handle.id} was not created exportable, and only such buffers can be "
            "mapped by CUDA IPC: create one with client.create(..., exportable=True) and "
            "write into it with out=, or take a copy made on the device with "
            "cupy.from_dlpack(x) / torch.from_dlpack(x)")


# Importing ----------------------------------------------------------------


def is_device_array(value):
    """Whether `value` is an array in CUDA memory of another library (CuPy, PyTorch,
    Numba...): one that speaks __cuda_array_interface__ or DLPack with a CUDA device."""
    from ._views import View
    if isinstance(value, (_arrays.RemoteArrayInfo, View, np.ndarray)):
        return False
    dlpack_device = getattr(value, "__dlpack_device__", None)
    if dlpack_device is not None:
        try:
            return dlpack_device()[0] == _dlpack.KDL_CUDA
        except Exception:  # a device it cannot name is not one to read from
            return False
    return hasattr(value, "__cuda_array_interface__")


class _Source:
    """Where an imported array's bytes lie: pointer, shape, dtype, layout ("C" or "F"),
    once the work that writes them is done."""

    def __init__(self, value):
        self._tensor = None
        interface = getattr(value, "__cuda_array_interface__", None)
        stream = None
        if interface is not None:
            self.pointer = interface["data"][0] or 0
            self.shape = tuple(interface["shape"])
            self.dtype = np.dtype(interface["typestr"])
            strides = interface.get("strides")
            itemsize = self.dtype.itemsize
            strides = None if strides is None else tuple(s // itemsize for s in strides)
            stream = interface.get("stream")
        else:
            self._tensor = _dlpack.ImportedTensor(value.__dlpack__())
            self.pointer, self.shape = self._tensor.pointer, self._tensor.shape
            self.dtype, strides = self._tensor.dtype, self._tensor.strides
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        try:
            self.layout = _layout_of(self.shape, strides)
            if self.nbytes:
                # The server reads the memory outside this process's streams. A stream
                # the producer names is enough to wait for; without one (PyTorch names
                # none, DLPack's None means its legacy default stream) the whole device.
                if stream:
                    _cuda.runtime().synchronize_stream(stream)
                else:
                    _cuda.runtime().synchronize_device(_cuda.pointer_device(self.pointer))
        except BaseException:
            self.close()
            raise

    def close(self):
        if self._tensor is not None:
            self._tensor.close()


def _layout_of(shape, strides):
    """"C" or "F" for a contiguous array of `shape` with `strides` in elements (None: C);
    TypeError for others."""
    if strides is None or _is_dense(shape, strides, "C"):
        return "C"
    if _is_dense(shape, strides, "F"):
        return "F"
    raise TypeError(f"the device array (shape {shape}, strides {strides} in elements) is "
                    "not contiguous; make it so on the device first, e.g. "
                    "cupy.ascontiguousarray(x) or x.contiguous()")


def _is_dense(shape, strides, layout):
    _, _, dense = _strides.dense_layout(shape, layout)
    return all(extent == 1 or stride == expected
               for extent, stride, expected in zip(shape, strides, dense))


def put_device(client, value, *, name=None, device=None, into=None, offset_bytes=0):
    """Copies a device array into a new buffer (or, with `into`, into bytes of one) on
    the server's device, through a CUDA IPC region of its allocation; returns the
    response (a CopyRegionResponse, or None where there were no bytes)."""
    check_server(client)
    if into is not None:
        client._submissions.wait_idle()
    source = _Source(value)
    try:
        create = None
        if into is None:
            create = v1.CreateBufferRequest(dtype=_arrays.dtype_enum(source.dtype),
                                            shape=source.shape,
                                            layout=_arrays.layout_enum(source.layout),
                                            name=name or "")
            if device is not None:
                create.device = device
        if not source.nbytes:
            if create is None:
                return None
            return client._call("CreateBuffer", create)
        base, _, local = _cuda.allocation_of(source.pointer)
        handle = _cuda.runtime().get_handle(base)
        server_device = device if device is not None else _server_device(client, local)
        region = client._call("RegisterRegion", v1.RegisterRegionRequest(
            cuda_ipc=v1.CudaIpcMemory(handle=handle, device=server_device,
                                      size_bytes=source.pointer - base + source.nbytes)))
        try:
            request = v1.CopyFromRegionRequest(region_id=region.id,
                                               region_offset_bytes=source.pointer - base,
                                               size_bytes=source.nbytes)
            if create is None:
                request.buffer = _arrays.buffer_ref(into)
                request.offset_bytes = offset_bytes
            else:
                request.create.CopyFrom(create)
            return client._call("CopyFromRegion", request, timeout=False)
        finally:
            _release_server_side(client, region.id, "")
    finally:
        source.close()


def _server_device(client, local):
    for server, mapped in client.__dict__.get("_zero_copy_devices", {}).items():
        if mapped == local:
            return server
    return local
