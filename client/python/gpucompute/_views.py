"""Views: a remote array seen through NumPy's basic indexing and shape functions
(x[0:10, ::2], x[-1], x[..., None], x.T, x.transpose, x.reshape, x.squeeze,
x.expand_dims, x.broadcast_to), with no server call and no copy.

A View carries its buffer and the ViewSteps that make it; a request that is given a
View sends both, and the server resolves them when it checks the request. Its shape is
computed here from the handle's, as NumPy gives it, so that a step that does not apply
raises at once (IndexError or ValueError, as NumPy's). A View of a plain id or name
(View("x")) has no known shape: the server checks it.
"""

from __future__ import annotations

import numbers
import operator
from typing import Any, Iterable, Optional, Tuple

import numpy as np
import numpy.typing as npt

from ._operators import ArrayOperators
from ._proto import v1
from ._protocols import ZeroCopyMethods
from ._types import Progress

# What a view-making method takes as axes or extents: f(1, 2) or f((1, 2)).
_Ints = Any


def _integer(value, what):
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {type(value).__name__}") from None


def _int_list(values, what):
    """Arguments given as f(1, 2) or f((1, 2)), as NumPy's shape functions take them."""
    if len(values) == 1 and not isinstance(values[0], numbers.Integral) \
            and not isinstance(values[0], np.integer):
        values = tuple(values[0])
    return [_integer(value, what) for value in values]


_AxisError = getattr(np, "exceptions", np).AxisError


def _normalize_axis(axis, ndim):
    if not -ndim <= axis < ndim:
        raise _AxisError(axis, ndim)
    return axis % ndim


def _axes(axes, ndim):
    normalized = [_normalize_axis(axis, ndim) for axis in axes]
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"repeated axis in {tuple(axes)}")
    return normalized


def slice_of(part):
    """The Python slice of an IndexItem's slice."""
    return slice(part.start if part.HasField("start") else None,
                 part.stop if part.HasField("stop") else None,
                 part.step if part.HasField("step") else None)


def _index_shape(items, shape):
    consumed = sum(1 for item in items if item.WhichOneof("item") in ("index", "slice"))
    if sum(1 for item in items if item.WhichOneof("item") == "ellipsis") > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consumed > len(shape):
        raise IndexError(f"too many indices for array: array is {len(shape)}-dimensional, "
                         f"but {consumed} were indexed")
    result = []
    axis = 0
    for item in items:
        which = item.WhichOneof("item")
        if which == "index":
            if not -shape[axis] <= item.index < shape[axis]:
                raise IndexError(f"index {item.index} is out of bounds for axis {axis} with "
                                 f"size {shape[axis]}")
            axis += 1
        elif which == "slice":
            result.append(len(range(*slice_of(item.slice).indices(shape[axis]))))
            axis += 1
        elif which == "new_axis":
            result.append(1)
        else:
            whole = len(shape) - consumed
            result.extend(shape[axis:axis + whole])
            axis += whole
    return tuple(result) + tuple(shape[axis:])


