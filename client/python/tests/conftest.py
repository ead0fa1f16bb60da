"""Starts one real gpucompute-server on a free loopback port for the session, and gives
each test a client of its own name, so that names never collide. start_server runs more,
with flags of their own (tokens, TLS, shared memory).

The backend is $GPUCOMPUTE_TEST_BACKEND: cpu (the default) or cuda, which runs the whole
suite on the GPU machine ($GPUCOMPUTE_CUDA_MODULE, if set, reaches the server through
the environment it inherits)."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import gpucompute  # noqa: E402
from gpucompute import _dispatch  # noqa: E402

REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
# Room for the test above 2 GiB and little else: 3 GiB of buffers; beyond it,
# RESOURCE_EXHAUSTED.
MEMORY_LIMIT_BYTES = 3 << 30
_LISTENING = re.compile(rb"listening on port (\d+)")
BACKEND = os.environ.get("GPUCOMPUTE_TEST_BACKEND", "cpu")
if BACKEND not in ("cpu", "cuda"):
    raise RuntimeError(f"GPUCOMPUTE_TEST_BACKEND must be cpu or cuda, not {BACKEND!r}")
# The subprocess.Popen of each server start_server runs, by address: for tests that
# signal it (a reload) or kill it.
SERVER_PROCESSES = {}


def _server_binary():
    path = os.environ.get("GPUCOMPUTE_SERVER_BIN",
                          os.path.join(REPO, "build", "server", "gpucompute-server"))
    if not os.access(path, os.X_OK):
        pytest.exit(f"no gpucompute-server at {path}; build it or set GPUCOMPUTE_SERVER_BIN",
                    returncode=2)
    return path


@contextlib.contextmanager
def start_server(*flags, memory_limit=MEMORY_LIMIT_BYTES, cpu_threads=2):
    """Runs a gpucompute-server (BACKEND) with `flags` on a free loopback port and
    yields its address, "127.0.0.1:PORT"; stops it (SIGTERM) at the end."""
    process = subprocess.Popen(
        [_server_binary(), f"--backend={BACKEND}", "--listen=127.0.0.1:0",
         f"--memory-limit={memory_limit}", f"--cpu-threads={cpu_threads}", *flags],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines = []
    port = []
    found = threading.Event()

    # Keeps reading stderr after the port is known, so that the server never blocks
    # on a full pipe; the lines are shown if it fails to start.
    def read_stderr():
        for line in process.stderr:
            lines.append(line)
            match = _LISTENING.search(line)
            if match and not port:
                port.append(int(match.group(1)))
                found.set()
        found.set()

    threading.Thread(target=read_stderr, daemon=True).start()
    if not found.wait(60) or not port:
        process.kill()
        pytest.exit("gpucompute-server did not start:\n" + b"".join(lines).decode(errors="replace"),
                    returncode=2)
    address = f"127.0.0.1:{port[0]}"
    SERVER_PROCESSES[address] = process
    try:
        yield address
    finally:
        SERVER_PROCESSES.pop(address, None)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def nep50():
    """NumPy's promotion as the server has it (NEP 50): NumPy 1.24 has it behind a
    switch, NumPy 2 always."""
    state = getattr(np, "_get_promotion_state", lambda: None)()
    if state is not None:
        np._set_promotion_state("weak")
    yield
    if state is not None:
        np._set_promotion_state(state)


@pytest.fixture(scope="session")
def server_address():
    with start_server() as address:
        yield address


def client_name_for(request):
    return re.sub(r"[^ -~]", "?", request.node.name)[:100]


@pytest.fixture
def client(server_address, request):
    """A client named after the test; its buffers are deleted after the test, so that
    the server's memory limit holds for the next."""
    with gpucompute.connect(server_address, client_name=client_name_for(request),
                            progress=False) as c:
        yield c
        # The array layer deletes collected arrays' buffers in the background: let those
        # deletes finish first, or one of them may take a buffer listed here.
        _dispatch.flush(c)
        for buffer in c.buffers():
            buffer.delete()
