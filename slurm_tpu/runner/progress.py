"""Progress: a live bar on a terminal, a one-line report every N seconds in batch logs."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Counts finished inputs; renders to ``stream`` (stderr by default)."""

    def __init__(
        self,
        total: int,
        stream: TextIO | None = None,
        interval: float = 30.0,
        enabled: bool = True,
        clock=time.monotonic,
    ):
        self.total, self.done, self.errors = total, 0, 0
        self.skipped = 0  # inputs already in the results file (a resumed run)
        self.stream = stream or sys.stderr
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.enabled = enabled
        self.interval = 0.1 if self.tty else interval
        self.clock = clock
        self.started = self._last = clock()

    def update(self, n: int = 1, errors: int = 0) -> None:
        self.done += n
        self.errors += errors
        now = self.clock()
        if self.enabled and now - self._last >= self.interval:
            self._last = now
            self._render(now)

    def line(self, now: float | None = None) -> str:
        """E.g. ``120/1000 inputs (12%), 45.2/s, 0 errors, elapsed 0:00:02, eta 0:00:19``."""
        now = self.clock() if now is None else now
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        pct = 100 * self.done / self.total if self.total else 100.0
        resumed = f" ({self.skipped} already done)" if self.skipped else ""
        return (
            f"{self.done}/{self.total} inputs{resumed} ({pct:.0f}%), {rate:.1f}/s, {self.errors} errors, "
            f"elapsed {_duration(elapsed)}, eta {_duration(eta)}"
        )

    def _render(self, now: float) -> None:
        if self.tty:
            width = 30
            filled = int(width * self.done / self.total) if self.total else width
            self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.line(now)}\033[K")
        else:
            self.stream.write(f"slurm-tpu: progress: {self.line(now)}\n")
        self.stream.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self.tty:
            self._render(self.clock())
            self.stream.write("\n")
        else:
            self.stream.write(f"slurm-tpu: done: {self.line()}\n")
        self.stream.flush()
