"""Progress of long transfers: tqdm when installed, else one plain line on stderr."""

import sys
import time

# Transfers shorter than this show no bar unless one is asked for.
AUTO_MIN_BYTES = 64 << 20


class _Silent:
    def update(self, done):
        pass

    def close(self):
        pass


class _Callback:
    def __init__(self, function, total):
        self._function = function
        self._total = total

    def update(self, done):
        self._function(done, self._total)

    def close(self):
        pass


class _Tqdm:
    def __init__(self, tqdm, label, total):
        self._bar = tqdm(total=total, desc=label, unit="B", unit_scale=True, unit_divisor=1024,
                         leave=False)
        self._done = 0

    def update(self, done):
        self._bar.update(done - self._done)
        self._done = done

    def close(self):
        self._bar.close()


class _Line:
    """A bar drawn on one stderr line, at most ten times a second."""

    def __init__(self, label, total):
        self._label = label
        self._total = total
        self._start = time.monotonic()
        self._last_draw = 0.0

    def update(self, done):
        now = time.monotonic()
        if now - self._last_draw < 0.1 and done < self._total:
            return
        self._last_draw = now
        fraction = done / self._total if self._total else 1.0
        width = 30
        filled = int(fraction * width)
        rate = done / max(now - self._start, 1e-9) / 1e9
        sys.stderr.write(f"\r{self._label} [{'#' * filled}{'.' * (width - filled)}] "
                         f"{fraction * 100:5.1f}%  {rate:.2f} GB/s")
        sys.stderr.flush()

    def close(self):
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


def make_progress(setting, label, total):
    """A progress reporter for a transfer of `total` bytes.

    `setting`: None shows a bar for transfers of AUTO_MIN_BYTES or more when stderr is
    a terminal; True always shows one; False never; a callable is called as
    setting(done_bytes, total_bytes) after each chunk.
    """
    if callable(setting):
        return _Callback(setting, total)
    if setting is None:
        setting = total >= AUTO_MIN_BYTES and sys.stderr.isatty()
    if not setting:
        return _Silent()
    try:
        from tqdm import tqdm
    except ImportError:
        return _Line(label, total)
    return _Tqdm(tqdm, label, total)
