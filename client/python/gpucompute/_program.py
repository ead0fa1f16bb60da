"""Programs: a Python function of remote arrays, traced once into a chain
(SessionService.RunChain) and run again as that chain, so that the server keeps it
prepared (on CUDA, as CUDA graphs) and runs it as one operation.

    @gpucompute.program
    def step(x, y):
        return np.sqrt(x * x + y * y), (x - x.mean()) @ y.T

    r, p = step(x, y)       # traces step, runs the chain: r and p are the program's
    r, p = step(x, y)       # the same bytes again: prepared (step.prepared is True)

Tracing. The first call with arguments of given shapes, dtypes and view steps calls the
function with stand-ins for the arrays; everything the NumPy layer would send (operators,
ufuncs, reductions, matmul, in-place writes, views) becomes a step of one ChainRequest
instead, tagged "#1", "#2", ... and reading earlier steps by tag. Nothing runs while
tracing. What needs a value that only a run makes (a download, float(), int(), bool(),
so Python control flow on an array's values, an array's id or Operation), or that would
differ from run to run (creating an array, random numbers), raises TypeError naming it.
Arguments that are not remote arrays are constants of the trace: another value traces
again.

Outputs. The arrays the function returns (one, a tuple or a list of them, or None) are
written into buffers the program creates with the trace and owns: each run writes the
same buffers and returns the same arrays, so a run overwrites the previous run's results
(as CUDA graphs' static outputs are): copy one (y.copy()) to keep it. Writes the function
makes through its arguments (x += 1, out=x[k]) happen at every run.

Runs. A call serializes the chain for its argument buffers once and then sends those
bytes; the server prepares a chain it sees again byte for byte, so the second run on the
same buffers is prepared, a run on other buffers (of the same shapes) is not, and their
own second run is. Only chains whose temporaries are small are kept prepared (see
RunChain); larger ones still run as one call. Before a run, the client's pending work
that reads a buffer the program writes is sent, and every operation sent so far is
waited for, as the client's own calls do.
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Callable, Optional

import numpy as np
from google.protobuf.descriptor import FieldDescriptor

from . import _dispatch, _lazy, _operations
from ._arrays import RemoteArrayInfo, TaggedOutput
from ._proto import v1
from ._requests import elementwise_request
from ._views import View

# The serialized chains kept per trace, one per set of argument buffers.
_MAX_KEPT_REQUESTS = 16
# The output field of each kind of step.
_OUTPUT_FIELDS = {"elementwise": "output", "reduce": "output", "matmul": "c", "gemv": "y"}


class _Traced(TaggedOutput):
    """The Pending of an array of a trace: a step's output (`tag` set), an argument's
    stand-in, or an array the trace dropped. Nothing about it is known before a run."""

    __slots__ = ("tag", "_refusal")
    traced = True

    def __init__(self, ref, refusal, tag=None):
        self.ref = ref
        self.tag = tag
        self._refusal = refusal

    def done(self):
        return False

    def result(self, timeout=None):
        raise self._refusal("the value, id or Operation of an array")

    buffer_id = result


class _Trace:
    """One trace of a program: the ChainRequest with stand-ins for the argument buffers,
    the output arrays, and what each run writes."""

    def __init__(self, name, client, arguments):
        self.name = name
        self.client = client
        self.arguments = arguments  # how many arrays it takes
        self.request = v1.ChainRequest()
        self.outputs = []
        self.structure = None
        self.written = []  # buffer refs the chain writes; an int is argument number
        self._requests = {}  # argument buffer ids -> the chain's bytes for them

    def refusal(self, what):
        return TypeError(f"program {self.name}: {what} cannot be traced: it needs values "
                         "that exist only when the program runs (return the array, and use "
                         "it after the call)")

    def record(self, client, request):
        """Adds a SubmitRequest as the chain's next step; returns its _Traced."""
        if client is not self.client:
            raise TypeError(f"program {self.name}: its arrays belong to one client")
        if request.WhichOneof("op") == "random":
            raise TypeError(f"program {self.name}: random numbers cannot be traced (they "
                            "would repeat at every run); pass them in as an argument")
        tag = f"#{len(self.request.steps) + 1}"
        self.request.steps.add(tag=tag).op.CopyFrom(request)
        return _Traced("tag:" + tag, self.refusal, tag)

    def bytes_for(self, ids):
        data = self._requests.get(ids)
        if data is None:
            request = v1.ChainRequest()
            request.CopyFrom(self.request)
            _substitute(request, {_stand_in(i): ref for i, ref in enumerate(ids)})
            data = request.SerializeToString()
            if len(self._requests) >= _MAX_KEPT_REQUESTS:
                self._requests.pop(next(iter(self._requests)))
            self._requests[ids] = data
        return data


def _stand_in(index):
    """The reference standing for argument `index`'s buffer in a trace: no buffer id or
    name the server makes looks like it, and it never leaves the client."""
    return f"<program argument {index}>"


