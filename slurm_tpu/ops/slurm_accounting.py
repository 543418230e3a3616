"""`slurm-tpu report` from Slurm's own accounting (sacct), where the cluster has it.

Where slurmctld records jobs through slurmdbd, Slurm's books are the ones admins
already trust and reconcile (sacct, sreport, QOS limits, fair-share): the report
reads them, so its accelerator-seconds are exactly sreport's, and takes the
inference figures from each job's ``AdminComment`` (put there by the accounting
collector, :mod:`slurm_tpu.ops.job_records`). The audit log stays the security
log, and the source for ``--by device`` (Slurm does not know which device a job had).

Accelerator-seconds of a job: for each family's GRES name ``gres/<name>`` in its
``AllocTRES``, count x its run time within the period, as sreport computes a
TRES's usage (``sreport -t seconds -T gres/tpu cluster UserUtilizationByAccount``).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..protocol.job_record import parse_admin_comment

FIELDS = ("JobID", "User", "Start", "End", "AllocTRES", "AdminComment")


def accounting_enabled(slurm) -> bool:
    """Whether the controller records jobs through slurmdbd (``scontrol show config``)."""
    for line in slurm.run("scontrol", "show", "config").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageType":
            return "slurmdbd" in value
    return False


@dataclass(frozen=True)
class JobRow:
    job_id: str
    user: str
    start: float | None
    end: float | None
    tres: dict[str, int]
    usage: dict[str, dict[str, float]]  # node -> figures, from the AdminComment


def _time(value: str) -> float | None:
    if not value or value in ("Unknown", "None"):
        return None
    try:
        return datetime.datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def parse_sacct(text: str) -> list[JobRow]:
    """Rows of ``sacct -n -P -X -o JobID,User,Start,End,AllocTRES,AdminComment``.

    AdminComment comes last: it may hold '|'."""
    rows = []
    for line in text.splitlines():
        parts = line.split("|", len(FIELDS) - 1)
        if len(parts) != len(FIELDS):
            continue
        job_id, user, start, end, alloc, comment = parts
        tres: dict[str, int] = {}
        for item in filter(None, alloc.split(",")):
            key, _, value = item.partition("=")
            if value.isdigit():
                tres[key] = int(value)
        rows.append(JobRow(job_id, user, _time(start), _time(end), tres, parse_admin_comment(comment)))
    return rows


def sacct_jobs(slurm, since: float | None, until: float | None) -> list[JobRow]:
    """Every user's jobs that ran in [since, until) (allocations only, no steps)."""

    def stamp(value: float) -> str:
        return datetime.datetime.fromtimestamp(value).strftime("%Y-%m-%dT%H:%M:%S")

    args = [
        "-a",
        "-n",
        "-P",
        "-X",
        "--noconvert",
        "-o",
        ",".join(FIELDS),
        "-S",
        stamp(since) if since is not None else "1970-01-01T00:00:00",
    ]
    if until is not None:
        args += ["-E", stamp(until)]
    return parse_sacct(slurm.run("sacct", *args, timeout=120))


@dataclass
class SacctTotals:
    jobs: set[str] = field(default_factory=set)
    tres_seconds: dict[str, float] = field(default_factory=dict)
    inferences: int = 0
    inference_seconds: float = 0.0

    def to_json(self) -> dict:
        mean = self.inference_seconds / self.inferences * 1000 if self.inferences else None
        return {
            "source": "sacct",
            "jobs": len(self.jobs),
            "tres_seconds": {k: round(v, 3) for k, v in sorted(self.tres_seconds.items())},
            "inferences": self.inferences,
            "inference_seconds": round(self.inference_seconds, 6),
            "mean_latency_ms": None if mean is None else round(mean, 3),
        }


def summarize(
    rows: Iterable[JobRow], by: str, tres: Iterable[str], since: float | None, until: float | None, now: float
) -> dict[str, SacctTotals]:
    """Totals per user or job over [since, until): ``tres`` (``gres/tpu``...) seconds and inference figures."""
    names = list(tres)
    groups: dict[str, SacctTotals] = {}
    for row in rows:
        if row.start is None:
            continue  # never ran
        start = max(row.start, since) if since is not None else row.start
        end = row.end if row.end is not None else now
        if until is not None:
            end = min(end, until)
        seconds = max(0.0, end - start)
        used = {name: row.tres[name] * seconds for name in names if row.tres.get(name)}
        if not used and not row.usage:
            continue  # no accelerator
        totals = groups.setdefault(row.user if by == "user" else row.job_id, SacctTotals())
        totals.jobs.add(row.job_id)
        for name, value in used.items():
            totals.tres_seconds[name] = totals.tres_seconds.get(name, 0.0) + value
        for figures in row.usage.values():
            totals.inferences += int(figures["inferences"])
            totals.inference_seconds += float(figures["inference_seconds"])
    return dict(sorted(groups.items()))
