"""Views and broadcasting against NumPy: random views (slices with random steps,
integer indices, transposes, reshapes, expand_dims, squeeze, broadcast_to, views of
views) of arrays up to 4-D, downloaded, read by eval and written through as eval's
out; broadcasting operands of random shapes. A fixed seed and a bounded count."""

import numpy as np
import pytest

import gpucompute
from gpucompute._views import view_shape

SEED = 20240611
CASES = 60


def _no_copy_reshape(array, shape):
    """array.reshape(shape) where NumPy can make it without a copy, else None."""
    view = array.view()
    try:
        view.shape = shape
    except AttributeError:
        return None
    return view


def _random_step(rng, array):
    """A step that applies to `array`: (description, on_numpy, on_remote), or None."""
    ndim = array.ndim
    kind = rng.choice(["slice", "index", "transpose", "reshape", "expand_dims", "squeeze",
                       "broadcast_to", "T", "newaxis"])
    if kind == "slice" and ndim:
        key = []
        for extent in array.shape[:rng.integers(1, ndim + 1)]:
            step = int(rng.choice([1, 1, 2, 3, -1, -2]))
            start = int(rng.integers(-extent - 2, extent + 2)) if rng.random() < 0.6 else None
            stop = int(rng.integers(-extent - 2, extent + 2)) if rng.random() < 0.6 else None
            key.append(slice(start, stop, step))
        key = tuple(key)
        return f"[{key}]", lambda a: a[key], lambda r: r[key]
    if kind == "index" and ndim:
        axis = int(rng.integers(0, ndim))
        if array.shape[axis] == 0:
            return None
        i = int(rng.integers(-array.shape[axis], array.shape[axis]))
        key = (slice(None),) * axis + (i,)
        if rng.random() < 0.3:
            key = (Ellipsis, i) if axis == ndim - 1 else key
        # With '...', NumPy gives a 0-d array (a view) rather than a scalar.
        full = key if Ellipsis in key else key + (Ellipsis,)
        return f"[{key}]", lambda a: a[full], lambda r: r[key]
    if kind == "transpose" and ndim:
        axes = tuple(int(axis) for axis in rng.permutation(ndim))
        return f".transpose{axes}", lambda a: a.transpose(axes), lambda r: r.transpose(axes)
    if kind == "T":
        return ".T", lambda a: a.T, lambda r: r.T
    if kind == "newaxis":
        position = int(rng.integers(0, ndim + 1))
        key = (slice(None),) * position + (None,)
        return f"[{key}]", lambda a: a[key], lambda r: r[key]
    if kind == "reshape" and array.size:
        flat = array.size
        first = int(rng.choice([d for d in range(1, flat + 1) if flat % d == 0]))
        target = (first, flat // first)
        if _no_copy_reshape(array, target) is None:
            return None
        shape = (first, -1) if rng.random() < 0.5 else target
        return f".reshape{shape}", lambda a: _no_copy_reshape(a, target), \
            lambda r: r.reshape(shape)
    if kind == "expand_dims":
        axis = int(rng.integers(-ndim - 1, ndim + 1))
        return f".expand_dims({axis})", lambda a: np.expand_dims(a, axis), \
            lambda r: r.expand_dims(axis)
    if kind == "squeeze" and 1 in array.shape:
        if rng.random() < 0.5:
            return ".squeeze()", lambda a: a.squeeze(), lambda r: r.squeeze()
        axis = array.shape.index(1)
        return f".squeeze({axis})", lambda a: a.squeeze(axis), lambda r: r.squeeze(axis)
    if kind == "broadcast_to" and ndim < 4:
        target = tuple(int(rng.integers(1, 4)) if extent == 1 else extent
                       for extent in array.shape)
        target = (int(rng.integers(1, 3)),) + target
        return f".broadcast_to{target}", lambda a: np.broadcast_to(a, target), \
            lambda r: r.broadcast_to(target)
    return None


def _random_view(rng, host, remote, steps, writable=False):
    """Applies up to `steps` random steps to both (no broadcast_to when `writable`), and
    keeps the views at most 4-D; also returns the NumPy steps, each making a view."""
    trail = []
    functions = []
    for _ in range(steps):
        step = _random_step(rng, host)
        if step is None or (writable and step[0].startswith(".broadcast_to")):
            continue
        name, on_numpy, on_remote = step
        candidate = on_numpy(host)
        if candidate is None or candidate.ndim > 4 or candidate.size > 4096:
            continue
        host, remote = candidate, on_remote(remote)
        trail.append(name)
        functions.append(on_numpy)
    return host, remote, "".join(trail), functions


def _random_base(rng, client, dtype=np.float64):
    ndim = int(rng.integers(1, 5))
    shape = tuple(int(rng.integers(1, 7)) for _ in range(ndim))
    host = rng.uniform(-10, 10, shape).astype(dtype)
    if ndim >= 2 and rng.random() < 0.3:
        host = np.asfortranarray(host)
    return host, client.put(host)


def test_view_shapes_match_numpy_without_a_server():
    rng = np.random.default_rng(SEED)
    for _ in range(500):
        shape = tuple(int(rng.integers(0, 6)) for _ in range(int(rng.integers(0, 5))))
        host = np.zeros(shape)
        view = gpucompute.View("x", shape=shape)
        host_view, remote_view, trail, _ = _random_view(rng, host, view, 4)
        assert remote_view.shape == host_view.shape, (shape, trail)
        assert view_shape(shape, remote_view.steps) == host_view.shape, (shape, trail)


def test_views_make_no_server_call_and_check_their_steps_here(client):
    x = client.put(np.arange(24.0).reshape(4, 6), name="x")
    before = client.stats()
    view = x[1:, ::2].T
    assert isinstance(view, gpucompute.View) and view.shape == (3, 3)
    assert view.dtype == np.float64 and view.base is x and len(view.steps) == 2
    with pytest.raises(IndexError):
        x[4]
    with pytest.raises(IndexError):
        x[0, 0, 0]
    with pytest.raises(ValueError, match="cannot reshape array of size 24 into shape"):
        x.reshape(5, -1)
    with pytest.raises(ValueError, match="slice step cannot be zero"):
        x[::0]
    with pytest.raises(IndexError, match="basic indexing"):
        x[0, [0, 1]]  # x[[0, 1]] alone is np.take (tests/test_numpy_composed.py)
    with pytest.raises(ValueError):
        x.squeeze(0)
    with pytest.raises(ValueError):
        x.broadcast_to(6, 4)
    assert client.stats().kinds == before.kinds


def test_random_views_download_as_numpy_gives_them(client):
    rng = np.random.default_rng(SEED + 1)
    for case in range(CASES):
        host, remote = _random_base(rng, client)
        host_view, remote_view, trail, _ = _random_view(rng, host, remote,
                                                       int(rng.integers(1, 5)))
        got = client.download(remote_view) if isinstance(remote_view, gpucompute.View) \
            else remote_view.get()
        assert got.shape == host_view.shape, (case, host.shape, trail)
        np.testing.assert_array_equal(got, host_view, err_msg=f"{host.shape}{trail}")
        assert got.flags.c_contiguous or got.ndim < 2 or not isinstance(remote_view,
                                                                         gpucompute.View)
        remote.delete()


def test_views_are_read_by_eval_and_broadcast(client):
    rng = np.random.default_rng(SEED + 2)
    for case in range(CASES):
        a_host, a = _random_base(rng, client)
        a_view_host, a_view, trail, _ = _random_view(rng, a_host, a, int(rng.integers(1, 4)))
        # An operand of a shape that broadcasts against the view: some axes 1, fewer
        # leading axes.
        shape = tuple(1 if rng.random() < 0.4 else extent for extent in a_view_host.shape)
        shape = shape[int(rng.integers(0, len(shape) + 1)):]
        b_host = rng.uniform(-5, 5, shape)
        b = client.put(b_host)
        y = client.eval("a * b - a", a=a_view, b=b)
        expected = a_view_host * b_host - a_view_host
        assert y.shape == expected.shape, (case, trail)
        np.testing.assert_allclose(y.get(), expected, rtol=1e-15, atol=1e-15,
                                   err_msg=f"{a_host.shape}{trail} with {shape}")
        for handle in (a, b, y):
            handle.delete()


def test_eval_writes_through_non_contiguous_views(client):
    rng = np.random.default_rng(SEED + 3)
    for case in range(CASES // 2):
        host, target = _random_base(rng, client)
        view_host, view, trail, functions = _random_view(rng, host, target, 3, writable=True)
        source_host = rng.uniform(-1, 1, view_host.shape)
        source = client.put(source_host)
        client.eval("s * 2 + 1", s=source, out=view)
        # The same steps on a copy make NumPy's view of it, written through the same way.
        expected = host.copy(order="K")
        expected_view = expected
        for function in functions:
            expected_view = function(expected_view)
        expected_view[...] = source_host * 2 + 1
        np.testing.assert_array_equal(target.get(), expected, err_msg=f"{host.shape}{trail}")
        for handle in (target, source):
            handle.delete()


def test_broadcasting_random_shapes_against_numpy(client):
    rng = np.random.default_rng(SEED + 4)
    for case in range(CASES):
        full = tuple(int(rng.integers(1, 6)) for _ in range(int(rng.integers(0, 5))))
        shapes = []
        for _ in range(3):
            shape = tuple(1 if rng.random() < 0.5 else extent for extent in full)
            shapes.append(shape[int(rng.integers(0, len(shape) + 1)):])
        hosts = [rng.uniform(-4, 4, shape) for shape in shapes]
        remotes = [client.put(host) for host in hosts]
        y = client.eval("a*b + c", a=remotes[0], b=remotes[1], c=remotes[2])
        expected = hosts[0] * hosts[1] + hosts[2]
        assert y.shape == expected.shape, (case, shapes)
        np.testing.assert_allclose(y.get(), expected, rtol=1e-15, atol=1e-14)
        for handle in remotes + [y]:
            handle.delete()


def test_shapes_that_do_not_broadcast_are_refused_and_create_nothing(client):
    a = client.put(np.zeros((3, 4)))
    b = client.put(np.zeros(3))
    before = {buffer.id for buffer in client.buffers()}
    with pytest.raises(gpucompute.InvalidArgumentError) as error:
        client.eval("a + b", a=a, b=b, name="never")
    assert "(3,4)" in str(error.value).replace(" ", "") and "(3,)" in str(error.value)
    # A reshape the strides do not allow, sent without a local shape (a View of a name).
    with pytest.raises(gpucompute.InvalidArgumentError):
        client.eval("x", x=gpucompute.View(a.id)[:, ::2].T.reshape(-1), name="never")
    assert {buffer.id for buffer in client.buffers()} == before
