"""The few CUDA calls that zero-copy needs in the client's process, through ctypes: no
CUDA Python package is required.

The runtime (libcudart) opens and closes IPC mappings and makes IPC handles, as the
server does; it is the copy already loaded in this process when there is one (CuPy's or
PyTorch's: the mappings then live in the same primary context as their arrays), else
one found through $CUDA_HOME, the loader, or the NVIDIA wheels on sys.path; without one,
cupy.cuda.runtime stands in. The driver (libcuda.so.1, installed with the GPU driver)
says which allocation and device a pointer belongs to.
"""

import ctypes
import ctypes.util
import glob
import os
import sys
import threading

# cudaIpcMemLazyEnablePeerAccess: a handle opens on whichever device is current, with
# peer access to the device that holds the memory enabled as needed.
_IPC_LAZY_PEER_ACCESS = 1
# CUpointer_attribute values (cuda.h).
_ATTRIBUTE_DEVICE_ORDINAL = 9
_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10
_ATTRIBUTE_RANGE_START_ADDR = 11
_ATTRIBUTE_RANGE_SIZE = 12
IPC_HANDLE_BYTES = 64


class CudaError(RuntimeError):
    """A CUDA call in this process failed, or CUDA is not available here."""


class _IpcMemHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


def _loaded_runtime_paths():
    """Paths of libcudart already mapped into this process (Linux)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart" in line}
    except OSError:
        return []
    return sorted(path for path in paths if os.path.isabs(path))


def _runtime_candidates():
    yield from _loaded_runtime_paths()
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(variable)
        if root:
            yield from sorted(glob.glob(os.path.join(root, "lib64", "libcudart.so*")))
    found = ctypes.util.find_library("cudart")
    if found:
        yield found
    # The runtime that CuPy's and PyTorch's wheels install (nvidia-cuda-runtime-cu*),
    # and the one older PyTorch wheels carry in torch/lib.
    for entry in sys.path:
        yield from sorted(glob.glob(os.path.join(entry, "nvidia", "cuda_runtime", "lib",
                                                 "libcudart.so*")))
        yield from sorted(glob.glob(os.path.join(entry, "torch", "lib", "libcudart*.so*")))
    yield "/usr/local/cuda/lib64/libcudart.so"


class _CtypesRuntime:
    """libcudart through ctypes."""

    def __init__(self, library):
        self._lib = library
        library.cudaGetErrorName.restype = ctypes.c_char_p
        library.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), _IpcMemHandle,
                                                 ctypes.c_uint]
        library.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
        library.cudaIpcGetMemHandle.argtypes = [ctypes.POINTER(_IpcMemHandle), ctypes.c_void_p]
        library.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
        library.cudaGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]
        library.cudaSetDevice.argtypes = [ctypes.c_int]

    def _check(self, status, call):
        if status != 0:
            name = self._lib.cudaGetErrorName(status).decode(errors="replace")
            self._lib.cudaGetLastError()  # a failed call leaves no error behind for others
            raise CudaError(f"{call} failed: {name}")

    def open_handle(self, handle):
        pointer = ctypes.c_void_p()
        # from_buffer_copy: a handle's bytes include zeros, at which a c_char array's
        # constructor would stop.
        self._check(self._lib.cudaIpcOpenMemHandle(ctypes.byref(pointer),
                                                   _IpcMemHandle.from_buffer_copy(handle),
                                                   _IPC_LAZY_PEER_ACCESS),
                    "cudaIpcOpenMemHandle")
        return pointer.value or 0

    def close_handle(self, pointer):
        self._check(self._lib.cudaIpcCloseMemHandle(pointer), "cudaIpcCloseMemHandle")

    def get_handle(self, pointer):
        handle = _IpcMemHandle()
        self._check(self._lib.cudaIpcGetMemHandle(ctypes.byref(handle), pointer),
                    "cudaIpcGetMemHandle")
        return ctypes.string_at(ctypes.addressof(handle), IPC_HANDLE_BYTES)

    def synchronize_stream(self, stream):
        self._check(self._lib.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def synchronize_device(self, device):
        current = ctypes.c_int()
        self._check(self._lib.cudaGetDevice(ctypes.byref(current)), "cudaGetDevice")
        self._check(self._lib.cudaSetDevice(device), "cudaSetDevice")
        try:
            self._check(self._lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        finally:
            self._lib.cudaSetDevice(current.value)


class _CupyRuntime:
    """cupy.cuda.runtime, where no libcudart could be loaded."""

    def __init__(self, runtime):
        self._runtime = runtime

    def _run(self, call, *args):
        try:
            return getattr(self._runtime, call)(*args)
        except self._runtime.CUDARuntimeError as error:
            raise CudaError(f"{call} failed: {error}") from None

    def open_handle(self, handle):
        return self._run("ipcOpenMemHandle", handle, _IPC_LAZY_PEER_ACCESS)

    def close_handle(self, pointer):
        self._run("ipcCloseMemHandle", pointer)

    def get_handle(self, pointer):
        return bytes(self._run("ipcGetMemHandle", pointer))

    def synchronize_stream(self, stream):
        self._run("streamSynchronize", stream)

    def synchronize_device(self, device):
        current = self._run("getDevice")
        self._run("setDevice", device)
        try:
            self._run("deviceSynchronize")
        finally:
            self._run("setDevice", current)


_lock = threading.Lock()
_runtime = None
_driver = None


def runtime():
    """The CUDA runtime of this process; CudaError naming what was tried if none."""
    global _runtime
    with _lock:
        if _runtime is None:
            tried = []
            for path in _runtime_candidates():
                try:
                    _runtime = _CtypesRuntime(ctypes.CDLL(path))
                    break
                except (OSError, AttributeError):
                    tried.append(path)
            else:
                try:
                    import cupy.cuda.runtime as cupy_runtime
                except ImportError:
                    raise CudaError(
                        "no CUDA runtime in this process: found no libcudart (tried "
                        f"{', '.join(tried) or 'nothing'}; set CUDA_HOME) and CuPy is not "
                        "installed") from None
                _runtime = _CupyRuntime(cupy_runtime)
        return _runtime


def _driver_library():
    global _driver
    with _lock:
        if _driver is None:
            try:
                library = ctypes.CDLL("libcuda.so.1")
            except OSError:
                raise CudaError("the NVIDIA driver (libcuda.so.1) is not installed here") from None
            library.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                                      ctypes.c_uint64]
            library.cuInit(0)
            _driver = library
        return _driver


def _pointer_attribute(pointer, attribute, kind):
    value = kind()
    status = _driver_library().cuPointerGetAttribute(ctypes.byref(value), attribute, pointer)
    if status != 0:
        raise CudaError(f"cuPointerGetAttribute({attribute}) of {pointer:#x} failed with "
                        f"CUresult {status}: not device memory of this process?")
    return value.value


def pointer_device(pointer):
    """The ordinal, in this process, of the device that holds `pointer`."""
    return _pointer_attribute(pointer, _ATTRIBUTE_DEVICE_ORDINAL, ctypes.c_int)


def allocation_of(pointer):
    """(base, size, device) of the allocation `pointer` lies in; CudaError if it cannot be
    exported as a CUDA IPC handle (e.g. memory from a stream-ordered pool)."""
    if not _pointer_attribute(pointer, _ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ctypes.c_int):
        raise CudaError(f"the allocation of {pointer:#x} cannot be shared through CUDA IPC "
                        "(cudaMallocAsync and virtual-memory allocations cannot); allocate it "
                        "with cudaMalloc, e.g. CuPy's and PyTorch's default allocators")
    base = _pointer_attribute(pointer, _ATTRIBUTE_RANGE_START_ADDR, ctypes.c_uint64)
    size = _pointer_attribute(pointer, _ATTRIBUTE_RANGE_SIZE, ctypes.c_size_t)
    return base, size, pointer_device(pointer)
