"""Programs (gpucompute.program): a function of remote arrays traced once into a chain,
run again as it and prepared by the server; outputs in buffers the program owns,
overwritten by each run; what cannot be traced raises at the trace."""

import gc

import numpy as np
import pytest

import gpucompute
from gpucompute import _dispatch
from gpucompute._program import MAX_TRACES
from gpucompute.client import Client

SEED = 5150

pytestmark = pytest.mark.usefixtures("nep50")


def _ids(client):
    return sorted(buffer.id for buffer in client.buffers())


def test_a_program_run_again_runs_prepared_and_equals_numpy(client):
    rng = np.random.default_rng(SEED)
    a, b, d = (rng.standard_normal((16, 8)) for _ in range(3))
    x, y = client.put(a), client.put(b)

    @gpucompute.program
    def hypot_plus(x, y, scale):
        return np.sqrt(x * x + y * y) * scale + np.sin(x)

    first = hypot_plus(x, y, 2.0)
    assert not hypot_plus.prepared and hypot_plus.steps == 1  # one fused expression
    expected = np.sqrt(a * a + b * b) * 2.0 + np.sin(a)
    np.testing.assert_allclose(first.get(), expected, rtol=1e-12)
    for _ in range(3):
        again = hypot_plus(x, y, 2.0)
        assert hypot_plus.prepared and again is first
        np.testing.assert_allclose(again.get(), expected, rtol=1e-12)
    # Another buffer of the same shape: the same trace, a chain naming it (not yet
    # prepared), then prepared; back to the first buffers: prepared still.
    z = client.put(d)
    np.testing.assert_allclose(hypot_plus(x, z, 2.0).get(),
                               np.sqrt(a * a + d * d) * 2.0 + np.sin(a), rtol=1e-12)
    assert not hypot_plus.prepared
    hypot_plus(x, z, 2.0)
    assert hypot_plus.prepared
    hypot_plus(x, y, 2.0)
    assert hypot_plus.prepared and hypot_plus.traces == 1
    np.testing.assert_allclose(first.get(), expected, rtol=1e-12)
    # The arguments are only read.
    np.testing.assert_array_equal(x.get(), a)
    np.testing.assert_array_equal(y.get(), b)


def test_a_program_with_reductions_and_matmul(client):
    rng = np.random.default_rng(SEED + 1)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((4, 5))
    x, y = client.put(a), client.put(b)

    @client.program
    def statistics(x, y):
        centered = x - x.mean()
        return (centered ** 2).mean(), x @ y.T, np.abs(x).max(axis=0, keepdims=True)

    for run in range(3):
        variance, product, largest = statistics(x, y)
        assert statistics.prepared == (run > 0)
        assert variance.shape == () and product.shape == (6, 4) and largest.shape == (1, 5)
        np.testing.assert_allclose(float(variance), ((a - a.mean()) ** 2).mean(), rtol=1e-12)
        np.testing.assert_allclose(product.get(), a @ b.T, rtol=1e-12)
        np.testing.assert_array_equal(largest.get(), np.abs(a).max(axis=0, keepdims=True))
    # mean; the fused map-reduce of the centered squares; matmul; the fused max.
    assert statistics.steps == 4


def test_a_loop_through_a_program_runs_in_place_and_prepared(client):
    host = np.arange(1024, dtype=np.float32)
    x = client.put(host)
    step = gpucompute.program(lambda v: v + 1)
    y = x
    prepared = []
    for _ in range(20):
        y = step(y)
        prepared.append(step.prepared)
    # Run 1 reads x, run 2 its own output (in place: another chain), then the same bytes.
    assert prepared == [False, False] + [True] * 18
    np.testing.assert_array_equal(y.get(), host + 20)
    np.testing.assert_array_equal(x.get(), host)


def test_writes_through_arguments_and_views_happen_at_every_run(client):
    a = np.arange(24, dtype=np.float64).reshape(4, 6)
    x = client.put(a)
    counter = client.put(np.zeros(3, np.int64))

    @gpucompute.program
    def update(x, counter):
        before = x.sum()  # reads the values from before the write below
        x[:, ::2] *= 2
        x[1] += 1
        counter += 1
        return before

    expected = a.copy()
    for run in range(3):
        total = update(x, counter)
        assert float(total) == expected.sum()
        expected[:, ::2] *= 2
        expected[1] += 1
        assert update.prepared == (run > 0)
    np.testing.assert_array_equal(x.get(), expected)
    np.testing.assert_array_equal(counter.get(), np.full(3, 3))
    # A view argument: its steps are part of the trace.
    double = gpucompute.program(lambda v: 2 * v)
    np.testing.assert_array_equal(double(x[1:, ::3]).get(), 2 * expected[1:, ::3])
    np.testing.assert_array_equal(double(x[:, 1]).get(), 2 * expected[:, 1])
    assert double.traces == 2


