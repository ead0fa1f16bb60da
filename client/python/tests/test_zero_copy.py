"""Zero-copy into CuPy, PyTorch and Numba (gpucompute._interop): __cuda_array_interface__,
DLPack and imports of device arrays through CUDA IPC.

Three parts:
- the protocols' structures, checked against NumPy's own conventions and its DLPack
  consumer, with pointers into host memory: no GPU needed;
- the export and import logic against a real CPU server, with the CUDA calls and the
  two CUDA-only RPCs replaced by stand-ins that record what they were asked: no GPU
  needed;
- the real thing on a CUDA server with --allow-cuda-ipc, with CuPy (and PyTorch and
  Numba where installed); skipped, saying why, without them or a GPU. Run there as
  GPUCOMPUTE_SERVER_BIN=build/server/gpucompute-server python3 -m pytest -q \
      client/python/tests/test_zero_copy.py
And the CPU backend's refusal, which runs everywhere.
"""

import ctypes
import gc
import socket
import time
import types

import gpucompute
import grpc
import numpy as np
import pytest
from gpucompute import _cuda, _dlpack, _interop, _shm, _strides, v1
from gpucompute._views import ViewMethods

from conftest import client_name_for, start_server

# --- The protocols' structures ------------------------------------------------------


def test_dlpack_structs_have_the_layout_of_dlpack_h():
    # dlpack.h on a 64-bit platform.
    assert ctypes.sizeof(_dlpack.DLDevice) == 8
    assert ctypes.sizeof(_dlpack.DLDataType) == 4
    assert [(name, getattr(_dlpack.DLTensor, name).offset) for name, _ in
            _dlpack.DLTensor._fields_] == [("data", 0), ("device", 8), ("ndim", 16),
                                            ("dtype", 20), ("shape", 24), ("strides", 32),
                                            ("byte_offset", 40)]
    assert ctypes.sizeof(_dlpack.DLTensor) == 48
    assert (_dlpack.DLManagedTensor.manager_ctx.offset,
            _dlpack.DLManagedTensor.deleter.offset) == (48, 56)
    assert ctypes.sizeof(_dlpack.DLManagedTensor) == 64
    assert [(name, getattr(_dlpack.DLManagedTensorVersioned, name).offset) for name, _ in
            _dlpack.DLManagedTensorVersioned._fields_] == [
                ("version", 0), ("manager_ctx", 8), ("deleter", 16), ("flags", 24),
                ("dl_tensor", 32)]


@pytest.mark.parametrize("dtype, code, bits", [
    ("float32", 2, 32), ("float64", 2, 64), ("int32", 0, 32), ("int64", 0, 64),
    ("bool", 6, 8)])
def test_dlpack_type_codes(dtype, code, bits):
    dl = _dlpack.dl_dtype(dtype)
    assert (dl.code, dl.bits, dl.lanes) == (code, bits, 1)
    assert _dlpack.numpy_dtype(dl) == np.dtype(dtype)


