"""Tokens and TLS against real servers: who gets in, who sees what, and that no
exception ever repeats a token."""

import asyncio
import os
import secrets

import gpucompute
import gpucompute.aio
import grpc
import numpy as np
import pytest

from conftest import REPO, start_server

TLS = os.path.join(REPO, "tests", "testdata", "tls")
# Random, so that finding one in a message cannot be a coincidence of test data.
ALICE = "alice-" + secrets.token_hex(16)
BOB = "bob-" + secrets.token_hex(16)
ADMIN = "root-" + secrets.token_hex(16)
TOKENS = (ALICE, BOB, ADMIN)
CALL_TIMEOUT = 20


def tls_file(name):
    return os.path.join(TLS, name)


def no_token_in(error):
    """Asserts that no token appears in what an exception shows."""
    shown = [str(error), repr(error), str(getattr(error, "details", ""))]
    shown += [str(argument) for argument in error.args]
    for token in TOKENS:
        assert not any(token in text for text in shown), "the exception repeats a token"
        # Nor a recognisable part of one.
        assert not any(token[-16:] in text for text in shown)


def raises(error_class, code, call):
    with pytest.raises(error_class) as caught:
        call()
    assert caught.value.code == code
    no_token_in(caught.value)
    return caught.value


@pytest.fixture(autouse=True)
def no_token_in_environment(monkeypatch):
    monkeypatch.delenv("GPUCOMPUTE_TOKEN", raising=False)


@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    tokens = tmp_path_factory.mktemp("auth") / "tokens"
    tokens.write_text(f"# test tenants\n{ALICE} alice\n{BOB} bob\n{ADMIN} root admin\n")
    with start_server(f"--tokens-file={tokens}", memory_limit=256 << 20,
                      cpu_threads=1) as address:
        yield address


@pytest.fixture(scope="module")
def tls_server():
    with start_server(f"--tls-cert={tls_file('server.pem')}",
                      f"--tls-key={tls_file('server.key')}", memory_limit=256 << 20,
                      cpu_threads=1) as address:
        yield address


@pytest.fixture(scope="module")
def mutual_tls_server():
    with start_server(f"--tls-cert={tls_file('server.pem')}",
                      f"--tls-key={tls_file('server.key')}",
                      f"--tls-client-ca={tls_file('ca.pem')}", memory_limit=256 << 20,
                      cpu_threads=1) as address:
        yield address


def connect(address, **options):
    return gpucompute.connect(address, timeout=CALL_TIMEOUT, progress=False, **options)


def round_trip(client):
    """An upload, an operation on the server, a future, and a download: every kind of
    call (unary, both streams, the futures' Submit and WaitOperation)."""
    host = np.random.default_rng(3).standard_normal((64, 33))
    with client.put(host) as x:
        with client.eval("2*x + 1", x=x) as y:
            np.testing.assert_array_equal(y.get(), 2 * host + 1)
        with client.reduce("sum", x, wait=False).result(timeout=60) as total:
            assert total.value == pytest.approx(host.sum(), rel=1e-12)


# ---------------------------------------------------------------------------
# Tokens


def test_the_right_token_works_on_every_kind_of_call(token_server):
    with connect(token_server, token=ALICE) as alice:
        info = alice.info()
        assert (info.tenant, info.admin, info.authentication_enabled) == ("alice", False, True)
        round_trip(alice)
        assert alice.buffers() == []
        assert alice.options.has_token
        assert ALICE not in repr(alice.options)


def test_no_token_or_a_wrong_one_is_unauthenticated(token_server):
    with connect(token_server, token=ALICE, client_name="c") as alice:
        kept = alice.put(np.arange(5.0), name="kept")
        for options in ({}, {"token": ""}, {"token": "wrong"}, {"token": ALICE[:-1]},
                        {"token": ALICE + "x"}):
            with connect(token_server, client_name="c", **options) as stranger:
                code = grpc.StatusCode.UNAUTHENTICATED
                raises(gpucompute.UnauthenticatedError, code, stranger.info)
                raises(gpucompute.UnauthenticatedError, code,
                       lambda: stranger.put(np.ones(1000)))  # a client stream
                raises(gpucompute.UnauthenticatedError, code,
                       lambda: stranger.download(kept.id))  # a server stream
                raises(gpucompute.UnauthenticatedError, code,
                       lambda: stranger.put(np.ones(5), into=kept.id))
                future = stranger.eval("x * 0", x=kept.id, out=kept.id, wait=False)
                error = future.exception(timeout=60)
                assert isinstance(error, gpucompute.UnauthenticatedError)
                no_token_in(error)
        assert [b.id for b in alice.buffers()] == [kept.id]
        np.testing.assert_array_equal(kept.get(), np.arange(5.0))