def test_outputs_are_overwritten_by_the_next_run_unless_copied(client):
    a, b = np.arange(5.0), np.arange(5.0) * 10
    x, y = client.put(a), client.put(b)
    square = gpucompute.program(lambda v: v * v)
    first = square(x)
    kept = first.copy()  # pending: sent before the next run writes first's buffer
    second = square(y)
    assert second is first
    np.testing.assert_array_equal(first.get(), b * b)
    np.testing.assert_array_equal(kept.get(), a * a)
    # Returned arguments and views are copied into the program's buffers.
    identity = gpucompute.program(lambda v: (v, v[::2], v))
    whole, strided, again = identity(x)
    assert again is whole and whole.id != x.id
    np.testing.assert_array_equal(whole.get(), a)
    np.testing.assert_array_equal(strided.get(), a[::2])


def test_other_shapes_dtypes_and_constants_trace_again(client):
    calls = []

    @gpucompute.program
    def scaled(v, factor):
        calls.append(factor)
        return v * factor

    np.testing.assert_array_equal(scaled(client.put(np.arange(4.0)), 3).get(),
                                  np.arange(4.0) * 3)
    np.testing.assert_array_equal(scaled(client.put(np.arange(6.0)), 3).get(),
                                  np.arange(6.0) * 3)
    np.testing.assert_array_equal(scaled(client.put(np.arange(4, dtype=np.int32)), 3).get(),
                                  np.arange(4, dtype=np.int32) * 3)
    np.testing.assert_array_equal(scaled(client.put(np.arange(4.0)), 5).get(),
                                  np.arange(4.0) * 5)
    scaled(client.put(np.arange(4.0)), 5)
    assert calls == [3, 3, 3, 5] and scaled.traces == 4


def test_a_program_keeps_its_recent_traces_and_frees_the_others_outputs(client):
    x = client.put(np.arange(4.0))
    before = len(client.buffers())

    @gpucompute.program
    def scaled(v, factor):
        return v * factor

    for factor in range(3 * MAX_TRACES):
        np.testing.assert_array_equal(scaled(x, factor).get(), np.arange(4.0) * factor)
    assert scaled.traces == MAX_TRACES
    gc.collect()
    _dispatch.flush(client)  # the collected outputs' deletes, sent and answered
    assert len(client.buffers()) == before + MAX_TRACES
    # The most recent traces are kept: no new trace, no new buffer.
    scaled(x, 3 * MAX_TRACES - 1)
    assert scaled.traces == MAX_TRACES
    assert len(client.buffers()) == before + MAX_TRACES


@pytest.mark.parametrize("body, what", [
    (lambda x: np.asarray(x) + 1, r"a download \(np.asarray\(\), get\(\)\)"),
    (lambda x: x.get(), r"a download \(np.asarray\(\), get\(\)\)"),
    (lambda x: x * float(x.sum()), r"float\(\) of an array"),
    (lambda x: x * int(x[0]), r"int\(\) of an array"),
    (lambda x: x + 1 if x.sum() > 0 else x - 1,
     r"bool\(\) of an array \(Python control flow on an array's values: if, while, and, "
     r"or\)"),
    (lambda x: x + len(x.id), r"the value, id or Operation of an array"),
    (lambda x: x + gpucompute.zeros(x.shape, client=x._client),
     r"creating an array \(zeros, ones, full, arange, \.\.\.\)"),
])
def test_what_cannot_be_traced_raises_and_changes_nothing(client, body, what):
    x = client.put(np.arange(1, 5.0))
    before = _ids(client)
    program = gpucompute.program(body)
    with pytest.raises(TypeError, match=r"^program <lambda>: " + what + r" cannot be traced: "
                       r"it needs values that exist only when the program runs \(return the "
                       r"array, and use it after the call\)$"):
        program(x)
    assert _dispatch.tracing.program is None and program.traces == 0
    assert _ids(client) == before
    np.testing.assert_array_equal(x.get(), np.arange(1, 5.0))
    # The client works on as before.
    np.testing.assert_array_equal((x + 1).get(), np.arange(2, 6.0))


