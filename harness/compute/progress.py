"""Progress for long work: a tqdm bar on a terminal; elsewhere (batch jobs, CI logs) a plain log line at least every
30 seconds and one at the end, since a carriage-return bar in a log file is unreadable."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

from harness.compute import distributed

log = logging.getLogger("harness")

LOG_EVERY_S = 30.0


class Progress:
    """``with Progress(total, "generate") as bar: ... bar.update(n, loss="1.2")``."""

    def __init__(self, total: int, desc: str, unit: str = "it", every_s: float = LOG_EVERY_S):
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.done = 0
        self.tty = sys.stderr.isatty() and distributed.is_main()  # one bar per launch
        self._bar = None
        self._start = self._last = time.monotonic()
        self._postfix: dict = {}
        self._logged = -1  # ``done`` at the last log line

    def __enter__(self) -> Progress:
        if self.tty:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.total, desc=self.desc, unit=self.unit)
        return self

    def update(self, n: int = 1, **postfix) -> None:
        self.done += n
        self._postfix.update(postfix)
        if self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix(postfix, refresh=False)
        elif time.monotonic() - self._last >= self.every_s:
            self._log()

    def _log(self) -> None:
        self._logged = self.done
        self._last = now = time.monotonic()
        elapsed = now - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        extra = "".join(f", {k}={v}" for k, v in self._postfix.items())
        log.info(
            "%s: %d/%d %s (%.0f%%), %.0fs elapsed, ~%.0fs left%s",
            self.desc,
            self.done,
            self.total,
            self.unit + "s",
            100 * self.done / max(self.total, 1),
            elapsed,
            eta,
            extra,
        )

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()
        elif exc[0] is None and self._logged != self.done:  # the closing line, unless the last update just logged it
            self._log()


@contextmanager
def library_output(log_file: Path | str) -> Iterator[None]:
    """Send everything written to this process's stdout and stderr (by Python or by C code: banners, progress bars,
    per-layer tables of quantization and pruning libraries) to ``log_file`` while the block runs, so that the
    harness's own lines stay readable; the file stays in the stage folder for whoever wants the details. Python's
    ``sys.stdout``/``sys.stderr`` are redirected as well as the file descriptors, as they need not be the same
    (a caller that captures output, such as a notebook or a test)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_file, "a", buffering=1) as sink, redirect_stdout(sink), redirect_stderr(sink):
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sink.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
