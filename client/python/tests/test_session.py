"""Sessions (Client.session): operations without a round trip each, resolved by tag,
against a real server. Every wait is bounded, so that a hang fails the test."""

import os
import secrets
import signal
import subprocess
import sys
import threading
import time

import gpucompute
import numpy as np
import pytest
from gpucompute import _session

from conftest import SERVER_PROCESSES, start_server

WAIT = 30  # seconds any one answer may take


def eventually(predicate):
    """Whether `predicate` becomes true within WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_operations_feed_each_other_by_tag(client):
    host = np.random.default_rng(1).standard_normal(1000)
    x = client.put(host)
    with client.session() as s:
        y = s.eval("2*x + 1", x=x)
        z = s.eval("y * y", y=y)
        total = s.reduce("sum", z)
        scaled = s.eval("z / t", z=z, t=total)
        column = s.rand.uniform((4, 3), seed=7)
        product = s.matmul(column, column.ref, transpose_b=True)
        assert y.ref == "tag:#1" and z.ref == "tag:#2"
        assert isinstance(y, gpucompute.Pending)
        np.testing.assert_allclose(scaled.array(timeout=WAIT).get(),
                                   (2 * host + 1) ** 2 / np.sum((2 * host + 1) ** 2), rtol=1e-12)
        np.testing.assert_allclose(total.array().value, np.sum((2 * host + 1) ** 2), rtol=1e-12)
        uniform = client.rand.uniform((4, 3), seed=7).get()
        np.testing.assert_allclose(product.array(timeout=WAIT).get(), uniform @ uniform.T,
                                   rtol=1e-12)
        operation = y.result(timeout=WAIT)
        assert operation.done and operation.outputs[0].id == y.buffer_id()
        assert y.done()
    np.testing.assert_array_equal(x.get(), host)  # read, never written


def test_an_eager_loop_through_tags_matches_numpy(client):
    host = np.arange(1024, dtype=np.float32)
    x = client.put(host)
    expected = host.copy()
    with client.session() as s:
        h = x
        for _ in range(500):
            h = s.eval("x + 1", x=h)
            expected = expected + np.float32(1)
        np.testing.assert_array_equal(h.array(timeout=WAIT).get(), expected)


def test_outputs_written_in_place_stay_and_run_in_order(client):
    x = client.put(np.zeros(100))
    with client.session() as s:
        pendings = [s.eval("2*x + i", x=x, i=i, out=x) for i in range(50)]
    expected = np.zeros(100)
    for i in range(50):
        expected = 2 * expected + i
    np.testing.assert_array_equal(x.get(), expected)
    assert all(p.done() and p.buffer_id() == x.id for p in pendings)


def test_a_failed_operation_fails_its_dependents_and_nothing_else(client):
    x = client.put(np.arange(8.0))
    s = client.session()
    bad = s.eval("x +", x=x)
    dependent = s.eval("b * 2", b=bad)
    independent = s.eval("x * 2", x=x)
    error = bad.exception(timeout=WAIT)
    assert isinstance(error, gpucompute.InvalidArgumentError)
    assert error.details == "at position 3: expected a number, a name or '(', found the end " \
                            "of the expression"
    with pytest.raises(gpucompute.FailedPreconditionError) as failed:
        dependent.result(timeout=WAIT)
    assert failed.value.details == ("input 'b': depends on tag '#1', which failed: at position 3: "
                                    "expected a number, a name or '(', found the end of the "
                                    "expression")
    np.testing.assert_array_equal(independent.array(timeout=WAIT).get(), np.arange(8.0) * 2)
    s.close()  # every failure was looked at: nothing to raise
    np.testing.assert_array_equal(x.get(), np.arange(8.0))


def test_leaving_the_block_raises_the_first_failure_nobody_looked_at(client):
    x = client.put(np.arange(4.0))
    with pytest.raises(gpucompute.NotFoundError) as raised:
        with client.session() as s:
            fine = s.eval("x + 1", x=x)
            first = s.eval("y + 1", y="no-such-buffer")
            s.eval("f + 1", f=first)
    assert raised.value.details == "input 'y': no buffer named 'no-such-buffer'"
    if hasattr(raised.value, "__notes__"):
        assert raised.value.__notes__ == ["1 more operations of the session failed"]
    assert fine.done() and first.done()
    assert s.failures() == []  # reported by the raise
    s.close()  # closing twice is harmless


def test_tags_of_ones_own_are_unique(client):
    x = client.put(np.arange(4.0))
    request = gpucompute.v1.SubmitRequest()
    request.elementwise.expression = "x + 1"
    request.elementwise.inputs["x"].buffer = x.id
    with client.session() as s:
        first = s.submit(request, tag="mine")
        assert first.ref == "tag:mine"
        with pytest.raises(ValueError, match="tag 'mine' is already used in this session"):
            s.submit(request, tag="mine")
        with pytest.raises(ValueError, match="not starting with '#'"):
            s.submit(request, tag="#1")
        np.testing.assert_array_equal(first.array(timeout=WAIT).get(), np.arange(4.0) + 1)
        assert s.eval("x", x=x).ref == "tag:#2"  # the refused ones took no number


def test_temporaries_die_with_the_session_named_outputs_stay(client):
    x = client.put(np.arange(16.0))
    with client.session() as s:
        temporary = s.eval("x + 1", x=x)
        named = s.eval("x * 3", x=x, name="tripled")
        temporary_id = temporary.buffer_id(timeout=WAIT)
        assert {temporary_id, named.buffer_id(timeout=WAIT), x.id} == \
            {b.id for b in client.buffers()}
        np.testing.assert_array_equal(client.download(temporary_id), np.arange(16.0) + 1)
    assert {b.id for b in client.buffers()} == {x.id, named.buffer_id()}
    with pytest.raises(gpucompute.NotFoundError):
        client.download(temporary_id)
    np.testing.assert_array_equal(client.download("tripled"), np.arange(16.0) * 3)


def test_the_session_stream_is_used_where_an_operation_names_none(client):
    stream = client.create_stream()
    other = client.create_stream()
    x = client.put(np.arange(4.0))
    with client.session(stream=stream) as s:
        on_session = s.eval("x + 1", x=x)
        on_other = s.eval("x + 1", x=x, stream=other)
    assert on_session.result().stream_id == stream.id
    assert on_other.result().stream_id == other.id


def test_flow_control_past_the_in_flight_limit(client, monkeypatch):
    limit = client.info().limits.max_session_in_flight
    assert limit == 1024
    ops_per_message = []
    release = threading.Event()
    original = _session.Session._messages

    def held(self):
        # Holds gRPC's sending thread until released, as a server that holds back
        # `limit` unanswered operations does once the transport's buffers are full.
        for message in original(self):
            ops_per_message.append(len(gpucompute.v1.SessionRequest.FromString(message).ops))
            release.wait(WAIT)
            yield message

    monkeypatch.setattr(_session.Session, "_messages", held)
    count = 4 * limit
    x = client.put(np.zeros(1 << 10, dtype=np.float32))
    with client.session() as s:
        pendings = []

        def submit_all():
            for _ in range(count):
                pendings.append(s.eval("x + 1", x=x, out=x))

        submitter = threading.Thread(target=submit_all)
        submitter.start()
        for _ in range(WAIT * 100):
            if len(s._queued) == limit:
                break
            time.sleep(0.01)
        time.sleep(0.2)
        # A full message waits: the submit after it blocks, and nothing more is queued.
        assert submitter.is_alive()
        assert len(s._queued) == limit
        assert len(pendings) == ops_per_message[0] + limit
        release.set()
        submitter.join(WAIT)
        s.wait(timeout=WAIT)
        assert len(pendings) == count and all(p.done() for p in pendings)
    assert sum(ops_per_message) == count
    assert max(ops_per_message) == limit  # a full message, never more
    np.testing.assert_array_equal(x.get()[:4], np.full(4, count, dtype=np.float32))


def test_submits_from_several_threads(client):
    threads, steps = 4, 100
    arrays = [client.put(np.full(64, float(t))) for t in range(threads)]
    results = [None] * threads
    with client.session() as s:
        def work(t):
            h = arrays[t]
            for _ in range(steps):
                h = s.eval("2*h + 1", h=h)
            results[t] = h

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(WAIT)
        s.wait(timeout=WAIT)
        for t in range(threads):
            expected = np.full(64, float(t))
            for _ in range(steps):
                expected = 2 * expected + 1
            np.testing.assert_array_equal(results[t].array().get(), expected)


def test_a_malformed_message_fails_every_pending_operation(client, monkeypatch):
    x = client.put(np.arange(4.0))
    s = client.session()
    monkeypatch.setattr(_session, "session_op_bytes", lambda tag, data: b"\x1a\x03\xff\xff\xff")
    broken = s.eval("x + 1", x=x)
    error = broken.exception(timeout=WAIT)
    assert isinstance(error, gpucompute.InvalidArgumentError)
    assert error.details == "a malformed gpucompute.v1.SessionRequest message"
    monkeypatch.undo()
    later = s.eval("x + 1", x=x)  # after the end: failed at once
    assert later.done()
    assert later.exception().details == error.details
    s.close()
    assert s.failures() == []
    np.testing.assert_array_equal(x.get(), np.arange(4.0))


def test_a_revoked_token_ends_the_session(tmp_path):
    token = "session-" + secrets.token_hex(16)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{token} alice\n")
    with start_server(f"--tokens-file={tokens}", memory_limit=64 << 20) as address:
        with gpucompute.connect(address, token=token, progress=False) as c:
            x = c.put(np.arange(4.0))
            s = c.session()
            before = s.eval("x + 1", x=x)
            np.testing.assert_array_equal(before.array(timeout=WAIT).get(), np.arange(4.0) + 1)
            tokens.write_text("other-token bob\n")
            SERVER_PROCESSES[address].send_signal(signal.SIGHUP)
            revoked = None
            deadline = time.monotonic() + WAIT
            while revoked is None and time.monotonic() < deadline:
                # The reload happens on the server's own time.
                revoked = s.eval("x + 2", x=x).exception(timeout=WAIT)
                time.sleep(0.01)
            assert isinstance(revoked, gpucompute.UnauthenticatedError)
            assert revoked.details == (
                "the token this call was opened with was revoked (a reload of the server's "
                "tokens file dropped it); open a new call with a token the file lists")
            assert token not in str(revoked)
            s.close()


def test_the_server_going_away_fails_pending_operations_without_a_hang():
    with start_server(memory_limit=256 << 20) as address:
        with gpucompute.connect(address, progress=False) as c:
            x = c.put(np.arange(4.0))
            big = c.create(1 << 25, "float32", fill=0.5)
            s = c.session()
            idle = c.session()
            assert s.eval("x + 1", x=x).result(timeout=WAIT).done
            # Unanswered when the server dies: a slow operation, and those behind it.
            in_flight = [s.reduce("sum", "sin(b)*cos(b) + sqrt(b) + exp(b)", b=big)]
            in_flight += [s.eval("x + 1", x=x) for _ in range(100)]
            assert not in_flight[-1].done()
            process = SERVER_PROCESSES[address]
            os.kill(process.pid, signal.SIGKILL)
            process.wait(WAIT)
            pending = s.eval("x + 1", x=x)
            for p in in_flight + [pending]:
                assert isinstance(p.exception(timeout=WAIT), gpucompute.UnavailableError)
            s.close(timeout=WAIT)  # every failure was looked at
            # No operation reported the end of this one: closing does.
            with pytest.raises(gpucompute.UnavailableError):
                idle.close(timeout=WAIT)


def test_an_exception_in_the_block_cancels_the_session(client):
    x = client.put(np.arange(4.0))
    with pytest.raises(KeyError):
        with client.session() as s:
            s.eval("x + 1", x=x).result(timeout=WAIT)
            raise KeyError("mine")
    assert s._reader.is_alive() is False
    # The server deletes the temporary once it sees the cancellation, on its own time.
    assert eventually(lambda: [b.id for b in client.buffers()] == [x.id])


def test_submit_after_close_is_refused(client):
    x = client.put(np.arange(4.0))
    s = client.session()
    s.close()
    with pytest.raises(ValueError, match="the session is closed"):
        s.eval("x + 1", x=x)


def test_the_small_operations_bench_checks_its_values(server_address):
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "bench_ops.py")
    run = subprocess.run([sys.executable, bench, "--target", server_address, "--ops", "300",
                          "--backend-independent"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = run.stdout.splitlines()[2:]
    assert [row.split()[0] for row in rows] == ["submit", "futures", "session", "chain",
                                                 "aio-session", "numpy", "numpy-eager", "program"]
    assert "WRONG" not in run.stdout


def test_the_asyncio_session(server_address, request):
    import asyncio
    import gpucompute.aio

    host = np.arange(1024, dtype=np.float32)

    async def main():
        async with gpucompute.aio.connect(server_address, client_name=request.node.name,
                                          progress=False) as c:
            x = await c.put(host)
            async with c.session() as s:
                h = x
                for _ in range(3000):  # past max_session_in_flight
                    h = await s.eval("x + 1", x=h)
                assert isinstance(h, gpucompute.Pending) and h.ref == "tag:#3000"
                total = await s.reduce("sum", h)
                assert (await total.array(timeout=WAIT)).value == np.sum(host + 3000)
                result = await h.array(timeout=WAIT)
                np.testing.assert_array_equal(await result.get(), host + 3000)
                ids = {b.id for b in await c.buffers()}
                assert result.id in ids and len(ids) == 3002  # x, 3000 and the sum's
                await s.wait(timeout=WAIT)
            assert [b.id for b in await c.buffers()] == [x.id]  # temporaries gone

            with pytest.raises(gpucompute.InvalidArgumentError) as raised:
                async with c.session() as s:
                    bad = await s.eval("x +", x=x)
                    dependent = await s.eval("b * 2", b=bad)
                    fine = await s.eval("x * 2", x=x)
                    with pytest.raises(gpucompute.FailedPreconditionError) as failed:
                        await dependent.result(timeout=WAIT)
                    assert failed.value.details.startswith("input 'b': depends on tag '#1'")
            assert raised.value.details.startswith("at position 3: expected a number")
            assert fine.done() and await fine.exception() is None

            with pytest.raises(KeyError):
                async with c.session() as s:
                    await (await s.eval("x + 1", x=x)).result(timeout=WAIT)
                    raise KeyError("mine")
            for _ in range(WAIT * 100):  # deleted once the server sees the cancellation
                if [b.id for b in await c.buffers()] == [x.id]:
                    break
                await asyncio.sleep(0.01)
            assert [b.id for b in await c.buffers()] == [x.id]
            await x.delete()

    asyncio.run(asyncio.wait_for(main(), 60))