def _is_repeated(field):
    """Whether a field is repeated: `is_repeated` in newer protobuf, which dropped
    `label`; `label` in older ones (Debian's 3.21), which lack `is_repeated`."""
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == FieldDescriptor.LABEL_REPEATED


def _substitute(message, refs):
    """Replaces, in place, every string field of `message` (at any depth) found in
    `refs` with its value there."""
    for field, value in message.ListFields():
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                values = value.values()
            elif _is_repeated(field):
                values = value
            else:
                values = (value,)
            for item in values:
                if hasattr(item, "ListFields"):
                    _substitute(item, refs)
        elif field.type == FieldDescriptor.TYPE_STRING and \
                not _is_repeated(field) and value in refs:
            setattr(message, field.name, refs[value])


def _output_of(step):
    op = getattr(step.op, step.op.WhichOneof("op"))
    return getattr(op, _OUTPUT_FIELDS[step.op.WhichOneof("op")])


def _argument_key(value, name):
    """What of an argument selects the trace, and whether it is an array."""
    if isinstance(value, View):
        if value.shape is None or value.dtype is None or \
                not isinstance(value.base, RemoteArrayInfo):
            raise TypeError(f"program {name}: a View of an id or name has no known shape; "
                            "view a handle (client.buffer(name)[...]) instead")
        steps = b"".join(step.SerializeToString() for step in value.steps)
        return ("view", value.shape, np.dtype(value.dtype).str, value.base.shape, steps), True
    if isinstance(value, RemoteArrayInfo):
        return ("array", value.shape, value.dtype.str), True
    if isinstance(value, np.ndarray):
        raise TypeError(f"program {name}: host arrays cannot be arguments; upload them "
                        "first (client.put)")
    try:
        hash(value)
    except TypeError:
        raise TypeError(f"program {name}: arguments other than remote arrays are constants "
                        f"of the trace and must be hashable, not {type(value).__name__}") \
            from None
    return ("constant", type(value), value), False


def _buffer_id(value):
    """The id of the buffer an argument (an array or a View of one) reads or writes; a
    pending expression is sent and waited for."""
    return (value.base if isinstance(value, View) else value).id


def _send_unsent(client):
    """Sends the client's pending expressions, so that a trace records only its own."""
    with _lazy._unsent_lock:
        arrays = [entry() for entry in _lazy._unsent.get(client, {}).values()]
    for array in arrays:
        if array is not None:
            array._materialize()


def _drop_unsent(client, refusal):
    """Drops the expressions a trace left unsent (nothing reads them; they name the
    trace's stand-ins, which no later request may send)."""
    with _lazy._unsent_lock:
        arrays = [entry() for entry in _lazy._unsent.get(client, {}).values()]
    for array in arrays:
        if array is not None and array._node is not None:
            array._node = None
            array._pending = _Traced("", refusal)
            _lazy._untrack(client, array)


# Traces a Program keeps, most recently used first.
MAX_TRACES = 8


