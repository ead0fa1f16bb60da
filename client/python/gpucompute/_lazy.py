"""Lazy fusion: elementwise operations on remote arrays build one expression tree in the
client, sent as one ElementwiseOp (one kernel) when its result is needed; a reduction of
a pending tree is one ReduceOp over the expression (one fused map-reduce pass).

A tree's leaves are buffers and views of them (one operand each, however often used),
Python scalars (literals: weak, NEP 50), NumPy scalars (cast literals: strong) and 0-d
arrays (operands: strong). Nothing is sent until:
  - the result is reduced, multiplied (@, matmul, dot), indexed or viewed;
  - it is downloaded (get(), np.asarray, float(), int(), bool(), a repr never);
  - it is named, or asked for: x.compute(), gpucompute.evaluate(...);
  - a buffer it reads is about to be written (out=, in-place operators, x[...] = v);
  - the tree would pass MAX_DEPTH levels, MAX_SIZE nodes (a subtree used twice counts
    twice: its text is repeated) or MAX_LEAVES arrays: the argument that is too large is
    sent first and read as a buffer.
Shapes that do not broadcast and dtypes the server refuses raise at the line (ValueError,
TypeError); what only the server can check (memory, limits, a buffer deleted meanwhile)
raises at the submission, and a failure while running at the first use of the result.
"""

from __future__ import annotations

import html
import math
import numbers
import threading
import weakref
from typing import Any, Iterable, Optional, Tuple

import numpy as np
import numpy.typing as npt

from . import _dispatch, _ufuncs
from ._arrays import RemoteArrayInfo, numpy_dtype
from ._requests import elementwise_request
from ._types import Progress
from ._views import View
from .client import Client, RemoteArray

MAX_DEPTH = 32
MAX_SIZE = 512
MAX_LEAVES = 16


class Node:
    """One function of its arguments (Nodes, Leaves, Scalars); `fn` "" is the identity."""

    __slots__ = ("fn", "args", "type", "shape", "depth", "size", "leaves")

    def __init__(self, fn, args, type_, shape):
        self.fn = fn
        self.args = args
        self.type = type_
        self.shape = shape
        self.depth = 1 + max(arg.depth for arg in args)
        self.size = 1 + sum(arg.size for arg in args)
        self.leaves = {}
        for arg in args:
            self.leaves.update(arg.leaves)

    def text(self, names):
        parts = [arg.text(names) for arg in self.args]
        if not self.fn:
            return parts[0]
        symbol = _ufuncs.OPERATORS.get(self.fn)
        if symbol is not None and len(parts) == 2:
            return f"({parts[0]} {symbol} {parts[1]})"
        if self.fn == "invert":
            return f"(~{parts[0]})"
        return f"{self.fn}({', '.join(parts)})"


class Leaf:
    """A buffer, or a view of one, read by an expression. `owner` keeps the array (and so
    its buffer) alive until the expression is sent."""

    __slots__ = ("ref", "steps", "owner", "type", "shape", "key")
    depth = 0
    size = 1

    def __init__(self, ref, steps, owner, dtype, shape):
        self.ref, self.steps, self.owner = ref, tuple(steps), owner
        self.type, self.shape = dtype, tuple(shape)
        self.key = (ref, b"".join(step.SerializeToString() for step in self.steps))

    @property
    def leaves(self):
        return {self.key: self}

    def text(self, names):
        return names[self.key]


class Scalar:
    """A Python scalar (weak: a literal) or a NumPy scalar (strong: a cast literal).
    NaN and infinities have no literal: they are scalar inputs (weak) of the operation."""

    __slots__ = ("value", "type")
    depth = 0
    size = 1
    shape = ()
    leaves = {}

    def __init__(self, value, type_):
        self.value, self.type = value, type_

    def text(self, names):
        value = self.value
        if isinstance(value, (bool, np.bool_)):
            literal = "True" if value else "False"
        elif isinstance(value, (numbers.Integral, np.integer)):
            literal = str(int(value))
        elif math.isfinite(value):
            literal = repr(float(value)).replace("e+", "e")
        else:
            literal = names.scalar(float(value))
        if literal.startswith("-"):
            literal = f"({literal})"
        return literal if _ufuncs.is_weak(self.type) else f"{self.type.name}({literal})"