def test_tenants_cannot_see_each_others_buffers(token_server):
    host = np.arange(12, dtype=np.int64).reshape(3, 4)
    # The same client name: only the token tells the two apart.
    with connect(token_server, token=ALICE, client_name="same") as alice, \
            connect(token_server, token=BOB, client_name="same") as bob:
        x = alice.put(host, name="x")
        made_up = "buf-" + "0" * 32
        code = grpc.StatusCode.NOT_FOUND
        attempts = [
            lambda ref: bob.download(ref),
            lambda ref: bob.buffer(ref),
            lambda ref: bob.put(np.zeros((3, 4), np.int64), into=ref),
            lambda ref: bob.eval("x * 0", x=ref, out=ref),
            lambda ref: bob.reduce("sum", ref),
            lambda ref: bob.delete(ref),
        ]
        for attempt in attempts:
            theirs = raises(gpucompute.NotFoundError, code, lambda: attempt(x.id))
            unknown = raises(gpucompute.NotFoundError, code, lambda: attempt(made_up))
            # Exactly what an id that does not exist gets.
            assert theirs.details.replace(x.id, "ID") == unknown.details.replace(made_up, "ID")
        raises(gpucompute.NotFoundError, code, lambda: bob.download("x"))
        assert bob.buffers() == []
        bob_x = bob.put(np.full(3, 7.0), name="x")  # a name of bob's own
        assert [b.id for b in alice.buffers()] == [x.id]
        np.testing.assert_array_equal(alice.download("x"), host)
        np.testing.assert_array_equal(bob.download("x"), np.full(3, 7.0))
        bob_x.delete()


def test_the_token_comes_from_the_environment_or_a_file(token_server, monkeypatch, tmp_path):
    monkeypatch.setenv("GPUCOMPUTE_TOKEN", BOB)
    with connect(token_server) as from_environment:
        assert from_environment.info().tenant == "bob"
    # An explicit token wins, and "" sends none.
    with connect(token_server, token=ALICE) as explicit:
        assert explicit.info().tenant == "alice"
    with connect(token_server, token="") as without:
        raises(gpucompute.UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED, without.info)
    token_file = tmp_path / "token"
    token_file.write_text(f"  {ALICE}  \nsecond line\n")
    with connect(token_server, token_file=token_file) as from_file:
        assert from_file.info().tenant == "alice"


def test_admin_only_calls_need_an_admin_token(token_server):
    with connect(token_server, token=BOB) as bob:
        raises(gpucompute.PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED,
               bob.trim_memory_pool)
    with connect(token_server, token=ADMIN) as admin:
        assert admin.info().admin
        admin.trim_memory_pool()


def test_bad_tokens_are_refused_without_repeating_them(token_server, tmp_path):
    for token in (ALICE + "\n", "\t" + ALICE, ALICE + "\u00e9"):
        with pytest.raises(ValueError, match="printable ASCII") as caught:
            connect(token_server, token=token)
        no_token_in(caught.value)
    with pytest.raises(ValueError, match="not both"):
        connect(token_server, token=ALICE, token_file=tmp_path / "x")
    with pytest.raises(ValueError, match="cannot read the token file"):
        connect(token_server, token_file=tmp_path / "missing")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        connect(token_server, token_file=tmp_path / "empty")


def test_asyncio_client_sends_the_token(token_server, monkeypatch):
    host = np.arange(1000.0)

    async def main():
        async with gpucompute.aio.connect(token_server, token=ALICE,
                                          timeout=CALL_TIMEOUT) as alice:
            assert (await alice.info()).tenant == "alice"
            x = await alice.put(host)
            y = await alice.eval("x + 1", x=x, wait=False)
            await y.wait()
            np.testing.assert_array_equal(await y.get(), host + 1)
            await x.delete()
            await y.delete()
        monkeypatch.setenv("GPUCOMPUTE_TOKEN", BOB)
        async with gpucompute.aio.connect(token_server, timeout=CALL_TIMEOUT) as bob:
            assert (await bob.info()).tenant == "bob"
        async with gpucompute.aio.connect(token_server, token="wrong",
                                          timeout=CALL_TIMEOUT) as stranger:
            for call in (stranger.info(), stranger.put(host)):
                with pytest.raises(gpucompute.UnauthenticatedError) as caught:
                    await call
                no_token_in(caught.value)

    asyncio.run(main())


