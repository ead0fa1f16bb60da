"""Replicas that each serve the tenants the placement table places on them: the
clients send the tenant header and follow a redirect once, then talk to the owner."""

import asyncio
import secrets

import gpucompute
import gpucompute.aio
import numpy as np
import pytest

from conftest import start_server

ALICE = "alice-" + secrets.token_hex(8)
BOB = "bob-" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    """Two replicas on loopback with one table: alice on r0, bob on r1. r0 knows r1's
    address; r1 is started first, so that its port is known."""
    directory = tmp_path_factory.mktemp("placement")
    tokens = directory / "tokens"
    tokens.write_text(f"{ALICE} alice\n{BOB} bob\n")
    table = directory / "placement"
    table.write_text("alice r0\nbob r1\n")
    common = (f"--tokens-file={tokens}", f"--placement-file={table}")
    with start_server("--replica-name=r1", *common) as r1_target:
        with start_server("--replica-name=r0", f"--replica-addresses=r1={r1_target}",
                          *common) as r0_target:
            yield r0_target, r1_target


def test_the_client_follows_a_redirect_once_and_then_talks_to_the_owner(replicas):
    r0, r1 = replicas
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    with gpucompute.connect(r0, token=BOB, tenant="bob", timeout=30) as uploader:
        handle = uploader.put(values, name="x")
        assert uploader.options.target == r1
        np.testing.assert_array_equal(handle.get(), values)
        assert [b.name for b in uploader.buffers()] == ["x"]
    # A download first, and a unary call first: each redirected and made again on r1.
    with gpucompute.connect(r0, token=BOB, tenant="bob", timeout=30) as downloader:
        np.testing.assert_array_equal(downloader.download("x"), values)
        assert downloader.options.target == r1
    with gpucompute.connect(r0, token=BOB, timeout=30) as unary:
        assert unary.buffer("x").shape == (3, 4)
        assert unary.options.target == r1
    # Straight to r1, bob finds the same buffer; r0 holds nothing of his (as alice sees:
    # nothing of hers either).
    with gpucompute.connect(r1, token=BOB, timeout=30) as direct:
        assert [b.name for b in direct.buffers()] == ["x"]
    with gpucompute.connect(r0, token=ALICE, timeout=30) as alice:
        assert alice.buffers() == []
        assert alice.options.target == r0


def test_a_spoofed_tenant_is_refused_and_changes_nothing(replicas, monkeypatch):
    r0, _ = replicas
    monkeypatch.setenv("GPUCOMPUTE_TENANT", "bob")
    with gpucompute.connect(r0, token=ALICE, timeout=30) as alice:
        assert alice.options.tenant == "bob"
        with pytest.raises(gpucompute.PermissionDeniedError) as caught:
            alice.create((4,), "float32", name="spoofed")
        assert caught.value.details == (
            "metadata 'gpucompute-tenant' names another tenant than this call's credentials "
            "(alice); send 'gpucompute-tenant: alice' or none")
        assert alice.options.target == r0
    with gpucompute.connect(r0, token=ALICE, tenant="", timeout=30) as alice:
        assert alice.buffers() == []


def test_a_second_redirect_is_raised(replicas):
    r0, r1 = replicas
    with gpucompute.connect(r0, token=BOB, timeout=30) as bob:
        bob.buffers()
        assert bob.options.target == r1
        # A fake second redirect: the client has followed one already.
        error = gpucompute.FailedPreconditionError.__new__(gpucompute.FailedPreconditionError)
        error.redirect_address = r0
        from gpucompute import _connection
        assert not _connection.follow_redirect(bob, error, None, ())
        assert bob.options.target == r1


def test_the_asyncio_client_follows_a_redirect_too(replicas):
    r0, r1 = replicas

    async def run():
        async with gpucompute.aio.connect(r0, token=BOB, tenant="bob", timeout=30) as bob:
            names = [b.name for b in await bob.buffers()]
            assert bob.options.target == r1
            return names

    assert asyncio.run(run()) == ["x"]
