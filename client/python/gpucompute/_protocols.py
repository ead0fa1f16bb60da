"""The array-exchange protocols of handles and Views: __cuda_array_interface__ and
DLPack, implemented in _interop (imported when first used, since _interop needs the
modules that import this one)."""

from __future__ import annotations

from typing import Any, Optional, Tuple


class ZeroCopyMethods:
    """__cuda_array_interface__, __dlpack__ and __dlpack_device__ for handles and Views
    of one, through CUDA IPC: for consumers on the server's host (gpucompute._interop
    says how, client/python/README.md the rules)."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3, of the buffer itself: its memory is shared, never copied (a buffer
        not created exportable raises ZeroCopyError). The values are ready on return,
        and the handle keeps the mapping: consumers keep the object they read this from."""
        from . import _interop
        return _interop.interface(self)

    def __dlpack_device__(self) -> Tuple[int, int]:
        from . import _interop
        return _interop.dlpack_device(self)

    def __dlpack__(self, *, stream: Any = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None,
                   copy: Optional[bool] = None) -> Any:
        """A DLPack capsule of the buffer itself, or, where it was not created exportable
        (and copy is not False) or copy is True, of a copy made on the device. The values
        are ready on return, for any `stream`. Versioned (DLPack 1.0) when max_version
        allows; a copy is then flagged as one."""
        from . import _interop
        return _interop.capsule(self, stream, max_version, dl_device, copy)
