"""Zero-copy into CuPy, PyTorch and Numba: the structures of __cuda_array_interface__
and DLPack, view layouts and the CUDA runtime's IPC calls.

Checked against NumPy's own conventions and its DLPack consumer, with pointers into
host memory: no GPU needed.
"""

import ctypes
import gc
import types

import numpy as np
import pytest
from gpucompute import _cuda, _dlpack, _strides
from gpucompute._views import ViewMethods

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
                                        "cudaIpcCloseMemHandle", "cudaStreamSynchronize")})
    runtime = _cuda._CtypesRuntime(library)
    assert runtime.open_handle(handle) == 0x1234
    assert opened == [(handle, 1)]  # with cudaIpcMemLazyEnablePeerAccess
    assert runtime.get_handle(0x5678) == handle
