"""The two protocols by which GPU array libraries share memory, written without any of
them: __cuda_array_interface__ (version 3) dictionaries, and DLPack capsules built and read
with ctypes (dlpack.h: DLManagedTensor, and DLManagedTensorVersioned of DLPack 1.0).

Nothing here touches the memory a pointer points to, so all of it runs, and is tested,
without a GPU.
"""

import ctypes
import threading

import numpy as np

# DLDeviceType
KDL_CPU = 1
KDL_CUDA = 2
# DLDataTypeCode
_KDL_INT = 0
_KDL_UINT = 1
_KDL_FLOAT = 2
_KDL_BOOL = 6
_CODES = {"i": _KDL_INT, "u": _KDL_UINT, "f": _KDL_FLOAT, "b": _KDL_BOOL}
_KINDS = {code: kind for kind, code in _CODES.items()}
# DLManagedTensorVersioned.flags
FLAG_READ_ONLY = 1 << 0
FLAG_IS_COPIED = 1 << 1
VERSION = (1, 0)

LEGACY_NAME = b"dltensor"
VERSIONED_NAME = b"dltensor_versioned"
_USED_LEGACY_NAME = b"used_dltensor"
_USED_VERSIONED_NAME = b"used_dltensor_versioned"


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _Deleter)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _Deleter), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


def dl_dtype(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind not in _CODES or dtype.byteorder == ">":
        raise BufferError(f"DLPack has no type for {dtype}")
    return DLDataType(_CODES[dtype.kind], dtype.itemsize * 8, 1)


def numpy_dtype(dl_type):
    kind = _KINDS.get(dl_type.code)
    if kind is None or dl_type.lanes != 1 or dl_type.bits % 8:
        raise BufferError(f"gpucompute has no arrays of DLPack type code {dl_type.code}, "
                          f"{dl_type.bits} bits, {dl_type.lanes} lanes")
    return np.dtype(f"{kind}{dl_type.bits // 8}" if kind != "b" else "?")


def cuda_array_interface(pointer, shape, strides_bytes, dtype, read_only):
    """A __cuda_array_interface__ dict, version 3. The data are ready when it is returned,
    so it names no stream."""
    return {
        "shape": tuple(shape),
        "typestr": np.dtype(dtype).str,
        "descr": [("", np.dtype(dtype).str)],
        "data": (pointer, bool(read_only)),
        "strides": tuple(strides_bytes),
        "version": 3,
        "stream": None,
    }


# The tensors handed out and not yet deleted, by address: each with the ctypes memory
# its pointers point into, and what releases its device memory.
_live = {}
_live_lock = threading.Lock()


@_Deleter
def _delete_tensor(address):
    """The tensors' deleter, called by whoever owns one once done with it."""
    with _live_lock:
        entry = _live.pop(address, None)
    if entry is not None and entry[-1] is not None:
        entry[-1]()


# Capsules are passed by address (id()): the destructor meets one whose reference count
# is already 0, which a py_object argument would revive and free a second time.
_pythonapi = ctypes.pythonapi
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_pythonapi.PyCapsule_New.restype = ctypes.py_object
_pythonapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CapsuleDestructor]
_pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_pythonapi.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_pythonapi.PyCapsule_SetName.restype = ctypes.c_int
_pythonapi.PyCapsule_SetName.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_pythonapi.PyCapsule_GetName.restype = ctypes.c_char_p
_pythonapi.PyCapsule_GetName.argtypes = [ctypes.c_void_p]


class _Capsule(ctypes.Structure):
    """CPython's PyCapsule, read directly: a consumer may drop a capsule with an
    exception pending, which fails any call into the C API."""
    _fields_ = [("header", ctypes.c_char * object.__basicsize__),  # PyObject_HEAD
                ("pointer", ctypes.c_void_p), ("name", ctypes.c_char_p)]


def _destroy_unconsumed(capsule_address, name):
    capsule = _Capsule.from_address(capsule_address)
    if capsule.name == name:
        _delete_tensor(capsule.pointer)


