"""Chunked transfers: chunk sizes, progress, all-or-nothing uploads, and one over 2 GiB."""

import sys

import gpucompute
import numpy as np
import pytest

from conftest import MEMORY_LIMIT_BYTES


@pytest.mark.parametrize("chunk_bytes", [1000, 4096, 1 << 20, 100 << 20])
def test_chunk_sizes(server_address, client, chunk_bytes):
    host = np.random.default_rng(7).standard_normal(300_001)
    with gpucompute.connect(server_address, client_name=client.options.client_name,
                            chunk_bytes=chunk_bytes) as c:
        assert c.options.chunk_bytes == min(chunk_bytes, (64 << 20) - (64 << 10))
        seen = []
        x = c.put(host, progress=lambda done, total: seen.append((done, total)))
        expected_chunks = -(-host.nbytes // c.options.chunk_bytes)
        assert len(seen) == expected_chunks
        assert seen[-1] == (host.nbytes, host.nbytes)
        assert all(a[0] < b[0] for a, b in zip(seen, seen[1:]))
        got = []
        back = x.get(progress=lambda done, total: got.append((done, total)))
        np.testing.assert_array_equal(back, host)
        assert got[-1] == (host.nbytes, host.nbytes)


def test_progress_bar_without_tqdm(client, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import fails
    client.put(np.zeros(1000), progress=True).get(progress=True)
    err = capsys.readouterr().err
    assert "put [" in err and "get [" in err and "100.0%" in err


def test_a_failed_upload_leaves_nothing(client):
    def fail_halfway(done, total):
        if done > total // 2:
            raise KeyboardInterrupt("stop")

    memory_before = client.stats().memory_used_bytes
    with gpucompute.connect(client.options.target, client_name=client.options.client_name,
                            chunk_bytes=1 << 16) as c:
        with pytest.raises(KeyboardInterrupt):
            c.put(np.ones(100_000), name="partial", progress=fail_halfway)
        target = c.put(np.zeros(100_000))
        with pytest.raises(KeyboardInterrupt):
            c.put(np.ones(100_000), into=target, progress=fail_halfway)
    assert [b.id for b in client.buffers()] == [target.id]
    np.testing.assert_array_equal(client.download(target), np.zeros(100_000))
    assert client.stats().memory_used_bytes == memory_before + target.nbytes


def test_a_failed_download_raises_and_the_buffer_stays(client):
    x = client.put(np.arange(1 << 20, dtype=np.int64))

    def fail(done, total):
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        x.get(progress=fail)
    np.testing.assert_array_equal(x.get(), np.arange(1 << 20, dtype=np.int64))


def test_upload_and_download_over_2_gib(client):
    # 2 GiB and a bit, in an odd number of elements: sizes and offsets past 2^31 bytes.
    n = (1 << 29) + 12_345
    assert n * 4 < MEMORY_LIMIT_BYTES
    host = np.arange(n, dtype=np.int32)
    x = client.put(host)
    assert x.nbytes == n * 4 > 1 << 31
    assert x.transfer.bytes == x.nbytes
    assert client.reduce("sum", x).value == host.sum(dtype=np.int64)
    assert client.reduce("argmax", x).value == n - 1
    back = x.get()
    assert np.array_equal(back, host)
    del back
    x.delete()


def test_progress_bar_with_tqdm(client, capsys):
    pytest.importorskip("tqdm")
    client.put(np.zeros(1000), progress=True).get(progress=True)
    err = capsys.readouterr().err
    assert "put:" in err and "get:" in err and "7.81k" in err  # 8000 bytes in KiB
