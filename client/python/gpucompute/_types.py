"""The aliases the public API's annotations use. They describe what the calls accept;
nothing here runs or checks anything."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

if TYPE_CHECKING:
    from ._arrays import RemoteArrayInfo, TaggedOutput
    from ._views import View
    from .client import RemoteArray

__all__ = ["Array", "ArrayLike", "ArrayRef", "Axis", "DTypeLike", "Message", "Progress",
           "Scalar", "ShapeLike", "StreamRef"]

ShapeLike = Union[int, Sequence[int]]
# What NumPy's operators take besides arrays: Python scalars (weak, NEP 50) and NumPy
# scalars (strong).
Scalar = Union[bool, int, float, np.generic]
# An array of the NumPy layer: a handle (RemoteArray, or the arrays operators make), or
# a View of one.
Array = Union["RemoteArray", "View"]
# A remote array where a request reads or writes one: a handle, a View of one, a
# buffer's id or name, or (in the same session or chain) a Pending or a Step.
ArrayRef = Union["RemoteArrayInfo", "View", "TaggedOutput", str]
# None or an int (negative counts from the end), or a tuple of them.
Axis = Union[int, Tuple[int, ...], None]
# A transfer's progress: True or False, a callable (done_bytes, total_bytes), or None
# for the client's default.
Progress = Union[bool, Callable[[int, int], object], None]
# A message of gpucompute.v1: its classes are built at import from the shipped
# descriptor, so type checkers see them as Any.
Message = Any
# A stream: a StreamInfo, its id, or None for the default stream.
StreamRef = Union[str, Message, None]