@_CapsuleDestructor
def _legacy_destructor(capsule_address):
    """A capsule nobody consumed (still named "dltensor") deletes its tensor."""
    _destroy_unconsumed(capsule_address, LEGACY_NAME)


@_CapsuleDestructor
def _versioned_destructor(capsule_address):
    _destroy_unconsumed(capsule_address, VERSIONED_NAME)


def make_capsule(pointer, shape, strides, dtype, device_id, *, release=None, versioned=False,
                 flags=0, device_type=KDL_CUDA):
    """A DLPack capsule of the memory at `pointer` (CUDA memory unless `device_type` says
    otherwise): `strides` in elements. `release` is
    called once, when the consumer deletes the tensor (or nobody consumed the capsule).

    The offset of a view is in the data pointer and byte_offset is 0, as CuPy and
    PyTorch write theirs: consumers that ignore byte_offset exist.
    """
    ndim = len(shape)
    sizes = (ctypes.c_int64 * max(ndim, 1))(*shape)
    steps = (ctypes.c_int64 * max(ndim, 1))(*strides)
    managed = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    tensor = managed.dl_tensor
    tensor.data = pointer
    tensor.device = DLDevice(device_type, device_id)
    tensor.ndim = ndim
    tensor.dtype = dl_dtype(dtype)
    tensor.shape = ctypes.cast(sizes, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = ctypes.cast(steps, ctypes.POINTER(ctypes.c_int64))
    tensor.byte_offset = 0
    address = ctypes.addressof(managed)
    managed.manager_ctx = address
    managed.deleter = _delete_tensor
    if versioned:
        managed.version = DLPackVersion(*VERSION)
        managed.flags = flags
    with _live_lock:
        _live[address] = (managed, sizes, steps, release)
    return _pythonapi.PyCapsule_New(address, VERSIONED_NAME if versioned else LEGACY_NAME,
                                    _versioned_destructor if versioned else _legacy_destructor)


class ImportedTensor:
    """What a consumer reads from a capsule: pointer (data + byte_offset), shape, strides
    in elements (None: C-contiguous), dtype, device (type, id), flags. close() deletes
    the tensor: its producer may then free the memory."""

    def __init__(self, capsule):
        if type(capsule).__name__ != "PyCapsule":
            raise BufferError(f"__dlpack__ returned a {type(capsule).__name__}, not a capsule")
        name = _pythonapi.PyCapsule_GetName(id(capsule))
        if name not in (LEGACY_NAME, VERSIONED_NAME):
            raise BufferError(f"not an unconsumed DLPack capsule (named {name!r})")
        versioned = name == VERSIONED_NAME
        address = _pythonapi.PyCapsule_GetPointer(id(capsule), name)
        kind = DLManagedTensorVersioned if versioned else DLManagedTensor
        self._managed = kind.from_address(address)
        if versioned and self._managed.version.major != VERSION[0]:
            raise BufferError(f"DLPack {self._managed.version.major}.x is not supported")
        # Ours now: the consumer deletes it.
        _pythonapi.PyCapsule_SetName(id(capsule),
                                     _USED_VERSIONED_NAME if versioned else _USED_LEGACY_NAME)
        tensor = self._managed.dl_tensor
        self.pointer = (tensor.data or 0) + tensor.byte_offset
        self.shape = tuple(tensor.shape[k] for k in range(tensor.ndim))
        self.strides = (tuple(tensor.strides[k] for k in range(tensor.ndim))
                        if tensor.strides else None)
        self.device = (tensor.device.device_type, tensor.device.device_id)
        self.flags = self._managed.flags if versioned else 0
        try:
            self.dtype = numpy_dtype(tensor.dtype)
        except BufferError:
            self.close()
            raise

    def close(self):
        managed, self._managed = self._managed, None
        if managed is not None and managed.deleter:
            managed.deleter(ctypes.addressof(managed))