def _reshape_shape(extents, shape):
    size = int(np.prod(shape, dtype=object))
    unknown = [i for i, extent in enumerate(extents) if extent == -1]
    if len(unknown) > 1 or any(extent < -1 for extent in extents):
        raise ValueError("can only specify one unknown dimension")
    known = int(np.prod([extent for extent in extents if extent != -1], dtype=object))
    if unknown and known and size % known == 0:
        return tuple(size // known if extent == -1 else extent for extent in extents)
    if unknown or known != size:
        raise ValueError(f"cannot reshape array of size {size} into shape {tuple(extents)}")
    return tuple(extents)


def view_shape(shape, steps):
    """The shape of `steps` applied in order to an array of `shape`, as NumPy gives it."""
    shape = tuple(int(extent) for extent in shape)
    for step in steps:
        which = step.WhichOneof("step")
        if which == "index":
            shape = _index_shape(step.index.items, shape)
        elif which == "transpose":
            axes = list(step.transpose.axes)
            if not axes:
                shape = shape[::-1]
                continue
            if len(axes) != len(shape):
                raise ValueError("axes don't match array")
            shape = tuple(shape[axis] for axis in _axes(axes, len(shape)))
        elif which == "expand_dims":
            ndim = len(shape) + len(step.expand_dims.axes)
            inserted = _axes(step.expand_dims.axes, ndim)
            rest = iter(shape)
            shape = tuple(1 if axis in inserted else next(rest) for axis in range(ndim))
        elif which == "squeeze":
            listed = _axes(step.squeeze.axes, len(shape))
            for axis in listed:
                if shape[axis] != 1:
                    raise ValueError("cannot select an axis to squeeze out which has size not "
                                     "equal to one")
            shape = tuple(extent for axis, extent in enumerate(shape)
                          if not (axis in listed or (not listed and extent == 1)))
        elif which == "broadcast_to":
            target = tuple(step.broadcast_to.extents)
            fits = len(target) >= len(shape) and all(
                extent in (1, to) for extent, to in zip(shape[::-1], target[::-1]))
            if not fits:
                raise ValueError(f"operands could not be broadcast together with remapped "
                                 f"shapes [original->remapped]: {shape} and requested shape "
                                 f"{target}")
            shape = target
        elif which == "reshape":
            shape = _reshape_shape(list(step.reshape.extents), shape)
    return shape


def _host_integers(key):
    if isinstance(key, np.ndarray):
        return key.dtype.kind in "iu"
    if isinstance(key, list):
        return bool(key) and all(isinstance(k, (numbers.Integral, np.integer))
                                 and not isinstance(k, (bool, np.bool_)) for k in key)
    return False


def _is_blocking(array):
    """Whether `array` is of the blocking client, its shape known here."""
    from .client import Client  # pylint: disable=import-outside-toplevel
    _, _, shape, client = array._view_parts()
    return isinstance(client, Client) and shape is not None


def _advanced_hint(key):
    """What NumPy's advanced indexing would have been, and what to use instead."""
    dtype = getattr(key, "dtype", None)
    if dtype is None and isinstance(key, (list, tuple)) and key:
        dtype = np.asarray(key).dtype
    if dtype is None:
        return ""
    if np.dtype(dtype).kind == "b":
        return ("; a boolean mask's result has a shape that depends on the values, which "
                "remote arrays do not compute: np.where(mask, x, 0) keeps the shape")
    return ("; integer arrays index only alone (x[[0, 2]], as np.take along the first "
            "axis), not within a tuple")


def _index_item(key):
    item = v1.IndexItem()
    if key is None:
        item.new_axis = True
    elif key is Ellipsis:
        item.ellipsis = True
    elif isinstance(key, slice):
        for part in ("start", "stop", "step"):
            value = getattr(key, part)
            if value is not None:
                setattr(item.slice, part, _integer(value, f"a slice's {part}"))
        if item.slice.HasField("step") and item.slice.step == 0:
            raise ValueError("slice step cannot be zero")
        item.slice.SetInParent()
    elif isinstance(key, (bool, np.bool_)) or not isinstance(key, (numbers.Integral, np.integer)):
        raise IndexError("views take basic indexing only: integers, slices, None and "
                         f"'...', not {type(key).__name__}{_advanced_hint(key)}")
    else:
        item.index = int(key)
    return item


def _needs_copy(view):
    """Whether `view` is a reshape that its strides do not allow, of an array of the
    blocking client whose buffer's shape and layout are known without a call."""
    # pylint: disable=import-outside-toplevel
    from . import _strides
    from ._arrays import RemoteArrayInfo
    from .client import Client
    base = view.base
    if not isinstance(view._client, Client) or not isinstance(base, RemoteArrayInfo):
        return False
    try:
        _strides.view_layout(base.shape, base.layout, view.steps)
    except ValueError:
        return True
    return False


def _c_ordered_copy(array):
    """A C-ordered copy of a remote array of the blocking client: pending, unless the
    server would keep an F buffer's order, then written into a new C buffer."""
    # pylint: disable=import-outside-toplevel
    from . import _creation, _functions
    copy = array.copy()
    if copy.layout == "C":
        return copy
    out = _creation.empty(array.shape, array.dtype, client=array._client)
    return _functions.write(out, "", [array], what="reshape")


class ViewMethods:
    """NumPy's view-making methods, for handles and views alike. A class using it has
    `_view_parts()`: the buffer reference, the steps so far, the shape (or None when
    unknown) and the client (or None)."""

    def _view_parts(self):
        raise NotImplementedError

    def _with_step(self, step):
        base, steps, shape, client = self._view_parts()
        steps = steps + (step,)
        if shape is not None:
            shape = view_shape(shape, (step,))
        return View(base, steps, shape=shape, dtype=getattr(self, "dtype", None), client=client)

    def __getitem__(self, key: Any) -> Any:
        """Basic indexing gives a View, with no call; host integers (a list or an array)
        select along the first axis as np.take does, into a new buffer."""
        if _host_integers(key) and _is_blocking(self):
            from . import _composed  # pylint: disable=import-outside-toplevel
            return _composed.take(self, key, axis=0)
        step = v1.ViewStep()
        step.index.SetInParent()
        keys = key if isinstance(key, tuple) else (key,)
        step.index.items.extend(_index_item(item) for item in keys)
        return self._with_step(step)

    @property
    def T(self) -> View:
        """The transpose (axes reversed): a View, made here without a server call."""
        step = v1.ViewStep()
        step.transpose.SetInParent()
        return self._with_step(step)

    def transpose(self, *axes: _Ints) -> View:
        """NumPy's transpose, as a View made here without a server call."""
        step = v1.ViewStep()
        step.transpose.axes.extend(_int_list(axes, "an axis") if axes else [])
        step.transpose.SetInParent()
        return self._with_step(step)

    def reshape(self, *shape: _Ints) -> Any:
        """NumPy's reshape: a View made here without a server call where the strides
        allow it. Where they do not, as NumPy, a reshaped copy (a pending copy on the
        server), for an array of the blocking client whose buffer's shape and layout are
        known here; a View of an id or name is checked by the server when used."""
        view = self._reshaped(shape)
        if _needs_copy(view):
            return _c_ordered_copy(self).reshape(*shape)
        return view

    def reshape_view(self, *shape: _Ints) -> View:
        """The reshape as a View, never a copy: where the strides do not allow it,
        ValueError for an array whose buffer's shape and layout are known here, else
        the server's INVALID_ARGUMENT when the view is used."""
        view = self._reshaped(shape)
        if _needs_copy(view):
            raise ValueError(f"cannot reshape a view of shape {self._view_parts()[2]} into "
                             f"shape {view.shape} without copying its elements")
        return view

    def _reshaped(self, shape):
        step = v1.ViewStep()
        step.reshape.extents.extend(_int_list(shape, "an extent"))
        step.reshape.SetInParent()
        return self._with_step(step)

    def ravel(self) -> Any:
        """NumPy's ravel: reshape(-1), a View where the strides allow it, else a copy."""
        return self.reshape(-1)

    def swapaxes(self, axis1: int, axis2: int) -> View:
        """NumPy's swapaxes, as a View made here without a server call."""
        shape = self._view_parts()[2]
        if shape is None:
            raise TypeError("swapaxes: a View of an id or name has no known shape")
        axes = list(range(len(shape)))
        a, b = (_normalize_axis(int(axis), len(shape)) for axis in (axis1, axis2))
        axes[a], axes[b] = axes[b], axes[a]
        return self.transpose(axes)

    def squeeze(self, axis: Optional[_Ints] = None) -> View:
        """NumPy's squeeze, as a View made here without a server call."""
        step = v1.ViewStep()
        if axis is not None:
            step.squeeze.axes.extend(_int_list((axis,), "an axis"))
        step.squeeze.SetInParent()
        return self._with_step(step)

    def expand_dims(self, axis: _Ints) -> View:
        """NumPy's expand_dims, as a View made here without a server call."""
        step = v1.ViewStep()
        step.expand_dims.axes.extend(_int_list((axis,), "an axis"))
        step.expand_dims.SetInParent()
        return self._with_step(step)

    def broadcast_to(self, *shape: _Ints) -> View:
        """NumPy's broadcast_to, as a read-only View made here without a server call."""
        step = v1.ViewStep()
        extents = _int_list(shape, "an extent")
        if any(extent < 0 for extent in extents):
            raise ValueError("all elements of broadcast shape must be non-negative")
        step.broadcast_to.extents.extend(extents)
        step.broadcast_to.SetInParent()
        return self._with_step(step)


class View(ViewMethods, ArrayOperators, ZeroCopyMethods):
    """A view of a remote array: its buffer and the steps that make the view.

    Usable wherever a buffer is passed: eval's inputs and `out=`, reduce, gemv, matmul,
    download (a NumPy array of the view's shape, its elements in C order). get() and
    np.asarray() download it, from a view of a handle. View("x") views the buffer named
    "x" (any id or name), its shape unknown here. A view of a handle takes NumPy's
    operators and functions as the handle does (gpucompute._operators); a view of one
    element converts with float(), int() and bool() (a download). Making one, and
    reading its shape, dtype, ndim and size, never calls the server.
    """

    def __init__(self, base: Any, steps: Iterable[Any] = (), *,
                 shape: Optional[Iterable[int]] = None, dtype: npt.DTypeLike = None,
                 client: Any = None) -> None:
        self.base = base
        self.steps: Tuple[Any, ...] = tuple(steps)
        self.shape: Optional[Tuple[int, ...]] = None if shape is None else tuple(shape)
        self.dtype: Any = dtype
        self._client = client

    def _view_parts(self):
        return self.base, self.steps, self.shape, self._client

    @property
    def ndim(self) -> Optional[int]:
        """The number of axes; None for a View of an id or name."""
        return None if self.shape is None else len(self.shape)

    @property
    def size(self) -> Optional[int]:
        """The number of elements; None for a View of an id or name."""
        return None if self.shape is None else int(np.prod(self.shape, dtype=np.int64))

    def get(self, *, progress: Progress = None, transport: Optional[str] = None) -> Any:
        """Downloads the view as a NumPy array, blocking until it is here, once the
        operations sent before have run (with the asyncio client: a coroutine of it)."""
        if self._client is None:
            raise TypeError("a view of an id or name has no client: pass it to "
                            "client.download()")
        return self._client.download(self, progress=progress, transport=transport)

    def __array__(self, dtype: npt.DTypeLike = None,
                  copy: Optional[bool] = None) -> npt.NDArray[Any]:
        if copy is False:
            raise ValueError("a View has no host memory to view: converting it downloads a "
                             "copy (use copy=None or True, or get())")
        array = self.get()
        return array if dtype is None else array.astype(dtype, copy=False)

    def __repr__(self) -> str:
        base = getattr(self.base, "id", self.base)
        shape = "" if self.shape is None else f" shape={self.shape}"
        return f"<View of {base}{shape} steps={len(self.steps)}>"


def array_parts(value):
    """(buffer id or name, view steps) of a handle, a View, an id or a name."""
    from ._arrays import buffer_ref
    if isinstance(value, View):
        return buffer_ref(value.base), value.steps
    return buffer_ref(value), ()


def download_transport(value, transport):
    """A view downloads over gRPC: shared memory copies whole byte ranges."""
    if isinstance(value, View) and value.steps:
        if transport == "shm":
            raise ValueError("a view downloads over grpc: shm copies whole byte ranges")
        return "grpc"
    return transport
