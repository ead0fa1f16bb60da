"""Uploads, downloads and handles: what goes up comes back, bit for bit."""

import time

import conftest
import gpucompute
import grpc

import numpy as np
import pytest

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.bool_]


def sample(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5), (2, 3, 4)], ids=str)
def test_put_get_round_trip(client, dtype, shape):
    array = sample(shape, dtype)
    x = client.put(array, name="x")
    assert x.id.startswith("buf-") and len(x.id) == 4 + 32
    assert (x.name, x.shape, x.dtype, x.layout) == ("x", shape, np.dtype(dtype), "C")
    assert x.nbytes == array.nbytes
    assert x.transfer.bytes == array.nbytes
    assert x.operation is None and x.timing is None

    back = x.get()
    assert back.dtype == np.dtype(dtype) and back.shape == shape
    np.testing.assert_array_equal(back, array)
    assert x.transfer.bytes == array.nbytes  # now the download's


def test_fortran_order_stays_fortran(client):
    array = np.asfortranarray(sample((4, 6), np.float64))
    x = client.put(array)
    assert x.layout == "F"
    back = x.get()
    assert back.flags.f_contiguous and not back.flags.c_contiguous
    np.testing.assert_array_equal(back, array)


def test_strided_and_big_endian_arrays_upload_their_values(client):
    base = sample((8, 10), np.float64)
    strided = base[::2, 1::3]
    np.testing.assert_array_equal(client.put(strided).get(), strided)
    swapped = base.astype(">f8")
    back = client.put(swapped).get()
    assert back.dtype == np.dtype("<f8")
    np.testing.assert_array_equal(back, base)


def test_lists_upload_as_numpy_would_convert_them(client):
    x = client.put([[1, 2], [3, 4]])
    assert x.dtype == np.int64 and x.shape == (2, 2)
    np.testing.assert_array_equal(x.get(), [[1, 2], [3, 4]])


def test_asarray_downloads_and_copy_false_raises(client):
    array = sample((5, 3), np.float32)
    x = client.put(array)
    np.testing.assert_array_equal(np.asarray(x), array)
    as64 = np.asarray(x, dtype=np.float64)
    assert as64.dtype == np.float64
    np.testing.assert_array_equal(as64, array.astype(np.float64))
    np.testing.assert_array_equal(np.array(x), array)
    # NumPy 2 passes copy=False to ask for a view; a download cannot be one.
    with pytest.raises(ValueError, match="copy"):
        x.__array__(copy=False)
    if int(np.__version__.split(".")[0]) >= 2:
        with pytest.raises(ValueError):
            np.asarray(x, copy=False)


def test_create_fills_and_names(client):
    x = client.create((2, 3), "int32", fill=7, name="sevens", layout="F")
    assert (x.shape, x.dtype, x.layout, x.name) == ((2, 3), np.int32, "F", "sevens")
    np.testing.assert_array_equal(x.get(), np.full((2, 3), 7, np.int32))


def test_upload_into_an_existing_buffer_at_an_offset(client):
    x = client.put(np.zeros(10))
    y = client.put(np.array([1.0, 2.0, 3.0]), into=x, offset_bytes=4 * 8)
    assert y.id == x.id
    np.testing.assert_array_equal(x.get(), [0, 0, 0, 0, 1, 2, 3, 0, 0, 0])


def test_buffers_lookup_and_delete(client):
    x = client.put(np.arange(3.0), name="x")
    y = client.put(np.arange(4.0))
    assert [b.id for b in client.buffers()] == [x.id, y.id]
    assert client.buffer("x").id == x.id
    assert client.buffer(x.id).shape == (3,)
    x.delete()
    assert [b.id for b in client.buffers()] == [y.id]
    with pytest.raises(gpucompute.NotFoundError) as error:
        client.buffer("x")
    assert error.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(gpucompute.NotFoundError):
        x.get()


def test_renew_sets_and_ends_a_lease(client):
    x = client.put(np.arange(3.0), name="leased")
    assert x.info.ttl_seconds == 0 and x.info.lease_expire_time_unix_nanos == 0
    before = time.time_ns()
    leased = client.renew("leased", ttl=120)
    assert leased.id == x.id
    assert leased.info.ttl_seconds == 120
    expires = leased.info.lease_expire_time_unix_nanos
    assert before + 119e9 <= expires <= time.time_ns() + 121e9
    assert client.renew(x).info.ttl_seconds == 120  # renewed with its own ttl
    ended = client.renew(x, ttl=0)
    assert ended.info.ttl_seconds == 0 and ended.info.lease_expire_time_unix_nanos == 0
    with pytest.raises(gpucompute.InvalidArgumentError):
        client.renew(x, ttl=-1)
    with pytest.raises(gpucompute.NotFoundError):
        client.renew("no-such-buffer", ttl=10)
    np.testing.assert_array_equal(client.buffer(x.id).get(), [0.0, 1.0, 2.0])


def test_context_manager_deletes(client):
    with client.put(np.arange(3.0)) as x:
        assert [b.id for b in client.buffers()] == [x.id]
    assert client.buffers() == []
    # Leaving the block after an explicit delete is fine.
    with client.put(np.arange(3.0)) as y:
        y.delete()


def test_names_and_listings_are_per_client(server_address, client):
    x = client.put(np.arange(3.0), name="shared-name")
    with gpucompute.connect(server_address, client_name="someone-else") as other:
        assert other.buffers() == []
        with pytest.raises(gpucompute.NotFoundError):
            other.buffer("shared-name")
        # Ids are capabilities: another client can use one it was given.
        np.testing.assert_array_equal(other.buffer(x.id).get(), np.arange(3.0))
        mine = other.put(np.arange(2.0), name="shared-name")
        assert mine.id != x.id
        mine.delete()
    assert client.buffer("shared-name").id == x.id


def test_server_info(client):
    info = client.info()
    assert info.backend == conftest.BACKEND
    assert info.api == "gpucompute.v1"
    assert info.limits.max_message_bytes >= 4 << 20
