"""Accounting from the lease ledger's audit log: who used which accelerator, how much.

Pure functions over audit events (JSON lines written by the hooks):
``acquire`` opens a lease; ``revoke`` (the job's fds on it are dead: a USB
stick's release then follows once it is back), ``release``, ``reclaim``,
``clear`` or ``rollback`` closes it;
``usage`` (written by the epilog from the runner's records) adds inference
counts, inference time and energy to the job's lease on that device.

An audit log may hold anything an older version let through (a job's forged
``inferences: 1e400``, negative energy, NaN): events whose numbers are not
plausible (:func:`slurm_tpu.usage.checked`) or whose time is not a finite number
are skipped, so a report can never die of them or be dominated by them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from ..usage import checked

CLOSING = ("revoke", "release", "reclaim", "clear", "rollback")


@dataclass
class LeaseRecord:
    """One job's lease on one device, with what the job reported doing on it."""

    identity: str
    job_id: int
    uid: int
    start: float
    end: float | None = None  # None: still leased
    inferences: int = 0
    inference_seconds: float = 0.0
    energy_j: float | None = None

    def seconds_within(self, since: float | None, until: float | None, now: float) -> float:
        """Lease time overlapping [since, until)."""
        start = max(self.start, since) if since is not None else self.start
        end = self.end if self.end is not None else now
        if until is not None:
            end = min(end, until)
        return max(0.0, end - start)


def read_events(lines: Iterable[str]) -> Iterator[dict]:
    """Audit events; unparseable lines (a torn last line after a crash) are skipped, as
    are events without a finite time (``t``)."""
    for line in lines:
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(event, dict) and "event" in event and _finite_time(event.get("t")):
            yield event


def _finite_time(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def lease_records(events: Iterable[dict]) -> list[LeaseRecord]:
    """Pair acquire/close events per (device, job) and attach usage; in start order."""
    open_leases: dict[tuple[str, int], LeaseRecord] = {}
    done: list[LeaseRecord] = []
    latest: dict[tuple[str, int], LeaseRecord] = {}
    for event in events:
        job_id, uid = event.get("job_id"), event.get("uid", -1)
        if not isinstance(job_id, int) or not isinstance(uid, int) or "identity" not in event:
            continue  # events without a job (e.g. a device removal), or not ours
        key = (str(event["identity"]), job_id)
        kind = event["event"]
        if kind == "acquire":
            record = LeaseRecord(key[0], key[1], uid, float(event["t"]))
            open_leases[key] = latest[key] = record
        elif kind in CLOSING and key in open_leases:
            record = open_leases.pop(key)
            record.end = float(event["t"])
            done.append(record)
        elif kind == "usage" and key in latest:
            figures = checked(event.get("inferences"), event.get("seconds"), event.get("energy_j"))
            if figures is None:
                continue  # implausible numbers: not counted at all
            record = latest[key]
            record.inferences += figures[0]
            record.inference_seconds += figures[1]
            if figures[2] is not None:
                record.energy_j = (record.energy_j or 0.0) + figures[2]
    return sorted(done + list(open_leases.values()), key=lambda r: (r.start, r.identity))


@dataclass
class Totals:
    """Sums over a group of lease records."""

    jobs: set[int] = field(default_factory=set)
    leases: int = 0
    lease_seconds: float = 0.0
    inferences: int = 0
    inference_seconds: float = 0.0
    energy_j: float | None = None

    def add(self, record: LeaseRecord, seconds: float) -> None:
        self.jobs.add(record.job_id)
        self.leases += 1
        self.lease_seconds += seconds
        self.inferences += record.inferences
        self.inference_seconds += record.inference_seconds
        if record.energy_j is not None:
            self.energy_j = (self.energy_j or 0.0) + record.energy_j

    def to_json(self) -> dict:
        mean = self.inference_seconds / self.inferences * 1000 if self.inferences else None
        return {"jobs": len(self.jobs), "leases": self.leases, "lease_seconds": round(self.lease_seconds, 3),
                "inferences": self.inferences, "inference_seconds": round(self.inference_seconds, 6),
                "mean_latency_ms": None if mean is None else round(mean, 3),
                "energy_j": None if self.energy_j is None else round(self.energy_j, 3)}


def summarize(records: Iterable[LeaseRecord], by: str, since: float | None, until: float | None,
              now: float, user_name=str) -> dict[str, Totals]:
    """Totals per user, device or job for leases overlapping [since, until)."""
    groups: dict[str, Totals] = {}
    for record in records:
        end = record.end if record.end is not None else now
        if (since is not None and end < since) or (until is not None and record.start >= until):
            continue
        key = {"user": lambda: user_name(record.uid), "device": lambda: record.identity,
               "job": lambda: str(record.job_id)}[by]()
        groups.setdefault(key, Totals()).add(record, record.seconds_within(since, until, now))
    return dict(sorted(groups.items()))