class _Names(dict):
    """The input names of an expression: leaf key -> name; `inputs` binds them."""

    def __init__(self, leaves):
        super().__init__()
        self.inputs = {}
        for index, (key, leaf) in enumerate(leaves.items()):
            self[key] = f"a{index}"
            self.inputs[f"a{index}"] = View(leaf.ref, leaf.steps)

    def scalar(self, value):
        name = f"s{len(self.inputs)}"
        self.inputs[name] = value
        return name


def emit(node):
    """(expression, inputs) of a tree: each distinct buffer or view one input."""
    names = _Names(node.leaves)
    return node.text(names), names.inputs


# The unsent arrays of each client, so that a write to a buffer first sends the
# expressions that read it (they must see the values from before the write).
_unsent = weakref.WeakKeyDictionary()
_unsent_lock = threading.Lock()


def _track(client, array):
    with _unsent_lock:
        arrays = _unsent.setdefault(client, {})
        key = id(array)
        arrays[key] = weakref.ref(array, lambda _, key=key, arrays=arrays: arrays.pop(key, None))


def before_write(client, ref):
    """Sends every unsent expression of `client` that reads buffer `ref`."""
    with _unsent_lock:
        arrays = [entry() for entry in _unsent.get(client, {}).values()]
    for array in arrays:
        node = getattr(array, "_node", None) if array is not None else None
        if node is not None and any(key[0] == ref for key in node.leaves):
            array._materialize()


def _untrack(client, array):
    with _unsent_lock:
        _unsent.get(client, {}).pop(id(array), None)


class LazyArray(RemoteArray):
    """A RemoteArray made by the array layer: an expression not yet sent, or the output
    of an operation sent (perhaps still running), or a buffer it created.

    Its shape and dtype are known without asking the server. Its buffer is freed when
    the array is garbage collected, unless it was named (x.compute(name="y")). Reading
    `id`, `info` or `operation` sends the expression; `operation` also waits for it.
    The other properties are known here, without a call.
    """

    __array_priority__ = 100

    def __init__(self, client: Client, *, node: Optional[Node] = None, pending: Any = None,
                 shape: Optional[Iterable[int]] = None, dtype: npt.DTypeLike = None,
                 owned: bool = True) -> None:  # pylint: disable=super-init-not-called
        self._client = client
        self._node = node
        self._pending = None
        self._name = None
        self._visible = None  # the buffer id, once found outside the session
        self.transfer = None
        # The layout the server gives the buffer, known without a call (see layout); an
        # expression's is worked out when first asked for, or when it is sent.
        self._layout = None if node is not None else "C"
        if node is not None:
            self._shape, self._dtype = node.shape, node.type
            _track(client, self)
        else:
            self._shape, self._dtype = tuple(shape), np.dtype(dtype)
            self._set_pending(pending, owned)

    def _set_pending(self, pending, owned):
        self._pending = pending
        if owned:
            self._finalizer = weakref.finalize(self, _dispatch.release, weakref.ref(self._client),
                                               pending)

    def _ref(self):
        """The reference to the buffer in the array layer's requests (sends, never
        waits)."""
        return _dispatch.reference(self._materialize())

    def _materialize(self, name=None):
        """Sends the expression, if not yet sent; returns the Pending."""
        if self._node is not None:
            node = self._node
            if self._layout is None:
                self._layout = _new_output_layout(node)
            expression, inputs = emit(node)
            request = elementwise_request(expression, inputs, name=name)
            pending = _dispatch.submit(self._client, request)
            self._node = None
            _untrack(self._client, self)
            self._name = name
            self._set_pending(pending, owned=name is None)
        return self._pending

    def compute(self, name: Optional[str] = None) -> LazyArray:
        """Sends the pending expression now (as one operation, without waiting for it),
        into a new buffer named `name` if given (a named result outlives the array);
        returns self."""
        if self._node is None and name is not None:
            raise ValueError("the array is already computed; name it with "
                             "client.eval('x', x=array, name=...)")
        self._materialize(name)
        return self

    @property
    def pending(self) -> bool:
        """Whether the value is not known to be computed (no server call)."""
        return self._node is not None or not self._pending.done()

    @property
    def info(self) -> Any:
        """The BufferInfo message: sends a pending expression and waits for its
        answer."""
        return _dispatch.info_of(self._materialize())

    @property
    def operation(self) -> Any:
        """The Operation message: sends a pending expression and blocks until it is
        done."""
        return self._materialize().result()

    @property
    def id(self) -> str:
        """The buffer's id: sends a pending expression and waits for the server's
        answer."""
        pending = self._materialize()
        if self._visible is None:
            self._visible = pending.buffer_id()
        return self._visible

    @property
    def name(self) -> Optional[str]:
        """The name given to compute(name=...), else None."""
        return self._name

    @property
    def shape(self) -> Tuple[int, ...]:
        """The shape, known here."""
        return self._shape

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self._shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        """The NumPy dtype, known here."""
        return self._dtype

    @property
    def size(self) -> int:
        """The number of elements."""
        return math.prod(self._shape)

    @property
    def nbytes(self) -> int:
        """The size in bytes."""
        return self.size * self._dtype.itemsize

    @property
    def layout(self) -> str:
        """"C" or "F", without a call: an expression's result is C-ordered unless every
        array it reads is a whole buffer of its shape in F order (the server's rule);
        results of reductions and matmul, and created buffers, are C-ordered. Once the
        operation is answered, the buffer's own."""
        if self._node is None and self._pending.done():
            return super().layout
        if self._layout is None:
            self._layout = _new_output_layout(self._node)
        return self._layout

    @property
    def device(self) -> Optional[int]:  # type: ignore[override]
        """The device of the buffer: None until the operation has been answered."""
        if self._node is not None or not self._pending.done():
            return None
        return _dispatch.info_of(self._pending).device

    def get(self, *, progress: Progress = None,
            transport: Optional[str] = None) -> npt.NDArray[Any]:
        """Sends a pending expression, waits for it and downloads the result."""
        _dispatch.refuse_in_trace("a download (np.asarray(), get())")
        self._materialize().result()
        return super().get(progress=progress, transport=transport)

    def delete(self) -> None:
        """Frees the buffer now, a blocking call (an unsent expression is dropped,
        with no call)."""
        if self._node is not None:
            self._node = None
            _untrack(self._client, self)
            return
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer.detach()
        self._client.delete(self.id)

    def _describe(self):
        state = "pending" if self.pending else "materialized"
        where = f"on {self._client.options.target}"
        if self._node is None and self.device:
            where += f" {self.device}"
        return f"shape={self._shape} dtype={self._dtype} {where} {state}"

    def __repr__(self) -> str:
        return f"<RemoteArray {self._describe()}>"

    def _repr_html_(self):
        return f"<b>RemoteArray</b> <code>{html.escape(self._describe())}</code>"


