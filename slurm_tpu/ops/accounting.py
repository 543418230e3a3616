"""Accounting from the lease ledger's audit log: who used which accelerator, how much.

Pure functions over lease spans: :func:`slurm_tpu.protocol.audit.pair_leases`
pairs each ``acquire`` with the event that closed it and attaches the job's
``usage`` figures (inference counts, inference time, energy); here they are
summed per user, device or job over a period.

An audit log may hold anything an older version let through (a job's forged
``inferences: 1e400``, negative energy, NaN): the audit reader skips lines that
are not well-formed events and the pairing skips implausible figures
(:func:`slurm_tpu.protocol.usage.checked`), so a report can never die of them or
be dominated by them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..protocol.audit import LeaseSpan


@dataclass
class Totals:
    """Sums over a group of lease records."""

    jobs: set[int] = field(default_factory=set)
    leases: int = 0
    lease_seconds: float = 0.0
    inferences: int = 0
    inference_seconds: float = 0.0
    energy_j: float | None = None

    def add(self, record: LeaseSpan, seconds: float) -> None:
        self.jobs.add(record.job_id)
        self.leases += 1
        self.lease_seconds += seconds
        self.inferences += record.inferences
        self.inference_seconds += record.inference_seconds
        if record.energy_j is not None:
            self.energy_j = (self.energy_j or 0.0) + record.energy_j

    def to_json(self) -> dict:
        mean = self.inference_seconds / self.inferences * 1000 if self.inferences else None
        return {
            "jobs": len(self.jobs),
            "leases": self.leases,
            "lease_seconds": round(self.lease_seconds, 3),
            "inferences": self.inferences,
            "inference_seconds": round(self.inference_seconds, 6),
            "mean_latency_ms": None if mean is None else round(mean, 3),
            "energy_j": None if self.energy_j is None else round(self.energy_j, 3),
        }


def summarize(
    records: Iterable[LeaseSpan], by: str, since: float | None, until: float | None, now: float, user_name=str
) -> dict[str, Totals]:
    """Totals per user, device or job for leases overlapping [since, until)."""
    groups: dict[str, Totals] = {}
    keys: dict[str, Callable[[LeaseSpan], str]] = {
        "user": lambda span: user_name(span.uid),
        "device": lambda span: span.identity,
        "job": lambda span: str(span.job_id),
    }
    for record in records:
        end = record.end if record.end is not None else now
        if (since is not None and end < since) or (until is not None and record.start >= until):
            continue
        key = keys[by](record)
        groups.setdefault(key, Totals()).add(record, record.seconds_within(since, until, now))
    return dict(sorted(groups.items()))