class _HostProducer:
    """A DLPack producer of host memory through _dlpack.make_capsule, so that NumPy's
    own consumer reads what it wrote."""

    def __init__(self, array, released, versioned=False):
        self.array = array
        self.released = released
        self.versioned = versioned

    def __dlpack__(self, stream=None):
        a = self.array
        return _dlpack.make_capsule(
            a.__array_interface__["data"][0], a.shape, [s // a.itemsize for s in a.strides],
            a.dtype, 0, release=lambda: self.released.append(a.shape),
            versioned=self.versioned, device_type=_dlpack.KDL_CPU)

    def __dlpack_device__(self):
        return _dlpack.KDL_CPU, 0


_VIEWS = [
    ("whole", lambda x: x),
    ("columns", lambda x: x[:, ::2]),
    ("transposed", lambda x: x.T),
    ("reversed rows of a slice", lambda x: x[::-1, 1:4]),
    ("one row", lambda x: x[2]),
    ("one element", lambda x: x[1, 2, ...]),
    ("new axis", lambda x: x[None, 1:, ::3]),
]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool"])
@pytest.mark.parametrize("name, view", _VIEWS)
def test_numpy_reads_our_dlpack_capsules(dtype, name, view):
    if dtype == "bool" and np.lib.NumpyVersion(np.__version__) < "1.25.0":
        pytest.skip("NumPy reads DLPack's bool from 1.25 on")
    base = (np.arange(30).reshape(5, 6) % 7).astype(dtype)
    expected = view(base)
    released = []
    read = np.from_dlpack(_HostProducer(expected, released))
    np.testing.assert_array_equal(read, expected)
    assert read.__array_interface__["data"][0] == expected.__array_interface__["data"][0]
    assert released == []
    del read
    gc.collect()
    assert released == [expected.shape]


def test_an_unconsumed_capsule_releases_its_memory_once():
    released = []
    array = np.arange(6.0)
    for versioned in (False, True):
        capsule = _HostProducer(array, released, versioned).__dlpack__()
        del capsule
        gc.collect()
    assert released == [(6,), (6,)]
    assert _dlpack._live == {}


def test_imported_tensor_reads_versioned_and_legacy_capsules():
    array = np.arange(12, dtype=np.int32).reshape(3, 4).T
    for versioned in (False, True):
        released = []
        tensor = _dlpack.ImportedTensor(_HostProducer(array, released, versioned).__dlpack__())
        assert (tensor.pointer, tensor.shape, tensor.strides, tensor.dtype, tensor.device) == (
            array.__array_interface__["data"][0], (4, 3), (1, 4), np.dtype(np.int32),
            (_dlpack.KDL_CPU, 0))
        assert released == []
        tensor.close()
        assert released == [(4, 3)]
    with pytest.raises(BufferError, match="not a capsule"):
        _dlpack.ImportedTensor(object())


@pytest.mark.parametrize("name, view", _VIEWS)
def test_cuda_array_interface_follows_numpys_array_interface(name, view):
    base = np.arange(30, dtype=np.float32).reshape(5, 6)
    expected = view(base)
    interface = _dlpack.cuda_array_interface(
        expected.__array_interface__["data"][0], expected.shape, expected.strides,
        expected.dtype, read_only=False)
    numpy_interface = expected.__array_interface__
    for key in ("shape", "typestr", "descr", "data"):
        assert interface[key] == numpy_interface[key]
    assert interface["strides"] == expected.strides
    assert (interface["version"], interface["stream"]) == (3, None)
    # NumPy reads it back as the same array.
    holder = type("Holder", (), {"__array_interface__": interface})()
    np.testing.assert_array_equal(np.asarray(holder), expected)


class _Shape(ViewMethods):
    """A remote array's shape, to make Views of without a server."""

    def __init__(self, shape):
        self.shape = shape

    def _view_parts(self):
        return self, (), self.shape, None


def _random_view(rng, array, remote, layout):
    """Applies the same random view step to a NumPy array and a View; returns both."""
    shape = array.shape
    choice = rng.integers(6)
    if choice == 0 and shape:
        key = []
        for extent in shape[:rng.integers(1, len(shape) + 1)]:
            kind = rng.integers(3)
            if kind == 0 and extent:
                key.append(int(rng.integers(-extent, extent)))
            elif kind == 1:
                key.append(None)
                key.append(slice(None))
            else:
                start, stop = sorted(rng.integers(-extent - 1, extent + 2, size=2))
                step = int(rng.choice([-3, -2, -1, 1, 2, 3]))
                key.append(slice(int(start), int(stop), step))
        if rng.integers(2):
            key.append(Ellipsis)
        return array[tuple(key)], remote[tuple(key)]
    if choice == 1:
        axes = tuple(int(a) for a in rng.permutation(len(shape)))
        return array.transpose(axes), remote.transpose(axes)
    if choice == 2 and len(shape) < 5:
        axis = int(rng.integers(-len(shape) - 1, len(shape) + 1))
        return np.expand_dims(array, axis), remote.expand_dims(axis)
    if choice == 3:
        return array.squeeze(), remote.squeeze()
    if choice == 4 and len(shape) < 5:
        target = (2,) + tuple(3 if extent == 1 and rng.integers(2) else extent for extent in shape)
        return np.broadcast_to(array, target), remote.broadcast_to(target)
    size = array.size
    for extents in ((size,), (-1, 2), (2, -1, 3), (1, size, 1)):
        try:
            reshaped = remote.reshape(extents)
        except ValueError:
            continue
        try:
            offset, _, strides = _strides.view_layout(reshaped.base.shape, layout,
                                                     reshaped.steps)
        except ValueError:
            continue  # not expressible without a copy: the server refuses it too
        return array.reshape(extents), reshaped
    return array, remote


@pytest.mark.parametrize("layout", ["C", "F"])
def test_view_layouts_match_numpys_on_random_views(layout):
    rng = np.random.default_rng(31 if layout == "C" else 32)
    for _ in range(300):
        shape = tuple(int(e) for e in rng.integers(1, 5, size=rng.integers(1, 4)))
        memory = np.arange(int(np.prod(shape)))
        array = memory.reshape(shape, order=layout)
        remote = _Shape(shape)
        for _ in range(int(rng.integers(1, 5))):
            array, remote = _random_view(rng, array, remote, layout)
        steps = getattr(remote, "steps", ())
        offset, view_shape, strides = _strides.view_layout(shape, layout, steps)
        assert view_shape == array.shape
        if array.size == 0:
            continue
        rebuilt = np.lib.stride_tricks.as_strided(
            memory[offset:], view_shape, [s * memory.itemsize for s in strides])
        np.testing.assert_array_equal(rebuilt, array)


def test_a_view_that_needs_a_copy_to_reshape_is_refused_as_the_server_refuses_it():
    remote = _Shape((4, 6)).T.reshape(24)
    with pytest.raises(ValueError, match="cannot reshape a view of shape \\(6, 4\\) into shape "
                                         "\\(24,\\) without copying its elements"):
        _strides.view_layout((4, 6), "C", remote.steps)


def test_the_runtime_passes_ipc_handles_byte_for_byte():
    # Handles hold zero bytes anywhere; neither way may stop at one.
    handle = bytes([1, 2, 0, 0, 5]) + bytes(range(59))
    opened = []

    def open_handle(pointer, ipc_handle, flags):
        opened.append((ctypes.string_at(ctypes.addressof(ipc_handle), 64), flags))
        pointer._obj.value = 0x1234
        return 0

    def get_handle(ipc_handle, pointer):
        ctypes.memmove(ctypes.addressof(ipc_handle._obj), handle, 64)
        return 0

    # libcudart's calls as ctypes makes them; the ones not made here do nothing.
    library = types.SimpleNamespace(cudaIpcOpenMemHandle=open_handle,
                                    cudaIpcGetMemHandle=get_handle,
                                    **{name: (lambda *args: 0) for name in (
                                        "cudaGetErrorName", "cudaGetLastError",
                                        "cudaIpcCloseMemHandle", "cudaStreamSynchronize",
                                        "cudaGetDevice", "cudaSetDevice")})
    runtime = _cuda._CtypesRuntime(library)
    assert runtime.open_handle(handle) == 0x1234
    assert opened == [(handle, 1)]  # with cudaIpcMemLazyEnablePeerAccess
    assert runtime.get_handle(0x5678) == handle


def test_a_failed_cuda_call_raises_naming_the_call_and_its_error():
    # Against a real libcudart where one is found: with no GPU, or with a handle no
    # process exported, opening it fails. Loaded apart from _cuda.runtime()'s choice,
    # which is the one CuPy loads in the tests that use it.
    for path in _cuda._runtime_candidates():
        try:
            runtime = _cuda._CtypesRuntime(ctypes.CDLL(path))
            break
        except OSError:
            continue
    else:
        pytest.skip("no libcudart here")
    with pytest.raises(_cuda.CudaError, match=r"^cudaIpcOpenMemHandle failed: cudaError\w+$"):
        runtime.open_handle(bytes(64))


# --- Export and import logic, with CUDA stood in for --------------------------------

# Where the stand-in runtime "maps" exported buffers: never dereferenced.
_FAKE_BASE = 0x7F0000000000


class _FakeCuda:
    """Records the CUDA calls of _interop; maps the k-th opened handle at
    _FAKE_BASE + k * 2**32 and closes what it opened."""

    def __init__(self):
        self.open = {}
        self.closed = []
        self.synchronized = []

    def runtime(self):
        return self

    def open_handle(self, handle):
        pointer = _FAKE_BASE + (len(self.open) << 32)
        self.open[pointer] = handle
        return pointer

    def close_handle(self, pointer):
        assert pointer in self.open and pointer not in self.closed
        self.closed.append(pointer)

    def get_handle(self, pointer):
        return pointer.to_bytes(8, "little").ljust(64, b"H")

    def synchronize_stream(self, stream):
        self.synchronized.append(stream)

    def synchronize_device(self, device):
        self.synchronized.append(f"device {device}")


class _FakeServer:
    """Stands in for the CUDA-only RPCs on a CPU server: ExportBuffer answers for
    buffers in `exportable` (and creates real buffers), RegisterRegion of a CUDA IPC
    region remembers it, CopyFromRegion uploads the host bytes the region stands for."""

    def __init__(self, client, monkeypatch):
        self.client = client
        self.exportable = set()
        self.calls = []
        self.regions = {}
        self.memory = {}  # fake allocation base -> host array whose bytes it holds
        real_call = client._call

        def call(method, request, timeout=True):
            self.calls.append((method, request))
            handler = getattr(self, method, None)
            if handler is None:
                return real_call(method, request, timeout)
            return handler(request, real_call)

        monkeypatch.setattr(client, "_call", call)
        # Releases call without waiting; recorded here as "later:<method>".
        call_later = _interop._call_later

        def later(client, method, request):
            self.calls.append((f"later:{method}", request))
            if method == "UnregisterRegion":
                self.UnregisterRegion(request, None)
            else:
                call_later(client, method, request)

        monkeypatch.setattr(_interop, "_call_later", later)

    def ExportBuffer(self, request, real_call):
        if request.HasField("create"):
            info = real_call("CreateBuffer", request.create).buffer
            self.exportable.add(info.id)
        else:
            info = real_call("GetBuffer", v1.GetBufferRequest(buffer=request.buffer))
            if info.id not in self.exportable:
                raise gpucompute.FailedPreconditionError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"buffer {info.id} was not created exportable")
        region = v1.RegionInfo(id=f"shm-{len(self.calls):032x}",
                               kind=v1.REGION_KIND_EXPORT, buffer=info.id)
        return v1.ExportBufferResponse(buffer=info, region=region,
                                       handle=info.id.encode().ljust(64, b"\0"))

    def RegisterRegion(self, request, real_call):
        region = v1.RegionInfo(id=f"shm-{len(self.calls):032x}", kind=v1.REGION_KIND_CUDA_IPC,
                               size_bytes=request.cuda_ipc.size_bytes)
        self.regions[region.id] = request.cuda_ipc
        return region

    def UnregisterRegion(self, request, real_call):
        self.regions.pop(request.region_id, None)
        return v1.UnregisterRegionResponse()

    def CopyFromRegion(self, request, real_call):
        assert request.region_id in self.regions
        base = int.from_bytes(self.regions[request.region_id].handle[:8], "little")
        array = self.memory[base]
        begin = request.region_offset_bytes - _POOL_OFFSET
        data = array.ravel(order="K").view(np.uint8)[begin:begin + request.size_bytes]
        if request.HasField("create"):
            create = request.create
            host = data.view(gpucompute._arrays.numpy_dtype(create.dtype)).reshape(
                tuple(create.shape), order="F" if create.layout == v1.LAYOUT_F else "C")
            handle = self.client.put(host, name=create.name or None)
        else:
            handle = self.client.put(data.view(self.client.buffer(request.buffer).dtype),
                                     into=request.buffer, offset_bytes=request.offset_bytes)
        return v1.CopyRegionResponse(buffer=handle.info)


