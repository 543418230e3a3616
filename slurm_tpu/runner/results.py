"""A batch's output: resumable result files (JSONL or CSV) and its progress lines.

Crash safety: each input's result is one ``write(2)`` of complete lines on an O_APPEND
descriptor, so a killed run leaves at most one torn last line. On restart the torn tail
is cut off (in CSV, where one input can own several rows, the last input's rows too),
the inputs named by the remaining lines are skipped, and the finished file is the same
as an uninterrupted run's.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

from .choices import CSV, JSONL
from .errors import InputError
from .tasks import Task, TaskOptions


def format_for(path: str, explicit: str | None = None) -> str:
    return explicit or (CSV if path.lower().endswith(".csv") else JSONL)


class Layout:
    """How one run's records become lines: the format and, for CSV, the task's columns."""

    def __init__(self, fmt: str, task: Task, options: TaskOptions):
        self.fmt, self.task, self.options = fmt, task, options
        self.columns = ["input", *task.csv_columns(options), "error"]

    def render(self, record: dict[str, Any]) -> str:
        """One input's result as whole lines (newlines included): one JSON line, or its CSV
        rows (one per object for detection; an input with none gets a row of its own)."""
        if self.fmt == JSONL:
            return json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n"
        rows = [] if "error" in record else self.task.csv_rows(record, self.options)
        rows = rows or [[""] * (len(self.columns) - 2)]
        return "".join(_csv_line([record["input"], *row, record.get("error", "")]) for row in rows)


def _csv_line(values: list[Any]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(values)
    return buffer.getvalue()


def _key_of(line: str, fmt: str) -> str | None:
    if fmt == JSONL:
        try:
            return json.loads(line).get("input")
        except (json.JSONDecodeError, AttributeError):
            return None
    try:
        return next(csv.reader([line]))[0]
    except (StopIteration, csv.Error, IndexError):
        return None


class ResultWriter:
    """Appends result lines to ``path``; ``done`` holds the inputs already there. Without a path
    (no --output) the lines go to ``write`` (stdout by default), not resumable."""

    def __init__(self, path: str | None, layout: Layout, write: Callable[[str], Any] | None = None):
        self.layout, self.fmt = layout, layout.fmt
        self.done: set[str] = set()
        # Without a path, where the lines go; with one, None (and after close() a write fails, EBADF).
        self._fd, self._write = -1, None
        if not path:
            self._write = write or sys.stdout.write
            if self.fmt != JSONL:
                self._write(_csv_line(layout.columns))
            return
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise InputError(f"results file {path} cannot be opened ({exc.strerror}): check --output", path) from None
        try:
            # One writer per file: two tasks of a step (or array) given the same name would
            # cut each other's lines on resume. The lock goes with the descriptor.
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise InputError(
                f"results file {path} is being written by another process (another task of "
                "this job step or array?): give each task its own file with %t (task) or "
                "%a (array task) in --output",
                path,
            ) from None
        self._recover()

    def _recover(self) -> None:
        with os.fdopen(os.dup(self._fd), "rb") as f:
            data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            # A torn last line: the run was killed mid-write. Cut it; its input is redone.
            os.ftruncate(self._fd, end)
            data = data[:end]
        lines = data.decode("utf-8", "replace").splitlines()
        if self.fmt == CSV:
            if not lines:
                os.write(self._fd, _csv_line(self.layout.columns).encode())
                return
            lines = lines[1:]  # header
            # One input may own several rows (one per object), written by one write(2);
            # a write cut short by a kill could leave some of them. Redo the last input
            # whole: drop its rows (the file then equals an uninterrupted run's).
            last = _key_of(lines[-1], CSV) if lines else None
            keep = len(lines)
            while keep and _key_of(lines[keep - 1], CSV) == last:
                keep -= 1
            if keep < len(lines):
                cut = sum(len(line.encode("utf-8")) + 1 for line in lines[keep:])
                os.ftruncate(self._fd, end - cut)
                lines = lines[:keep]
        for line in lines:
            key = _key_of(line, self.fmt)
            if key is not None:
                self.done.add(key)

    def write(self, record: dict[str, Any]) -> None:
        if self._write is not None:
            self._write(self.layout.render(record))
            return
        data = self.layout.render(record).encode("utf-8")
        while data:  # one write(2) for regular files; loop only if the kernel wrote less
            data = data[os.write(self._fd, data) :]

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- progress: a live bar on a terminal, a one-line report every N seconds in batch logs --------


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Counts finished inputs; renders to ``stream`` (stderr by default). The batch sets its counts
    (write_batch)."""

    def __init__(self, stream: TextIO | None = None, interval: float = 30.0, enabled: bool = True):
        self.total, self.done, self.errors = 0, 0, 0
        self.skipped = 0  # inputs already in the results file (a resumed run)
        self.stream = stream or sys.stderr
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.enabled = enabled
        self.interval = 0.1 if self.tty else interval
        self.started = self._last = time.monotonic()

    def update(self, n: int = 1, errors: int = 0) -> None:
        self.done += n
        self.errors += errors
        now = time.monotonic()
        if self.enabled and now - self._last >= self.interval:
            self._last = now
            self._render(now)

    def line(self, now: float | None = None) -> str:
        """E.g. ``120/1000 inputs (12%), 45.2/s, 0 errors, elapsed 0:00:02, eta 0:00:19``."""
        now = time.monotonic() if now is None else now
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
            self._render(time.monotonic())
            self.stream.write("\n")
        else:
            self.stream.write(f"slurm-tpu: done: {self.line()}\n")
        self.stream.flush()


def write_batch(
    keys: Sequence[str],
    writer: ResultWriter,
    progress: Progress,
    records: Callable[[list[str]], Iterable[dict[str, Any]]],
) -> tuple[int, int]:
    """Write the records ``records(todo)`` yields, in order, for the inputs of ``keys`` not yet
    in ``writer``, counting them on ``progress``; closes both. (Processed, failed.)"""
    todo = [k for k in keys if k not in writer.done]
    progress.total, progress.skipped = len(todo), len(keys) - len(todo)
    progress.done = progress.errors = 0  # this batch's counts, also what is returned
    try:
        for record in records(todo):
            writer.write(record)
            progress.update(1, int("error" in record))
    finally:
        writer.close()
        progress.close()
    return progress.done, progress.errors
