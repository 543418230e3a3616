"""Which request a device runs next: start-time fair queuing over jobs, weighted by shares.

Each job has a queue and a virtual finish time F (seconds of device time per share it has
been given). A job's head request starts at S = max(V, F), V being the virtual time of the
last request put in service; the device takes the request with the lowest S, and once it ran,
the job is charged its *measured* busy time: F = S + busy / shares. Under saturation every
job's F advances at the same pace, so device time splits in proportion to shares whatever
each request costs. A job that was idle re-enters at V: it banks no credit for the time it
asked for nothing (S = max(V, F)), while one that ran ahead (F > V) keeps its debt.

Ties (start times within ``tie_window`` of the lowest) go to the job whose next request is
for the model the device already holds: a swap costs a parameter-cache upload on an Edge
TPU. The window bounds how far that preference may bend fairness (one window's worth of
device time per share, never more).

Pure: no threads, no clock; the executor calls it under its lock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _JobQueue:
    shares: int
    finish: float = 0.0  # virtual time at which the job's service so far ends
    queue: deque = field(default_factory=deque)  # (model, item)


class Scheduler:
    """Per-job queues and the fair choice between them."""

    def __init__(self, tie_window: float = 0.0005):
        self.virtual = 0.0
        self.tie_window = tie_window
        self._jobs: dict[int, _JobQueue] = {}

    def add_job(self, job: int, shares: int) -> None:
        """A job that may submit (again: its shares are updated, its queue kept)."""
        if shares < 1:
            raise ValueError(f"job {job}: shares must be >= 1, not {shares}")
        existing = self._jobs.get(job)
        if existing is None:
            self._jobs[job] = _JobQueue(shares, finish=self.virtual)
        else:
            existing.shares = shares

    def remove_job(self, job: int) -> list[Any]:
        """Forget ``job``; returns the items it still had queued (never run)."""
        entry = self._jobs.pop(job, None)
        return [item for _, item in entry.queue] if entry else []

    def has_job(self, job: int) -> bool:
        return job in self._jobs

    def submit(self, job: int, model: str, item: Any) -> None:
        """Queue ``item`` (a request for ``model``) behind the job's others; KeyError for an unknown job."""
        self._jobs[job].queue.append((model, item))

    def queued(self, job: int | None = None) -> int:
        """Requests waiting (of one job, or of all)."""
        if job is not None:
            entry = self._jobs.get(job)
            return len(entry.queue) if entry else 0
        return sum(len(e.queue) for e in self._jobs.values())

    def pick(self, current_model: str | None = None) -> tuple[int, str, Any] | None:
        """The next request to run, taken off its queue: (job, model, item); None when all are empty."""
        best: tuple[float, int] | None = None
        starts: dict[int, float] = {}
        for job, entry in self._jobs.items():
            if not entry.queue:
                continue
            start = max(self.virtual, entry.finish)
            starts[job] = start
            if best is None or (start, job) < best:
                best = (start, job)
        if best is None:
            return None
        chosen = best[1]
        if current_model is not None and self._jobs[chosen].queue[0][0] != current_model:
            limit = best[0] + self.tie_window
            holding = [j for j, s in starts.items() if s <= limit and self._jobs[j].queue[0][0] == current_model]
            if holding:
                chosen = min(holding, key=lambda j: (starts[j], j))
        entry = self._jobs[chosen]
        start = starts[chosen]
        self.virtual = max(self.virtual, start)
        entry.finish = start  # the charge adds the measured cost
        model, item = entry.queue.popleft()
        return chosen, model, item

    def charge(self, job: int, busy_s: float) -> None:
        """Account ``busy_s`` seconds of device time to ``job`` (a job closed meanwhile is ignored)."""
        entry = self._jobs.get(job)
        if entry is not None:
            entry.finish += max(0.0, busy_s) / entry.shares
