"""Transfers through POSIX shared memory (transport="shm"/"auto") against a server with
--allow-shared-memory, and the fallback to gRPC against one without."""

import asyncio
import glob
import os
import subprocess
import sys
import threading
import time

import gpucompute
import gpucompute.aio
import grpc
import numpy as np
import pytest
from gpucompute import _shm

from conftest import HERE, client_name_for, start_server

SHM_FLAG = "--allow-shared-memory"


@pytest.fixture(scope="module")
def shm_server():
    with start_server(SHM_FLAG, memory_limit=512 << 20, cpu_threads=1) as address:
        yield address


@pytest.fixture
def connect(shm_server, request):
    """Opens clients of the shared-memory server named after the test (more than one
    share the name, and so the buffers and regions); deletes their buffers and closes
    them at the end."""
    clients = []

    def connect_(**options):
        options.setdefault("client_name", client_name_for(request))
        client = gpucompute.connect(shm_server, progress=False, timeout=30, **options)
        clients.append(client)
        return client

    yield connect_
    for client in clients:
        for buffer in client.buffers():
            buffer.delete()
        client.close()


def copies(client):
    """How many copies the server has made between regions and buffers: each
    shared-memory transfer (or piece of one) is one; gRPC transfers are none. (Both
    count as uploads and downloads too.)"""
    return sum(k.count for k in client.stats().kinds
               if k.kind == gpucompute.v1.OPERATION_KIND_COPY)


def segments_of(pid):
    return glob.glob(os.path.join(_shm.SHM_DIRECTORY, f"gpucompute-{pid}-*"))


def host_array(dtype, shape, order):
    rng = np.random.default_rng(sum(shape) + len(np.dtype(dtype).name))
    size = int(np.prod(shape))
    if np.dtype(dtype) == np.bool_:
        values = rng.integers(0, 2, size).astype(bool)
    elif np.dtype(dtype).kind == "i":
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, size, dtype=dtype, endpoint=True)
    else:
        values = rng.standard_normal(size).astype(dtype)
        values[:4] = [np.nan, -0.0, np.inf, -np.inf][:size]
    return np.array(values.reshape(shape), order=order)


def assert_same(got, expected):
    """Exactly the array: dtype, shape, memory order and every bit."""
    assert got.dtype == expected.dtype.newbyteorder("=")
    assert got.shape == expected.shape
    if expected.ndim >= 2 and expected.flags.f_contiguous and not expected.flags.c_contiguous:
        assert got.flags.f_contiguous
    assert got.tobytes() == expected.astype(got.dtype).tobytes()


DTYPES = ["float32", "float64", "int32", "int64", "bool"]
SHAPES = [((), "C"), ((0,), "C"), ((1,), "C"), ((1001,), "C"), ((17, 23), "C"),
          ((17, 23), "F"), ((4, 5, 6), "F")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,order", SHAPES)
def test_round_trips(connect, dtype, shape, order):
    client = connect()
    host = host_array(dtype, shape, order)
    before = copies(client)
    x = client.put(host, transport="shm")
    layout = order if host.ndim >= 2 else "C"
    assert (x.shape, x.dtype, x.layout) == (host.shape, host.dtype, layout)
    assert x.transfer.bytes == host.nbytes
    assert_same(x.get(transport="shm"), host)
    assert copies(client) == before + (2 if host.nbytes else 1)
    # The same bytes through gRPC.
    assert_same(client.download(x, transport="grpc"), host)


def test_arrays_that_are_not_contiguous_or_not_native(connect):
    client = connect()
    base = np.arange(600, dtype=np.int64).reshape(20, 30)
    for host in (base[::3, 1::2], base.T[2:], base.astype(">i8"), base.astype(">f4")[::-1]):
        assert_same(client.put(host, transport="shm").get(transport="shm"), host)


def test_into_an_existing_buffer(connect):
    client = connect()
    x = client.put(np.zeros(10), transport="shm")
    client.put(np.array([1.5, 2.5]), into=x, offset_bytes=3 * 8, transport="shm")
    client.put(np.zeros(0), into=x, offset_bytes=10 * 8, transport="shm")
    expected = np.zeros(10)
    expected[3:5] = [1.5, 2.5]
    assert_same(x.get(transport="shm"), expected)
    # Beyond the end: rejected, and nothing changed.
    with pytest.raises(gpucompute.InvalidArgumentError) as error:
        client.put(np.ones(3), into=x, offset_bytes=8 * 8, transport="shm")
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert_same(x.get(transport="grpc"), expected)


def test_the_region_is_reused_and_grows(connect):
    client = connect()
    client.put(np.arange(10.0), transport="shm")
    (first,) = client.regions()
    assert first.kind == gpucompute.v1.REGION_KIND_SYSTEM
    assert first.size_bytes == _shm.MIN_REGION_BYTES
    assert first.shm_name.startswith(f"/gpucompute-{os.getpid()}-")
    client.put(np.arange(100.0), transport="shm").get(transport="shm")
    assert [r.id for r in client.regions()] == [first.id]
    big = np.arange(100_000.0)
    assert_same(client.put(big, transport="shm").get(transport="shm"), big)
    (grown,) = client.regions()  # the small one was unregistered
    assert grown.id != first.id and grown.size_bytes == big.nbytes


def test_transfers_larger_than_the_segment_move_in_pieces(connect):
    limit = 3 * 4096
    client = connect(shm_max_bytes=limit)
    host = np.random.default_rng(1).standard_normal(10_001)  # 80008 bytes: 7 pieces
    pieces = -(-host.nbytes // limit)
    before = copies(client)
    seen = []
    x = client.put(host, transport="shm", progress=lambda done, total: seen.append(done))
    assert seen == [min((i + 1) * limit, host.nbytes) for i in range(pieces)]
    assert x.transfer.bytes == host.nbytes
    seen.clear()
    assert_same(x.get(transport="shm", progress=lambda done, total: seen.append(done)), host)
    assert seen == [min((i + 1) * limit, host.nbytes) for i in range(pieces)]
    assert x.transfer.bytes == host.nbytes
    assert copies(client) == before + 2 * pieces
    (region,) = client.regions()
    assert region.size_bytes == limit
    # Into an existing buffer, at an offset, in pieces.
    client.put(-host[:5000], into=x, offset_bytes=8, transport="shm")
    expected = host.copy()
    expected[1:5001] = -host[:5000]
    assert_same(client.download(x, transport="shm"), expected)


def test_a_failed_upload_in_pieces_leaves_no_buffer(connect):
    client = connect(shm_max_bytes=4096)
    kept = client.put(np.arange(3.0))
    memory = client.stats().memory_used_bytes

    def fail_halfway(done, total):
        if done > total // 2:
            raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt):
        client.put(np.ones(10_000), name="partial", transport="shm", progress=fail_halfway)
    assert [b.id for b in client.buffers()] == [kept.id]
    assert client.stats().memory_used_bytes == memory
    # The client goes on.
    assert_same(client.put(np.ones(10_000), name="partial", transport="shm").get(),
                np.ones(10_000))


def test_auto_takes_shared_memory_where_it_can(connect):
    client = connect()
    assert client.options.transport == "auto"
    host = np.arange(5000, dtype=np.int32)
    before = copies(client)
    x = client.put(host)
    assert_same(x.get(), host)
    assert copies(client) == before + 2
    # transport="grpc" on the client makes that the default; a call can still ask.
    plain = connect(transport="grpc")
    assert_same(plain.download(x), host)
    assert copies(client) == before + 2
    assert_same(plain.download(x, transport="shm"), host)
    assert copies(client) == before + 3


def test_auto_falls_back_to_grpc_where_the_server_has_shm_off(server_address, request):
    with gpucompute.connect(server_address, client_name=client_name_for(request),
                            progress=False) as client:
        assert not client.info().shared_memory_enabled
        before = copies(client)
        host = np.arange(1000.0).reshape(10, 100, order="F")
        x = client.put(host)
        assert_same(x.get(), host)
        assert copies(client) == before
        with pytest.raises(gpucompute.FailedPreconditionError, match=SHM_FLAG) as error:
            client.put(host, transport="shm")
        assert error.value.code == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(gpucompute.FailedPreconditionError, match=SHM_FLAG):
            x.get(transport="shm")
        assert [b.id for b in client.buffers()] == [x.id]
        assert segments_of(os.getpid()) == []
        x.delete()


@pytest.mark.parametrize("elsewhere", ["hostname", "boot_id"])
def test_auto_falls_back_to_grpc_for_a_server_on_another_host(connect, monkeypatch, elsewhere):
    if elsewhere == "hostname":
        monkeypatch.setattr(_shm.socket, "gethostname", lambda: "some-other-host")
    else:
        monkeypatch.setattr(_shm, "boot_id", lambda: "00000000-0000-0000-0000-000000000000")
    client = connect()
    before = copies(client)
    x = client.put(np.arange(4.0))
    assert_same(x.get(), np.arange(4.0))
    assert copies(client) == before
    with pytest.raises(gpucompute.FailedPreconditionError, match="another host"):
        client.put(np.arange(4.0), transport="shm")
    assert client.regions() == []


def test_the_region_is_gone_after_close(shm_server, request):
    name = client_name_for(request)
    with gpucompute.connect(shm_server, client_name=name) as client:
        x = client.put(np.arange(10.0), transport="shm")
        assert len(client.regions()) == 1
        x.delete()
    with gpucompute.connect(shm_server, client_name=name) as other:
        assert other.regions() == []
    assert segments_of(os.getpid()) == []


def test_a_closed_or_killed_client_leaves_nothing_in_dev_shm(shm_server, request):
    # The name goes as soon as the server has mapped the segment, so there is nothing
    # left to remove however the client ends.
    with gpucompute.connect(shm_server, client_name=client_name_for(request)) as client:
        x = client.put(np.arange(1000.0), transport="shm")
        (region,) = client.regions()
        assert not os.path.exists(_shm.SHM_DIRECTORY + region.shm_name)
        assert segments_of(os.getpid()) == []
        x.delete()
    assert segments_of(os.getpid()) == []

    script = (f"import sys; sys.path.insert(0, {os.path.dirname(HERE)!r})\n"
              "import os, gpucompute, numpy as np\n"
              f"c = gpucompute.connect({shm_server!r}, client_name='killed')\n"
              "x = c.put(np.arange(100000.0), transport='shm')\n"
              "print(os.getpid(), c.regions()[0].shm_name, flush=True)\n"
              "sys.stdin.readline()\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        pid, name = child.stdout.readline().split()
        assert int(pid) == child.pid and name.startswith(f"/gpucompute-{pid}-")
        assert segments_of(pid) == []
    finally:
        child.kill()
        child.wait()
    assert segments_of(pid) == []
    with gpucompute.connect(shm_server, client_name="killed") as killed:
        for buffer in killed.buffers():
            buffer.delete()


def test_a_region_that_idled_out_is_registered_again():
    with start_server(SHM_FLAG, "--region-idle-timeout=1", memory_limit=64 << 20,
                      cpu_threads=1) as address:
        with gpucompute.connect(address, timeout=30) as client:
            host = np.arange(3000, dtype=np.int64)
            x = client.put(host, transport="shm")
            (first,) = client.regions()
            deadline = time.monotonic() + 30
            while client.regions() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert client.regions() == []
            assert_same(x.get(transport="shm"), host)
            (second,) = client.regions()
            assert second.id != first.id
            while client.regions() and time.monotonic() < deadline:
                time.sleep(0.2)
            y = client.put(-host, transport="shm")
            assert_same(y.get(transport="grpc"), -host)
            # A buffer that does not exist is not a lost region.
            with pytest.raises(gpucompute.NotFoundError):
                client.download("no-such-buffer", transport="shm")
            assert len(client.regions()) == 1


def test_threads_share_the_segment(connect):
    client = connect()
    results = {}

    def work(i):
        host = np.full(1000 * (i + 1), i, dtype=np.int64)
        results[i] = (host, client.put(host, transport="shm").get(transport="shm"))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == list(range(6))
    for host, back in results.values():
        assert_same(back, host)
    assert len(client.regions()) == 1


def test_asyncio_client(shm_server, request):
    name = client_name_for(request)
    host = np.random.default_rng(4).standard_normal((30, 40)).astype(np.float32)

    async def main():
        async with gpucompute.aio.connect(shm_server, client_name=name,
                                          shm_max_bytes=4096) as client:
            x = await client.put(host, transport="shm")
            assert_same(await x.get(transport="shm"), host)
            y = await client.put(host.T)  # auto
            assert_same(await client.download(y), host.T)
            assert len(await client.regions()) == 1
            with pytest.raises(ValueError, match="transport"):
                await client.put(host, transport="udp")
            await x.delete()
            await y.delete()
        async with gpucompute.aio.connect(shm_server, client_name=name) as other:
            assert await other.regions() == []

    before = copies_of(shm_server, name)
    asyncio.run(main())
    # 4800 bytes in two pieces each way, twice.
    assert copies_of(shm_server, name) == before + 8


def copies_of(address, name):
    with gpucompute.connect(address, client_name=name) as client:
        return copies(client)


def test_bad_transport_names(connect):
    with pytest.raises(ValueError, match="transport"):
        connect(transport="tcp")
    client = connect()
    with pytest.raises(ValueError, match="transport"):
        client.put(np.ones(3), transport="SHM")
    with pytest.raises(ValueError, match="transport"):
        client.download("x", transport="")
    assert client.buffers() == []
