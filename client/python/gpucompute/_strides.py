"""Where a view's elements lie in its buffer: the server's strided layouts
(server/arrays/strided_layout.h) computed on the client, for handing a view's memory to
another library without a copy.

A layout is (offset, shape, strides), offset and strides counted in elements; the stride
of an axis of extent 1 is kept at 0, as the server keeps it. Steps are checked as the
server checks them (and as _views.view_shape already did), so an error here is one the
server would give too.
"""

from ._views import _axes, _normalize_axis, _reshape_shape, slice_of


def dense_layout(shape, layout="C"):
    strides = [0] * len(shape)
    step = 1
    order = range(len(shape)) if layout == "F" else reversed(range(len(shape)))
    for axis in order:
        strides[axis] = step if shape[axis] != 1 else 0
        step *= shape[axis]
    return 0, tuple(shape), tuple(strides)


def _index(offset, shape, strides, items):
    consumed = sum(1 for item in items if item.WhichOneof("item") in ("index", "slice"))
    out_shape, out_strides = [], []
    axis = 0
    for item in items:
        which = item.WhichOneof("item")
        if which == "index":
            offset += (item.index % shape[axis]) * strides[axis]
            axis += 1
        elif which == "slice":
            bounds = slice_of(item.slice).indices(shape[axis])
            start, _, step = bounds
            extent = len(range(*bounds))
            if extent:
                offset += start * strides[axis]
            out_shape.append(extent)
            out_strides.append(strides[axis] * step)
            axis += 1
        elif which == "new_axis":
            out_shape.append(1)
            out_strides.append(0)
        else:
            whole = len(shape) - consumed
            out_shape.extend(shape[axis:axis + whole])
            out_strides.extend(strides[axis:axis + whole])
            axis += whole
    return offset, out_shape + list(shape[axis:]), out_strides + list(strides[axis:])


def _reshape(offset, shape, strides, extents):
    """NumPy's no-copy reshape, as the server's ReshapeView does it."""
    dims = list(_reshape_shape(list(extents), shape))
    out = [0] * len(dims)
    if 0 in shape:
        return offset, dims, out
    old = [(extent, stride) for extent, stride in zip(shape, strides) if extent != 1]
    new_axes = [axis for axis, extent in enumerate(dims) if extent != 1]
    oi = ni = 0
    while oi < len(old) and ni < len(new_axes):
        oj, nj = oi + 1, ni + 1
        old_product, new_product = old[oi][0], dims[new_axes[ni]]
        while old_product != new_product:
            if new_product < old_product:
                new_product *= dims[new_axes[nj]]
                nj += 1
            else:
                old_product *= old[oj][0]
                oj += 1
        for k in range(oi, oj - 1):
            if old[k][1] != old[k + 1][0] * old[k + 1][1]:
                raise ValueError(f"cannot reshape a view of shape {tuple(shape)} into shape "
                                 f"{tuple(dims)} without copying its elements")
        stride = old[oj - 1][1]
        for k in reversed(range(ni, nj)):
            out[new_axes[k]] = stride
            stride *= dims[new_axes[k]]
        oi, ni = oj, nj
    return offset, dims, out


def _step(offset, shape, strides, step):
    which = step.WhichOneof("step")
    if which == "index":
        return _index(offset, shape, strides, step.index.items)
    if which == "transpose":
        axes = list(step.transpose.axes) or list(reversed(range(len(shape))))
        axes = _axes(axes, len(shape))
        return offset, [shape[a] for a in axes], [strides[a] for a in axes]
    if which == "expand_dims":
        ndim = len(shape) + len(step.expand_dims.axes)
        inserted = set(_axes(step.expand_dims.axes, ndim))
        rest = iter(zip(shape, strides))
        pairs = [(1, 0) if axis in inserted else next(rest) for axis in range(ndim)]
        return offset, [p[0] for p in pairs], [p[1] for p in pairs]
    if which == "squeeze":
        listed = {_normalize_axis(axis, len(shape)) for axis in step.squeeze.axes}
        kept = [axis for axis, extent in enumerate(shape)
                if not (axis in listed or (not listed and extent == 1))]
        return offset, [shape[a] for a in kept], [strides[a] for a in kept]
    if which == "broadcast_to":
        target = list(step.broadcast_to.extents)
        lead = len(target) - len(shape)
        out = [0] * lead + [stride if extent == to else 0
                            for extent, stride, to in zip(shape, strides, target[lead:])]
        return offset, target, out
    if which == "reshape":
        return _reshape(offset, shape, strides, step.reshape.extents)
    raise ValueError("a view step names no operation")


def view_layout(shape, layout, steps):
    """(offset, shape, strides) in elements of `steps` applied to a whole buffer of
    `shape` and `layout` ("C" or "F"). Takes steps that _views.view_shape accepted."""
    offset, shape, strides = dense_layout(tuple(shape), layout)
    shape, strides = list(shape), list(strides)
    for step in steps:
        offset, shape, strides = _step(offset, shape, strides, step)
        strides = [0 if extent == 1 else stride for extent, stride in zip(shape, strides)]
    return offset, tuple(shape), tuple(strides)