def _new_output_layout(node):
    """The layout the server gives an expression's new output (server/service/
    plan_elementwise.cc, NewOutputLayout): that of its buffer operands where every one is
    a whole buffer of the result's shape in one layout, else C."""
    from . import _strides  # pylint: disable=import-outside-toplevel
    layouts = set()
    for leaf in node.leaves.values():
        base = leaf.owner.base if isinstance(leaf.owner, View) else leaf.owner
        if not isinstance(base, RemoteArrayInfo) or tuple(base.shape) != tuple(node.shape):
            return "C"
        layout = base.layout
        if layout == "C":
            return "C"  # an operand of a C buffer: never all F; no strides to work out
        whole = _strides.dense_layout(base.shape, layout)
        offset, shape, strides = _strides.view_layout(base.shape, layout, leaf.steps)
        if (offset, tuple(shape), tuple(strides)) != whole:
            return "C"
        layouts.add(layout)
    return layouts.pop() if len(layouts) == 1 else "C"


def client_of(*values):
    """The blocking Client that the arrays among `values` belong to."""
    client = None
    for value in values:
        other = getattr(value, "_client", None)
        if isinstance(value, (RemoteArrayInfo, View)):
            if not isinstance(other, Client):
                raise TypeError("NumPy operators need remote arrays of the blocking client "
                                "(gpucompute.connect); the asyncio client has eval()")
            if client is not None and other is not client:
                raise ValueError("the arrays belong to different clients")
            client = other
    return client