# ---------------------------------------------------------------------------
# TLS


def test_tls_with_the_servers_ca(tls_server):
    with connect(tls_server, tls_ca=tls_file("ca.pem")) as client:
        assert client.options.tls
        assert not client.info().authentication_enabled
        round_trip(client)
    with open(tls_file("ca.pem"), "rb") as file:
        ca = file.read()
    # The CA as bytes, and the name the certificate carries given explicitly.
    with connect(tls_server, tls_ca=ca, tls_server_name="localhost") as client:
        assert client.info().admin


def test_tls_refuses_what_it_cannot_verify(tls_server):
    code = grpc.StatusCode.UNAVAILABLE
    for options in ({},  # plaintext to a TLS port
                    {"tls_ca": tls_file("other-ca.pem")},
                    {"tls": True},  # the system's CAs do not know the test CA
                    {"tls_ca": tls_file("ca.pem"), "tls_server_name": "gpucompute.example.com"}):
        with connect(tls_server, **options) as client:
            raises(gpucompute.UnavailableError, code, client.info)
            raises(gpucompute.UnavailableError, code, lambda: client.put(np.ones(10)))


def test_mutual_tls_needs_a_client_certificate_the_server_trusts(mutual_tls_server):
    with connect(mutual_tls_server, tls_ca=tls_file("ca.pem"), tls_cert=tls_file("alice.pem"),
                 tls_key=tls_file("alice.key")) as alice:
        info = alice.info()
        assert (info.tenant, info.admin, info.authentication_enabled) == ("alice", False, True)
        round_trip(alice)
    with open(tls_file("alice.pem"), "rb") as cert, open(tls_file("alice.key"), "rb") as key:
        as_bytes = {"tls_cert": cert.read(), "tls_key": key.read()}
    with connect(mutual_tls_server, tls_ca=tls_file("ca.pem"), **as_bytes) as alice:
        assert alice.info().tenant == "alice"
    for cert in (None, "mallory"):  # none, and one another CA signed (CN=alice too)
        options = {} if cert is None else {"tls_cert": tls_file(f"{cert}.pem"),
                                           "tls_key": tls_file(f"{cert}.key")}
        with connect(mutual_tls_server, tls_ca=tls_file("ca.pem"), **options) as client:
            raises(gpucompute.UnavailableError, grpc.StatusCode.UNAVAILABLE, client.info)


def test_asyncio_client_over_mutual_tls(mutual_tls_server):
    async def main():
        async with gpucompute.aio.connect(
                mutual_tls_server, tls_ca=tls_file("ca.pem"), tls_cert=tls_file("alice.pem"),
                tls_key=tls_file("alice.key"), timeout=CALL_TIMEOUT) as alice:
            assert (await alice.info()).tenant == "alice"
            x = await alice.put(np.arange(7, dtype=np.int32))
            np.testing.assert_array_equal(await x.get(), np.arange(7, dtype=np.int32))
            await x.delete()
        async with gpucompute.aio.connect(mutual_tls_server, tls_ca=tls_file("ca.pem"),
                                          timeout=CALL_TIMEOUT) as anonymous:
            with pytest.raises(gpucompute.UnavailableError):
                await anonymous.info()

    asyncio.run(main())


def test_bad_tls_options():
    with pytest.raises(ValueError, match="go together"):
        gpucompute.connect("127.0.0.1:1", tls_cert=tls_file("alice.pem"))
    with pytest.raises(ValueError, match="go together"):
        gpucompute.connect("127.0.0.1:1", tls_ca=tls_file("ca.pem"), tls_key=tls_file("alice.key"))
    with pytest.raises(ValueError, match="tls=False"):
        gpucompute.connect("127.0.0.1:1", tls=False, tls_ca=tls_file("ca.pem"))
    with pytest.raises(ValueError, match="cannot read the TLS CA .*missing.pem"):
        gpucompute.connect("127.0.0.1:1", tls_ca=tls_file("missing.pem"))
    assert not gpucompute.connect("127.0.0.1:1").options.tls
    assert gpucompute.connect("127.0.0.1:1", tls_server_name="localhost").options.tls