class Program:
    """A function of remote arrays, traced into a chain and run as it (see the module's
    documentation). `prepared` tells whether the last run ran prepared, `steps` how
    many operations its chain has; `traces` counts the traces kept (one per set of
    argument shapes, dtypes and constants, each with its own output buffers). Not for
    concurrent calls from several threads."""

    def __init__(self, fn: Callable[..., Any], client: Any = None) -> None:
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._client = client
        self._traces = collections.OrderedDict()
        self._last = None
        self.prepared = False

    @property
    def traces(self) -> int:
        """How many traces the program keeps (no server call): the MAX_TRACES most
        recently used; an older one's output buffers are freed once nothing else holds
        them."""
        return len(self._traces)

    @property
    def steps(self) -> int:
        """The number of operations in the last run's chain (0 before a run)."""
        return 0 if self._last is None else len(self._last.request.steps)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the program on the server (tracing it first for new argument shapes):
        one RunChain call, which returns when the run is done. Returns the program's
        output arrays, overwritten by the next run."""
        _dispatch.refuse_in_trace("running a program")
        name = getattr(self._fn, "__name__", "program")
        keys, arrays = [], []
        for value in list(args) + [kwargs[k] for k in sorted(kwargs)]:
            key, is_array = _argument_key(value, name)
            keys.append(key)
            if is_array:
                arrays.append(value)
        ids = tuple(_buffer_id(array) for array in arrays)
        # Which arguments share a buffer is part of the trace: writes through one must
        # be seen by reads through the other.
        aliases = tuple(ids.index(ref) for ref in ids)
        key = (tuple(keys), tuple(sorted(kwargs)), aliases)
        trace = self._traces.get(key)
        if trace is None:
            trace = self._trace(name, args, kwargs, arrays, aliases)
            self._traces[key] = trace
            # Each trace owns output buffers on the server: a constant that changes at
            # every call must not keep one set of them per value it took.
            while len(self._traces) > MAX_TRACES:
                self._traces.popitem(last=False)
        else:
            self._traces.move_to_end(key)
        return self._run(trace, ids)

    def _trace(self, name, args, kwargs, arrays, aliases):
        client = _lazy.client_of(*arrays) or self._client
        if client is None:
            from . import _creation  # pylint: disable=import-outside-toplevel
            client = _creation._client(None)
        _send_unsent(client)
        trace = _Trace(name, client, len(arrays))
        bases, stand_ins = {}, []
        for index, array in enumerate(arrays):
            base = array.base if isinstance(array, View) else array
            if aliases[index] not in bases:
                bases[index] = _lazy.LazyArray(
                    client, pending=_Traced(_stand_in(index), trace.refusal), shape=base.shape,
                    dtype=base.dtype, owned=False)
            stand_in = bases[aliases[index]]
            if isinstance(array, View):
                stand_in = View(stand_in, array.steps, shape=array.shape, dtype=array.dtype,
                                client=client)
            stand_ins.append(stand_in)
        # The arrays, in the order __call__ listed them, replaced by their stand-ins.
        replace = iter(stand_ins)

        def traced(value):
            return next(replace) if isinstance(value, (RemoteArrayInfo, View)) else value

        traced_args = [traced(value) for value in args]
        traced_kwargs = {k: traced(kwargs[k]) for k in sorted(kwargs)}
        _dispatch.tracing.program = trace
        try:
            result = self._fn(*traced_args, **traced_kwargs)
            outputs = self._outputs(trace, result)
        finally:
            _dispatch.tracing.program = None
            _drop_unsent(client, trace.refusal)
        self._own_outputs(trace, *outputs)
        return trace

    def _run(self, trace, ids):
        client = trace.client
        data = trace.bytes_for(ids)
        for ref in trace.written:
            _lazy.before_write(client, ids[ref] if isinstance(ref, int) else ref)
        _dispatch._flush_released(client)
        client._submissions.wait_idle()
        _dispatch.wait_idle(client)
        response = client._call("RunChain", data)
        for step in response.steps:
            _operations.finished(step.operation)
        self.prepared = bool(response.operation_id)
        self._last = trace
        if trace.structure is None:
            return None
        if trace.structure == "one":
            return trace.outputs[0]
        return trace.structure(trace.outputs)

    @staticmethod
    def _outputs(trace, result):
        """Records how the outputs are written: a step of the trace that makes an output
        writes it; any other output is copied by a step of its own. Returns the distinct
        outputs, the output number of each returned value, and the tags of the steps
        that make outputs, with the output's number."""
        if result is None:
            trace.structure, values = None, []
        elif isinstance(result, (tuple, list)):
            trace.structure, values = type(result), list(result)
        else:
            trace.structure, values = "one", [result]
        distinct, numbers, makers = {}, [], {}
        for value in values:
            if not isinstance(value, (RemoteArrayInfo, View)) or value.shape is None:
                raise TypeError(f"program {trace.name}: returns remote arrays (one, a tuple "
                                f"or a list of them, or None), not {type(value).__name__}")
            number = distinct.setdefault(id(value), (len(distinct), value))[0]
            numbers.append(number)
            if number < len(distinct) - 1:
                continue  # returned again
            tag = None
            if isinstance(value, _lazy.LazyArray):
                pending = value._materialize()  # a pending expression: recorded as a step
                if getattr(pending, "traced", False):
                    tag = pending.tag
            if tag is not None:
                makers[tag] = number
            else:
                trace.record(trace.client, elementwise_request(
                    "a0", {"a0": _lazy.operand(value)}, out=View(_output_stand_in(number))))
        return [value for _, value in distinct.values()], numbers, makers

    @staticmethod
    def _own_outputs(trace, distinct, numbers, makers):
        """Creates the output buffers, points the steps that write them there, and notes
        the buffers that a run writes."""
        if not trace.request.steps:
            raise ValueError(f"program {trace.name}: records no operation")
        from . import _creation  # pylint: disable=import-outside-toplevel
        owned = [_creation.empty(value.shape, value.dtype, client=trace.client)
                 for value in distinct]
        refs = {_output_stand_in(n): array.id for n, array in enumerate(owned)}
        arguments = {_stand_in(n): n for n in range(trace.arguments)}
        written = {}
        for step in trace.request.steps:
            output = _output_of(step)
            if step.tag in makers:
                output.ClearField("name")
                output.buffer = owned[makers[step.tag]].id
            output.buffer = refs.get(output.buffer, output.buffer)
            if output.buffer and not output.buffer.startswith("tag:"):
                written.setdefault(arguments.get(output.buffer, output.buffer), None)
        trace.written = list(written)
        trace.outputs = [owned[n] for n in numbers]


def _output_stand_in(index):
    """The reference standing for output `index`'s buffer until the trace creates it."""
    return f"<program output {index}>"


def program(fn: Optional[Callable[..., Any]] = None, *, client: Any = None) -> Any:
    """A Program of `fn` (see the module's documentation), traced on the client of its
    array arguments (or `client`, or the last connected one) and run on that server as
    one RunChain call; usable as a decorator, with or without `client=`."""
    if fn is None:
        return functools.partial(program, client=client)
    return Program(fn, client)