def as_term(value, what):
    """A Node, Leaf or Scalar for an operand of `what` (a ufunc's or function's name)."""
    if isinstance(value, LazyArray) and value._node is not None:
        return value._node
    if isinstance(value, RemoteArrayInfo):
        return Leaf(ref_of(value)[0], (), value, value.dtype, value.shape)
    if isinstance(value, View):
        if value.shape is None or value.dtype is None:
            raise TypeError(f"{what}: a View of an id or name has no known shape; view a "
                            "handle (client.buffer(name)[...]) instead")
        ref, steps = ref_of(value)
        return Leaf(ref, steps, value, np.dtype(value.dtype), value.shape)
    weak = _ufuncs.weak_kind(value)
    if weak is not None:
        if weak == "int" and not -2**63 <= value < 2**63:
            raise OverflowError(f"{what}: Python int {value} does not fit int64")
        return Scalar(value, weak)
    strong = _ufuncs.scalar_dtype(value)
    if strong is not None:
        return Scalar(value, strong)
    if isinstance(value, (np.ndarray, list, tuple)):
        raise TypeError(f"{what}: host data cannot be combined with a remote array; "
                        "upload it first (client.put)")
    raise TypeError(f"{what}: unsupported operand {type(value).__name__}")


def ref_of(value):
    """(reference, view steps) of an array for the array layer's requests, without
    waiting: a LazyArray's is its session reference (sent first if pending)."""
    if isinstance(value, View):
        return ref_of(value.base)[0], value.steps
    if isinstance(value, LazyArray):
        return value._ref(), ()
    if isinstance(value, RemoteArrayInfo):
        return value.id, ()
    return value, ()


def operand(value):
    """A request's operand for an array: a View of its reference and steps."""
    return View(*ref_of(value))


def _broadcast(what, shapes):
    # Most operands have one shape, or are scalars: no need for NumPy's general rule.
    arrays = [shape for shape in shapes if shape != ()]
    if all(shape == arrays[0] for shape in arrays[1:]):
        return tuple(arrays[0]) if arrays else ()
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        listed = " ".join(str(tuple(shape)) for shape in shapes)
        raise ValueError(f"{what}: operands could not be broadcast together with shapes "
                         f"{listed}") from None


def _fit(client, terms, values):
    """Sends arguments whose trees are too large to grow further; returns the terms."""
    while True:
        depth = max(term.depth for term in terms)
        size = sum(term.size for term in terms)
        leaves = {}
        for term in terms:
            leaves.update(term.leaves)
        if depth < MAX_DEPTH and size < MAX_SIZE and len(leaves) <= MAX_LEAVES:
            return terms
        index = max(range(len(terms)), key=lambda i: (terms[i].size, terms[i].depth))
        if not isinstance(terms[index], Node):
            return terms  # only leaves: as large as an operation can be
        value = values[index]
        if not isinstance(value, LazyArray):
            value = LazyArray(client, node=terms[index])
        value._materialize()
        values = list(values)
        values[index] = value
        terms = list(terms)
        terms[index] = as_term(value, "")


def apply(fn, values, type_=None, what=None, client=None):
    """The LazyArray of function `fn` of `values` (a ufunc's name, "" for a copy, or a
    cast: bool int32 int64 float32 float64, with `type_` given); `client` where
    `values` are scalars only."""
    what = what or fn
    client = client_of(*values) or client
    terms = [as_term(value, what) for value in values]
    if type_ is None:
        type_ = terms[0].type if not fn else _ufuncs.result_type(fn, [t.type for t in terms])
    shape = _broadcast(what, [term.shape for term in terms])
    terms = _fit(client, terms, values)
    if _ufuncs.is_weak(type_):
        # Only scalars meet here (where(c, 1.0, 0.0)): the result is an array, so strong.
        strong = _ufuncs.WEAK_DTYPES[type_]
        node = Node(_ufuncs.UFUNCS.get(fn, (fn,))[0], tuple(terms), type_, shape)
        return LazyArray(client, node=Node(strong.name, (node,), strong, shape))
    return LazyArray(client, node=Node(_ufuncs.UFUNCS.get(fn, (fn,))[0], tuple(terms), type_,
                                       shape))


def pending_of(value):
    """A LazyArray's Pending, else None."""
    return value._pending if isinstance(value, LazyArray) else None


def array_from(client, pending, shape, dtype, owned=True):
    return LazyArray(client, pending=pending, shape=shape, dtype=dtype, owned=owned)


def created(client, info):
    """The LazyArray of a buffer the array layer created (freed when collected)."""
    return LazyArray(client, pending=_dispatch.Done(info), shape=tuple(info.shape),
                     dtype=numpy_dtype(info.dtype))


def evaluate(*arrays: Any) -> Any:
    """Sends the pending expressions of `arrays` now, each as one operation, without
    waiting for them; returns the array (or the arrays) given."""
    for array in arrays:
        if isinstance(array, LazyArray):
            array._materialize()
    return arrays[0] if len(arrays) == 1 else arrays