def test_bad_programs_and_arguments_raise(client):
    x = client.put(np.arange(4.0))
    before = _ids(client)
    with pytest.raises(TypeError, match=r"^program <lambda>: random numbers cannot be traced "
                                        r"\(they would repeat at every run\); pass them in as "
                                        r"an argument$"):
        gpucompute.program(lambda v: v + gpucompute.random(4, client=client))(x)
    with pytest.raises(TypeError, match=r"^program <lambda>: returns remote arrays \(one, a "
                                        r"tuple or a list of them, or None\), not float$"):
        gpucompute.program(lambda v: 1.5)(x)
    with pytest.raises(TypeError, match=r"^program <lambda>: host arrays cannot be arguments; "
                                        r"upload them first \(client.put\)$"):
        gpucompute.program(lambda v: v + 1)(np.arange(4.0))
    with pytest.raises(TypeError, match=r"^program <lambda>: arguments other than remote "
                                        r"arrays are constants of the trace and must be "
                                        r"hashable, not list$"):
        gpucompute.program(lambda v, w: v + 1)(x, [1])
    with pytest.raises(ValueError, match=r"^program <lambda>: records no operation$"):
        gpucompute.program(lambda v: None)(x)
    inner = gpucompute.program(lambda v: v + 1)
    with pytest.raises(TypeError, match=r"^program <lambda>: running a program cannot be "
                                        r"traced"):
        gpucompute.program(lambda v: inner(v))(x)
    assert _ids(client) == before
    np.testing.assert_array_equal(x.get(), np.arange(4.0))


def test_a_run_waits_for_the_work_sent_before_it(client):
    x = client.put(np.arange(8.0))
    x += 1  # sent through the session; the run must see it
    total = gpucompute.program(lambda v: v.sum())
    assert float(total(x)) == np.sum(np.arange(8.0) + 1)
    pending = (x * 2).compute()
    x *= 3
    assert float(total(x)) == np.sum((np.arange(8.0) + 1) * 3)
    np.testing.assert_array_equal(pending.get(), (np.arange(8.0) + 1) * 2)


def test_a_program_sends_one_call_a_run(client, monkeypatch):
    x = client.put(np.arange(8.0))
    step = gpucompute.program(lambda v: np.exp(-v) * 2 + v.mean())
    step(x)
    calls = []
    call = Client._call

    def counting(self, method, request, timeout=True):
        calls.append(method)
        return call(self, method, request, timeout)

    monkeypatch.setattr(Client, "_call", counting)
    for _ in range(5):
        step(x)
    assert calls == ["RunChain"] * 5 and step.prepared


def test_a_deleted_argument_fails_the_run_and_changes_nothing(client):
    x, y = client.put(np.arange(4.0)), client.put(np.arange(4.0) * 2)
    plus = gpucompute.program(lambda v: v + 1)
    result = plus(x)
    plus(y)
    y_id = y.id
    y.delete()
    with pytest.raises(gpucompute.NotFoundError) as error:
        plus(y)
    assert error.value.code.name == "NOT_FOUND"
    assert error.value.details == f"step 0 ('#1'): input 'a0': buffer {y_id} not found"
    np.testing.assert_array_equal(result.get(), np.arange(4.0) * 2 + 1)
    assert plus(x) is result and plus.prepared
    np.testing.assert_array_equal(result.get(), np.arange(4.0) + 1)


def test_arguments_sharing_a_buffer_and_captured_arrays(client):
    a, b = np.arange(6.0), np.arange(6.0) * 10
    x, y = client.put(a), client.put(b)

    @gpucompute.program
    def shift(target, source):
        before = source + 1  # pending when target is written: must read the old values
        target += 100
        return before

    # The same buffer twice: the write is seen as NumPy sees it; then two buffers.
    np.testing.assert_array_equal(shift(x, x).get(), a + 1)
    np.testing.assert_array_equal(shift(x, y).get(), b + 1)
    np.testing.assert_array_equal(x.get(), a + 200)
    assert shift.traces == 2
    # Arrays the function closes over are read as they are at each run; one it returns
    # is copied into the program's output.
    offset = (client.put(np.ones(6)) * 2).compute()
    total = gpucompute.program(lambda v: (v + offset, offset))
    first, copied = total(y)
    np.testing.assert_array_equal(first.get(), b + 2)
    np.testing.assert_array_equal(copied.get(), np.full(6, 2.0))
    assert copied.id != offset.id


def test_keyword_arguments_are_arrays_or_constants_too(client):
    x, y = client.put(np.arange(4.0)), client.put(np.ones(4))
    scaled = client.program(lambda a, *, b, k=2: a * k + b)
    np.testing.assert_array_equal(scaled(x, b=y).get(), np.arange(4.0) * 2 + 1)
    np.testing.assert_array_equal(scaled(b=x, a=y, k=3).get(), np.ones(4) * 3 + np.arange(4.0))
    scaled(b=x, a=y, k=3)
    assert scaled.prepared and scaled.traces == 2
