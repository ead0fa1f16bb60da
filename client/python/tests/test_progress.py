"""The progress bar of long transfers, shown by default (when stderr is a terminal)
through the NumPy layer's paths as through put() and get()."""

import io
import sys

import numpy as np
import pytest

import gpucompute
from gpucompute import _progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _terminal(monkeypatch):
    """stderr as a terminal, tqdm absent, and a bar for transfers from 64 KiB on. Called
    in the test itself: pytest sets its own stderr after the fixtures."""
    stderr = _Terminal()
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import fails
    monkeypatch.setattr(_progress, "AUTO_MIN_BYTES", 1 << 16)
    return stderr


def _bars(stderr):
    """The labels of the bars drawn and closed since the last call."""
    text = stderr.getvalue()
    stderr.seek(0)
    stderr.truncate()
    return [part.split(" [")[0] for part in text.split("\r") if "100.0%" in part]


def test_long_transfers_show_a_bar_through_the_numpy_layer(server_address, client,
                                                            monkeypatch):
    terminal = _terminal(monkeypatch)
    host = np.random.default_rng(11).standard_normal(200_000)  # 1.6 MB
    with gpucompute.connect(server_address, client_name=client.options.client_name,
                            chunk_bytes=1 << 16) as c:
        x = c.put(host)
        assert _bars(terminal) == ["put"]
        np.testing.assert_array_equal(np.asarray(x), host)
        assert _bars(terminal) == ["get"]
        np.testing.assert_array_equal(np.asarray(2 * x + 1), 2 * host + 1)  # pending
        assert _bars(terminal) == ["get"]
        np.testing.assert_array_equal(np.asarray(x.reshape(400, 500)[:, ::2]),
                                      host.reshape(400, 500)[:, ::2])  # a view
        assert _bars(terminal) == ["get"]
        doubled = gpucompute.program(lambda v: v * 2)(x)  # a program's output
        np.testing.assert_array_equal(doubled.get(), host * 2)
        assert _bars(terminal) == ["get"]
        # Short transfers, and float() of one element, show none.
        assert float(x[7]) == host[7] and float(x.sum()) == pytest.approx(host.sum())
        np.testing.assert_array_equal(np.asarray(c.put(host[:1000])), host[:1000])
        assert _bars(terminal) == []
        assert terminal.getvalue() == ""
