"""Opt-in timing probes for the root hooks: where each millisecond of a hook goes.

Off unless the hook's environment names a file in ``SLURM_TPU_HOOK_PROFILE`` (bench/bench_hooks.py
--profile sets it, and ``SLURM_TPU_PROFILE_T0``, the wall clock when its wrapper started the
hook). Each hook run then appends one line: ``<hook> start=<ms> <step>=<ms> ...``, where
``start`` is the wrapper's start to the first line of the Python entry script, or to the
agent's worker waking for the hook (its own steps follow), and every step is the time since
the previous mark. Off, a mark costs one attribute test.
"""

from __future__ import annotations

import os
import time


class Probe:
    """One hook run's timing line; off (every call a no-op) unless the environment names a profile
    file. Made at the hook's entry, it travels on the run (HookRun)."""

    __slots__ = ("file", "marks", "start_ms", "before", "t0")

    def __init__(self, environ, wall_at_entry: float | None = None, before: tuple[tuple[str, float], ...] = ()):
        """``wall_at_entry``: when the hook's process (or the agent's worker) started on it. ``before``:
        (step, wall clock at its end) of the agent's worker's steps before the hook's code."""
        self.file: str | None = environ.get("SLURM_TPU_HOOK_PROFILE") or None
        self.marks: list[tuple[str, int]] = []
        self.before: list[tuple[str, float]] = []  # (step, ms)
        self.start_ms: float | None = None
        self.t0 = ""  # the wrapper's SLURM_TPU_PROFILE_T0, as it gave it: joins this line to its own record
        if self.file is None:
            return
        self.marks.append(("", time.perf_counter_ns()))
        self.t0 = t0 = environ.get("SLURM_TPU_PROFILE_T0", "")
        try:
            if wall_at_entry is not None and t0:
                self.start_ms = (wall_at_entry - float(t0)) * 1000
        except ValueError:
            return
        if wall_at_entry is not None:
            previous = [wall_at_entry, *(wall for _, wall in before)]
            self.before = [(step, (wall - since) * 1000) for (step, wall), since in zip(before, previous)]

    def mark(self, step: str) -> None:
        """Close the step that ran since the previous mark."""
        if self.file is not None:
            self.marks.append((step, time.perf_counter_ns()))

    def finish(self, hook: str) -> None:
        """Append this run's line to the profile file (never fails the hook)."""
        if self.file is None:
            return
        fields = [hook]
        if self.start_ms is not None:
            fields.append(f"start={self.start_ms:.2f}")
        fields += [f"{step}={ms:.2f}" for step, ms in self.before]
        for (_, before), (step, after) in zip(self.marks, self.marks[1:]):
            fields.append(f"{step}={(after - before) / 1e6:.2f}")
        # Where the line was written (wall clock) and which wrapper run it belongs to: the time from
        # here to the wrapper's end is the hook's tail (its answer, the client's and the wrapper's exit).
        fields += [f"t0={self.t0}", f"at={time.time():.6f}", f"pid={os.getpid()}"] if self.t0 else []
        try:
            fd = os.open(self.file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, (" ".join(fields) + "\n").encode())
            finally:
                os.close(fd)
        except OSError:
            pass


OFF = Probe({})  # for a caller that times nothing (an admin command ending a lease)
