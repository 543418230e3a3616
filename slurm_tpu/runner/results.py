"""Resumable result files (JSONL or CSV): whole lines, appended, flushed one by one.

Crash safety: each result is one ``write(2)`` of one complete line on an O_APPEND
descriptor, so a killed run leaves complete lines plus at most one torn last line
(a line without its newline). On restart the torn tail is cut off, the inputs named
by the complete lines are skipped, and the run continues where it stopped: the
finished file is the same as an uninterrupted run's.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

from .errors import InputError

JSONL, CSV = "jsonl", "csv"


def format_for(path: str, explicit: str | None = None) -> str:
    if explicit:
        return explicit
    return CSV if path.lower().endswith(".csv") else JSONL


def _csv_header(top_k: int) -> list[str]:
    """Classification: label/score per rank; raw mode (top_k 0): the outputs as JSON."""
    header = ["input"]
    for rank in range(1, top_k + 1):
        header += [f"label{rank}", f"score{rank}"]
    if not top_k:
        header.append("outputs")
    return header + ["error"]


def render_line(record: dict[str, Any], fmt: str, top_k: int) -> str:
    """One result as one line (newline included)."""
    if fmt == JSONL:
        return json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n"
    row: list[Any] = [record["input"]]
    classes = record.get("classes", [])
    for rank in range(top_k):
        if rank < len(classes):
            row += [classes[rank]["label"], classes[rank]["score"]]
        else:
            row += ["", ""]
    if not top_k:
        row.append(json.dumps(record["outputs"]) if "outputs" in record else "")
    row.append(record.get("error", ""))
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(row)
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
    """Appends result lines to ``path``; ``done`` holds the inputs already there."""

    def __init__(self, path: str, fmt: str, top_k: int):
        self.path, self.fmt, self.top_k = path, fmt, top_k
        self.done: set[str] = set()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise InputError(f"results file {path} cannot be opened ({exc.strerror}): check --output",
                             path) from None
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
                os.write(self._fd, (",".join(_csv_header(self.top_k)) + "\n").encode())
            else:
                lines = lines[1:]  # header
        for line in lines:
            key = _key_of(line, self.fmt)
            if key is not None:
                self.done.add(key)

    def write(self, record: dict[str, Any]) -> None:
        os.write(self._fd, render_line(record, self.fmt, self.top_k).encode("utf-8"))

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "ResultWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
