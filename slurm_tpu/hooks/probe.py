"""Opt-in timing probes for the root hooks: where each millisecond of a hook goes.

Off unless the hook's environment names a file in ``SLURM_TPU_HOOK_PROFILE``
(bench/bench_hooks.py --profile sets it in its timing wrappers, which also export
``SLURM_TPU_PROFILE_T0``, the wall clock when the wrapper started the hook). Each
hook run then appends one line: ``<hook> start=<ms> <step>=<ms> ...``, where
``start`` is the wrapper's start to the first line of the Python entry script
(sh, exec, interpreter start-up), or to the agent's worker waking for the hook's
connection (its own steps follow: ``accept``, ``request``, ``environ``), and every step is the time since the previous
mark. Off, a mark costs one attribute test; stdlib only, no import the hooks'
budget forbids.
"""

from __future__ import annotations

import os
import time

_file: str | None = None
_marks: list[tuple[str, int]] = []
_start_ms: float | None = None
_before: list[tuple[str, float]] = []  # (step, ms): steps timed before begin() (the agent's worker's)
_t0 = ""  # the wrapper's SLURM_TPU_PROFILE_T0, as it gave it: joins this line to the wrapper's own record


def begin(environ, wall_at_entry: float | None = None, before: tuple[tuple[str, float], ...] = ()) -> None:
    """Start profiling this hook run if the environment asks for it.

    ``before``: (step, wall clock at its end) of steps after ``wall_at_entry`` that ran before
    the hook's code (the agent's worker: reading the request, taking its environment).
    """
    global _file, _start_ms, _t0
    _file = environ.get("SLURM_TPU_HOOK_PROFILE") or None
    if _file is None:
        return
    _marks.clear()
    _marks.append(("", time.perf_counter_ns()))
    _before.clear()
    _t0 = t0 = environ.get("SLURM_TPU_PROFILE_T0", "")
    _start_ms = None
    try:
        if wall_at_entry is not None and t0:
            _start_ms = (wall_at_entry - float(t0)) * 1000
    except ValueError:
        return
    if wall_at_entry is not None:
        previous = wall_at_entry
        for step, wall in before:
            _before.append((step, (wall - previous) * 1000))
            previous = wall


def mark(step: str) -> None:
    """Close the step that ran since the previous mark."""
    if _file is not None:
        _marks.append((step, time.perf_counter_ns()))


def finish(hook: str) -> None:
    """Append this run's line to the profile file (never fails the hook)."""
    if _file is None:
        return
    fields = [hook]
    if _start_ms is not None:
        fields.append(f"start={_start_ms:.2f}")
    fields += [f"{step}={ms:.2f}" for step, ms in _before]
    for (_, before), (step, after) in zip(_marks, _marks[1:]):
        fields.append(f"{step}={(after - before) / 1e6:.2f}")
    # Where the line was written (wall clock) and which wrapper run it belongs to: the time from
    # here to the wrapper's end is the hook's tail (its answer, the client's and the wrapper's exit).
    fields += [f"t0={_t0}", f"at={time.time():.6f}", f"pid={os.getpid()}"] if _t0 else []
    try:
        fd = os.open(_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, (" ".join(fields) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass
