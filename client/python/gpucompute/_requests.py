"""The request messages of both clients, built from Python arguments: operands and
outputs, the operations (elementwise, reduce, gemv, matmul, random), downloads, and
CreateBuffer and RenewLease. Wherever the API reads a buffer, a View (_views.py) may
stand, sent as the buffer and its view steps.
"""

import numbers

import numpy as np

from ._arrays import buffer_ref, dtype_enum, layout_enum, scalar_message, stream_ref
from ._proto import v1
from ._views import array_parts

REDUCE_KINDS = ("sum", "prod", "min", "max", "mean", "norm2", "argmin", "argmax", "var", "std",
                "any", "all")


def operand_message(value):
    operand = v1.Operand()
    set_operand(operand, value)
    return operand


def set_operand(operand, value):
    """Sets an Operand (in place: a map entry, say) to a scalar or a remote array."""
    if isinstance(value, (numbers.Number, np.bool_)):
        operand.scalar.CopyFrom(scalar_message(value))
    else:
        operand.buffer, steps = array_parts(value)
        if steps:
            operand.view.extend(steps)


def _set_array(op, buffer_field, view_field, value):
    """Sets op.<buffer_field> and op.<view_field> from a handle, View, id or name."""
    buffer, steps = array_parts(value)
    setattr(op, buffer_field, buffer)
    getattr(op, view_field).extend(steps)


def output_message(out=None, name=None, dtype=None):
    output = v1.Output()
    if out is not None:
        if name is not None:
            raise ValueError("name names a new buffer; it cannot be given with out")
        output.buffer, steps = array_parts(out)
        output.view.extend(steps)
    elif name is not None:
        output.name = name
    output.dtype = dtype_enum(dtype)
    return output


def _submit_request(stream, field):
    request = v1.SubmitRequest(stream_id=stream_ref(stream))
    return request, getattr(request, field)


def elementwise_request(expression, inputs, out=None, name=None, dtype=None, stream=None):
    request, op = _submit_request(stream, "elementwise")
    op.expression = expression
    for variable, value in inputs.items():
        set_operand(op.inputs[variable], value)
    op.output.CopyFrom(output_message(out, name, dtype))
    return request


def reduce_request(kind, x, axis=None, out=None, name=None, dtype=None, stream=None, *,
                   keepdims=False, ddof=0, inputs=None):
    """A ReduceOp of `x` (a handle, View, id or name), or, with `inputs`, of the values of
    the expression `x` over them. `axis`: None (every axis), an int (the request's
    `axis`) or a tuple (`axes`; () reduces none)."""
    if kind not in REDUCE_KINDS:
        raise ValueError(f"unknown reduction {kind!r}; one of {', '.join(REDUCE_KINDS)}")
    request, op = _submit_request(stream, "reduce")
    if inputs:
        if not isinstance(x, str):
            raise TypeError("with inputs, reduce's x is an expression (a string)")
        op.expression = x
        for variable, value in inputs.items():
            set_operand(op.inputs[variable], value)
    else:
        _set_array(op, "input", "input_view", x)
    op.kind = getattr(v1, f"REDUCE_KIND_{kind.upper()}")
    if isinstance(axis, (numbers.Integral, np.integer)):
        op.axis = int(axis)
    elif axis is not None:
        op.axes.SetInParent()
        op.axes.axes.extend(int(a) for a in axis)
    op.keepdims = bool(keepdims)
    op.ddof = float(ddof)
    op.output.CopyFrom(output_message(out, name, dtype))
    return request


def gemv_request(a, x, y=None, transpose=False, alpha=1.0, beta=0.0, name=None, stream=None):
    request, op = _submit_request(stream, "gemv")
    _set_array(op, "a", "a_view", a)
    _set_array(op, "x", "x_view", x)
    op.y.CopyFrom(output_message(y, name))
    op.transpose = bool(transpose)
    op.alpha = float(alpha)
    op.beta = float(beta)
    return request


def matmul_request(a, b, c=None, transpose_a=False, transpose_b=False, alpha=1.0, beta=0.0,
                   allow_tf32=False, name=None, stream=None):
    request, op = _submit_request(stream, "matmul")
    _set_array(op, "a", "a_view", a)
    _set_array(op, "b", "b_view", b)
    op.c.CopyFrom(output_message(c, name))
    op.transpose_a = bool(transpose_a)
    op.transpose_b = bool(transpose_b)
    op.alpha = float(alpha)
    op.beta = float(beta)
    op.allow_tf32 = bool(allow_tf32)
    return request


def download_request(value, chunk_bytes):
    """A DownloadRequest of a handle, View, id or name."""
    request = v1.DownloadRequest(chunk_bytes=chunk_bytes)
    _set_array(request, "buffer", "view", value)
    return request


def random_request(distribution, shape, dtype, seed, offset=0, out=None, name=None,
                   layout="C", stream=None, **parameters):
    request, op = _submit_request(stream, "random")
    op.distribution = getattr(v1, f"DISTRIBUTION_{distribution.upper()}")
    if out is None:
        op.shape.extend(_shape(shape))
        op.layout = layout_enum(layout)
    op.output.CopyFrom(output_message(out, name, None if out is not None else dtype))
    op.seed = seed
    op.offset = offset
    for parameter, value in parameters.items():
        setattr(op, parameter, value)
    return request


def create_request(shape, dtype, fill=None, name=None, layout="C", device=None):
    request = v1.CreateBufferRequest(dtype=dtype_enum(dtype), shape=_shape(shape),
                                     layout=layout_enum(layout), name=name or "")
    if fill is not None:
        request.fill.CopyFrom(scalar_message(fill))
    if device is not None:
        request.device = device
    return request


def _shape(shape):
    if isinstance(shape, numbers.Integral):
        return [int(shape)]
    return [int(extent) for extent in shape]


def renew_request(buffer, ttl):
    """A RenewLeaseRequest: `ttl` None keeps the buffer's own time-to-live, 0 ends the
    lease, else the lease's new time-to-live in seconds."""
    request = v1.RenewLeaseRequest(buffer=buffer_ref(buffer))
    if ttl is not None:
        request.ttl_seconds = float(ttl)
    return request