@pytest.fixture(scope="module")
def cpu_server():
    with start_server(memory_limit=256 << 20, cpu_threads=1) as address:
        yield address


@pytest.fixture
def faked(cpu_server, request, monkeypatch):
    """A client of the CPU server with CUDA and its RPCs stood in for."""
    cuda = _FakeCuda()
    monkeypatch.setattr(_cuda, "runtime", cuda.runtime)
    monkeypatch.setattr(_cuda, "pointer_device", lambda pointer: 0)
    monkeypatch.setattr(_interop, "check_server", lambda client: client.info())
    with gpucompute.connect(cpu_server, client_name=client_name_for(request),
                            progress=False) as client:
        server = _FakeServer(client, monkeypatch)
        yield client, server, cuda
        gc.collect()
        for buffer in client.buffers():
            buffer.delete()


def _eventually(condition, seconds=10):
    """Waits for what a release does without waiting: its calls to the server."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.01)


def _methods(server):
    return [method for method, _ in server.calls if method != "GetServerInfo"]


def test_an_exportable_buffer_is_mapped_itself_with_each_views_offset_and_strides(
        faked, monkeypatch):
    client, server, cuda = faked
    waits = []
    wait = _interop._wait_for_writers

    def record_wait(client, buffer_id, nbytes):
        waits.append(buffer_id)
        wait(client, buffer_id, nbytes)

    monkeypatch.setattr(_interop, "_wait_for_writers", record_wait)
    host = np.arange(30, dtype=np.float64).reshape(5, 6)
    x = client.put(host)
    server.exportable.add(x.id)
    for name, view in _VIEWS + [("broadcast", lambda a: a[:, 1, None, None].broadcast_to(5, 2, 3)
                                 if isinstance(a, ViewMethods)
                                 else np.broadcast_to(a[:, 1, None, None], (5, 2, 3)))]:
        interface = view(x).__cuda_array_interface__
        expected = view(host)
        pointer, read_only = interface["data"]
        assert pointer - _FAKE_BASE == (expected.__array_interface__["data"][0]
                                        - host.__array_interface__["data"][0]), name
        assert interface["shape"] == expected.shape
        assert all(stride == expected_stride or extent == 1 for stride, expected_stride, extent
                   in zip(interface["strides"], expected.strides, expected.shape)), name
        assert read_only == (name == "broadcast")
    # One mapping for the handle, kept by it; one export.
    assert list(cuda.open) == [_FAKE_BASE]
    assert _methods(server).count("ExportBuffer") == 1
    # Each export waited for the buffer's writers.
    assert waits == [x.id] * (len(_VIEWS) + 1)
    x.delete()
    assert cuda.closed == []  # deleting the buffer leaves the mapping to its holder
    del x, interface
    gc.collect()
    assert cuda.closed == [_FAKE_BASE]


def test_cuda_array_interface_of_a_buffer_not_created_exportable_is_refused(faked):
    client, server, cuda = faked
    x = client.put(np.ones(4, np.float32))
    with pytest.raises(gpucompute.ZeroCopyError) as error:
        x.__cuda_array_interface__
    assert str(error.value) == (
        f"FAILED_PRECONDITION: buffer {x.id} was not created exportable, and only such "
        "buffers can be mapped by CUDA IPC: create one with client.create(..., "
        "exportable=True) and write into it with out=, or take a copy made on the device "
        "with cupy.from_dlpack(x) / torch.from_dlpack(x)")
    assert isinstance(error.value, BufferError)
    with pytest.raises(gpucompute.ZeroCopyError):
        x.__dlpack__(copy=False)
    # Asked once; nothing mapped, nothing created.
    assert _methods(server).count("ExportBuffer") == 1
    assert cuda.open == {}
    assert [b.id for b in client.buffers()] == [x.id]


def test_dlpack_of_a_plain_buffer_is_a_device_copy_that_lives_until_the_consumer_is_done(
        faked):
    client, server, cuda = faked
    host = np.arange(24, dtype=np.int32).reshape(4, 6)
    x = client.put(host)
    capsule = x[1:, ::2].__dlpack__(max_version=(1, 0))
    tensor = _dlpack.ImportedTensor(capsule)
    assert tensor.flags == _dlpack.FLAG_IS_COPIED
    assert (tensor.shape, tensor.strides, tensor.dtype) == ((3, 3), (3, 1), np.dtype(np.int32))
    assert tensor.device == (_dlpack.KDL_CUDA, 0)
    (pointer,) = cuda.open
    assert tensor.pointer == pointer
    # The copy is a buffer of its own, made on the server by an elementwise 'x'; it and
    # its export go when the consumer is done.
    copy_id = cuda.open[pointer].rstrip(b"\0").decode()
    np.testing.assert_array_equal(client.download(copy_id), host[1:, ::2])
    assert sorted(b.id for b in client.buffers()) == sorted([x.id, copy_id])
    export = next(r for m, r in server.calls if m == "ExportBuffer" and r.HasField("create"))
    assert export.create == v1.CreateBufferRequest(dtype=v1.DTYPE_INT32, shape=[3, 3],
                                                   layout=v1.LAYOUT_C, device=0)
    assert "UnregisterRegion" not in _methods(server)
    tensor.close()
    assert cuda.closed == [pointer]
    assert [m for m in _methods(server) if m.startswith("later:")] == [
        "later:UnregisterRegion", "later:DeleteBuffer"]
    _eventually(lambda: [b.id for b in client.buffers()] == [x.id])


def test_dlpack_of_an_exportable_buffer_shares_it_and_the_capsule_keeps_the_mapping(faked):
    client, server, cuda = faked
    x = client.create((3, 4), "float32", fill=2.5, exportable=True)
    assert _methods(server) == ["ExportBuffer", "UnregisterRegion"]
    tensor = _dlpack.ImportedTensor(x.T.__dlpack__())
    assert (tensor.pointer, tensor.shape, tensor.strides) == (_FAKE_BASE, (4, 3), (1, 4))
    assert tensor.flags == 0  # legacy capsule: no flags
    del x
    gc.collect()
    assert cuda.closed == []  # the tensor still holds the mapping
    tensor.close()
    gc.collect()
    assert cuda.closed == [_FAKE_BASE]
    # Its export region goes with the mapping; the buffer stays.
    assert _methods(server)[-1] == "later:UnregisterRegion"
    assert len(client.buffers()) == 1


def test_dlpack_copy_true_copies_even_an_exportable_buffer(faked):
    client, server, cuda = faked
    x = client.create((2,), "float64", fill=1.0, exportable=True)
    tensor = _dlpack.ImportedTensor(x.__dlpack__(copy=True, max_version=(1, 2)))
    assert tensor.flags == _dlpack.FLAG_IS_COPIED
    assert len(client.buffers()) == 2
    tensor.close()
    with pytest.raises(BufferError, match="cannot be exported to device"):
        x.__dlpack__(dl_device=(_dlpack.KDL_CPU, 0))


# Where a fake device array lies in its allocation, as in a memory pool.
_POOL_OFFSET = 256


class _FakeDeviceArray:
    """A 'CUDA' array whose pointer is host memory, described as CuPy describes its
    arrays."""

    def __init__(self, array, server, stream=None):
        self.array = array
        self.stream = stream
        server.memory[array.__array_interface__["data"][0] - _POOL_OFFSET] = array

    @property
    def __cuda_array_interface__(self):
        a = self.array
        return {"shape": a.shape, "typestr": a.dtype.str, "version": 3, "stream": self.stream,
                "data": (a.__array_interface__["data"][0], False),
                "strides": None if a.flags.c_contiguous else a.strides}


def _fake_allocations(monkeypatch, server):
    def allocation_of(pointer):
        for base, array in server.memory.items():
            if base + _POOL_OFFSET == pointer:
                return base, _POOL_OFFSET + array.nbytes + 512, 0
        raise AssertionError("unknown pointer")
    monkeypatch.setattr(_cuda, "allocation_of", allocation_of)


@pytest.mark.parametrize("order", ["C", "F"])
def test_put_of_a_device_array_copies_its_allocation_through_a_cuda_ipc_region(
        faked, monkeypatch, order):
    client, server, cuda = faked
    _fake_allocations(monkeypatch, server)
    host = np.asfortranarray(np.arange(12.0).reshape(3, 4)) if order == "F" else \
        np.arange(12.0).reshape(3, 4)
    x = client.put(_FakeDeviceArray(host, server, stream=7), name="imported")
    assert cuda.synchronized == [7]
    register = next(r for m, r in server.calls if m == "RegisterRegion")
    base = host.__array_interface__["data"][0] - _POOL_OFFSET
    assert register.cuda_ipc == v1.CudaIpcMemory(
        handle=base.to_bytes(8, "little").ljust(64, b"H"), size_bytes=_POOL_OFFSET + 96,
        device=0)
    copy = next(r for m, r in server.calls if m == "CopyFromRegion")
    assert (copy.region_offset_bytes, copy.size_bytes) == (_POOL_OFFSET, 96)
    assert copy.create.layout == (v1.LAYOUT_F if order == "F" else v1.LAYOUT_C)
    assert (x.name, x.layout, x.shape) == ("imported", order, (3, 4))
    np.testing.assert_array_equal(x.get(), host)
    assert server.regions == {}  # unregistered after the copy
    # Into an existing buffer, at an offset; an array that names no stream waits for its
    # whole device.
    y = client.create((5,), "float64")
    client.put(_FakeDeviceArray(np.array([7.0, 8.0]), server), into=y, offset_bytes=16)
    np.testing.assert_array_equal(y.get(), [0, 0, 7, 8, 0])
    assert cuda.synchronized == [7, "device 0"]


class _FakeDlpackArray:
    """A 'CUDA' array that speaks only DLPack (as JAX's do), its memory on the host."""

    def __init__(self, array, server, released):
        self.array = array
        self.released = released
        server.memory[array.__array_interface__["data"][0] - _POOL_OFFSET] = array

    def __dlpack__(self, stream=None):
        a = self.array
        return _dlpack.make_capsule(
            a.__array_interface__["data"][0], a.shape, [s // a.itemsize for s in a.strides],
            a.dtype, 0, release=lambda: self.released.append("released"))

    def __dlpack_device__(self):
        return _dlpack.KDL_CUDA, 0


def test_put_of_a_dlpack_only_device_array_reads_its_capsule_and_lets_it_go(
        faked, monkeypatch):
    client, server, cuda = faked
    _fake_allocations(monkeypatch, server)
    released = []
    host = np.arange(10, dtype=np.int32).reshape(2, 5)
    x = client.put(_FakeDlpackArray(host, server, released))
    np.testing.assert_array_equal(x.get(), host)
    assert released == ["released"]  # the tensor is deleted once copied
    assert cuda.synchronized == ["device 0"]
    with pytest.raises(TypeError, match="is not contiguous"):
        client.put(_FakeDlpackArray(host[:, ::2], server, released))
    assert released == ["released"] * 2
    assert _dlpack._live == {}


def test_put_of_a_non_contiguous_device_array_is_refused_before_any_call(faked, monkeypatch):
    client, server, cuda = faked
    _fake_allocations(monkeypatch, server)
    with pytest.raises(TypeError, match=r"the device array \(shape \(3, 2\), strides \(4, 2\) "
                                        r"in elements\) is not contiguous; make it so on the "
                                        r"device first"):
        client.put(_FakeDeviceArray(np.arange(12.0).reshape(3, 4)[:, ::2], server))
    assert _methods(server) == []
    assert client.buffers() == []


def test_from_dlpack_takes_device_arrays_and_uploads_host_ones(faked, monkeypatch):
    client, server, cuda = faked
    _fake_allocations(monkeypatch, server)
    x = gpucompute.from_dlpack(_FakeDeviceArray(np.arange(3, dtype=np.int64), server), client)
    np.testing.assert_array_equal(x.get(), [0, 1, 2])
    y = gpucompute.from_dlpack(np.arange(4.0), client, name="host")
    assert y.name == "host"
    np.testing.assert_array_equal(y.get(), np.arange(4.0))


# --- The CPU backend ----------------------------------------------------------------

_CPU_MESSAGE = ("FAILED_PRECONDITION: zero-copy needs the server's CUDA backend, and it runs "
                "the cpu backend: the buffer is in host memory there; download it with get() "
                "or np.asarray()")


@pytest.mark.parametrize("flags", [(), ("--allow-cuda-ipc",)])
def test_the_cpu_backend_refuses_every_zero_copy_path_and_changes_nothing(flags, request):
    # The last --backend wins: this one runs the CPU backend whatever the suite's is.
    with start_server(*flags, "--backend=cpu", memory_limit=64 << 20, cpu_threads=1) as address, \
            gpucompute.connect(address, client_name=client_name_for(request),
                               progress=False) as client:
        x = client.put(np.arange(6.0).reshape(2, 3))
        attempts = [lambda: x.__cuda_array_interface__, lambda: x.__dlpack__(),
                    lambda: x.T.__dlpack_device__(), lambda: x[:, 1].__dlpack__(copy=True),
                    lambda: client.create((2,), "float32", exportable=True)]
        for attempt in attempts:
            with pytest.raises(gpucompute.ZeroCopyError) as error:
                attempt()
            assert str(error.value) == _CPU_MESSAGE
            assert error.value.code.name == "FAILED_PRECONDITION"
            assert isinstance(error.value, BufferError)
        assert [b.id for b in client.buffers()] == [x.id]
        np.testing.assert_array_equal(x.get(), np.arange(6.0).reshape(2, 3))


def test_a_view_of_a_name_cannot_export(faked):
    client, _, _ = faked
    with pytest.raises(TypeError, match="a view of an id or name has no client"):
        gpucompute.View("x").__dlpack__()


# --- On a GPU, with CuPy ------------------------------------------------------------


def _cupy():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no GPU: CuPy sees no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError as error:
        pytest.skip(f"no GPU: {error}")
    return cupy


@pytest.fixture(scope="module")
def cuda_server():
    _cupy()
    with start_server("--backend=cuda", "--allow-cuda-ipc", "--region-idle-timeout=0",
                      memory_limit=1 << 30) as address:
        yield address


@pytest.fixture
def gpu(cuda_server, request):
    cupy = _cupy()
    with gpucompute.connect(cuda_server, client_name=client_name_for(request),
                            progress=False) as client:
        assert client.info().backend == "cuda"
        yield client, cupy
        gc.collect()
        for buffer in client.buffers():
            buffer.delete()


def test_gpu_cupy_maps_an_exportable_buffer_and_its_views(gpu):
    client, cupy = gpu
    host = np.random.default_rng(1).standard_normal((64, 48)).astype(np.float32)
    x = client.create(host.shape, "float32", exportable=True)
    client.put(host, into=x)
    client.eval("2*x + 1", x=x, out=x)  # the export waits for this writer
    expected = 2 * host + 1
    mapped = cupy.asarray(x)
    np.testing.assert_array_equal(cupy.asnumpy(mapped), expected)
    np.testing.assert_array_equal(cupy.asnumpy(mapped), x.get())
    np.testing.assert_array_equal(cupy.asnumpy(cupy.asarray(x[:, ::2])), expected[:, ::2])
    np.testing.assert_array_equal(cupy.asnumpy(cupy.asarray(x.T)), expected.T)
    np.testing.assert_array_equal(cupy.asnumpy(cupy.asarray(x[1::3, 5])), expected[1::3, 5])


def test_gpu_writes_through_the_mapping_are_the_servers_after_synchronize(gpu):
    client, cupy = gpu
    x = client.create((1000,), "float64", fill=1.0, exportable=True)
    mapped = cupy.asarray(x)
    mapped *= 3
    cupy.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(x.get(), np.full(1000, 3.0))
    y = client.eval("x + 1", x=x)
    np.testing.assert_array_equal(y.get(), np.full(1000, 4.0))


def test_gpu_the_export_keeps_the_memory_after_the_buffer_is_deleted(gpu):
    client, cupy = gpu
    x = client.create((256,), "int32", fill=7, exportable=True)
    mapped = cupy.asarray(x)
    x.delete()
    with pytest.raises(gpucompute.NotFoundError):
        client.buffer(x.id)
    # Another buffer takes memory meanwhile; the mapping still reads the old values.
    client.create((256,), "int32", fill=9)
    np.testing.assert_array_equal(cupy.asnumpy(mapped), np.full(256, 7, np.int32))
    del x
    gc.collect()
    np.testing.assert_array_equal(cupy.asnumpy(mapped), np.full(256, 7, np.int32))


def test_gpu_cupy_from_dlpack_copies_a_plain_buffer_on_the_device(gpu):
    client, cupy = gpu
    host = np.arange(40, dtype=np.int64).reshape(5, 8)
    x = client.put(host)
    with pytest.raises(gpucompute.ZeroCopyError, match="was not created exportable"):
        cupy.asarray(x)
    copied = cupy.from_dlpack(x[1:, ::2])
    np.testing.assert_array_equal(cupy.asnumpy(copied), host[1:, ::2])
    assert len(client.buffers()) == 2
    del copied
    gc.collect()
    _eventually(lambda: [b.id for b in client.buffers()] == [x.id])


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool"])
def test_gpu_put_of_a_cupy_array_round_trips_byte_for_byte(gpu, dtype):
    client, cupy = gpu
    host = (np.random.default_rng(2).standard_normal((33, 17)) * 100).astype(dtype)
    device = cupy.asarray(host)
    x = client.put(device[1:])
    assert x.get().tobytes() == host[1:].tobytes()
    f = client.put(cupy.asfortranarray(device))
    assert f.layout == "F"
    np.testing.assert_array_equal(f.get(), host)
    with pytest.raises(TypeError, match="is not contiguous"):
        client.put(device[:, ::2])
    np.testing.assert_array_equal(gpucompute.from_dlpack(device, client).get(), host)


def test_gpu_torch_from_dlpack(gpu):
    client, _ = gpu
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    x = client.create((4, 6), "float32", fill=1.5, exportable=True)
    tensor = torch.from_dlpack(x)
    assert tensor.device.type == "cuda"
    np.testing.assert_array_equal(tensor.cpu().numpy(), np.full((4, 6), 1.5, np.float32))
    np.testing.assert_array_equal(torch.from_dlpack(x.T).cpu().numpy(),
                                  np.full((6, 4), 1.5, np.float32))
    tensor.add_(1)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(x.get(), np.full((4, 6), 2.5, np.float32))
    y = client.put(torch.arange(10, dtype=torch.float64, device="cuda"))
    np.testing.assert_array_equal(y.get(), np.arange(10.0))


def test_gpu_numba_as_cuda_array(gpu):
    client, _ = gpu
    numba_cuda = pytest.importorskip("numba.cuda", reason="Numba is not installed")
    x = client.create((5, 4), "int32", fill=3, exportable=True)
    array = numba_cuda.as_cuda_array(x[:, 1:])
    np.testing.assert_array_equal(array.copy_to_host(), np.full((5, 3), 3, np.int32))


def test_gpu_client_and_server_are_on_one_host(gpu):
    client, _ = gpu
    info = client.info()
    assert (info.hostname, info.boot_id) == (socket.gethostname(), _shm.boot_id())
