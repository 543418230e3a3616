"""Slurm's own records of what ran, and the hooks' lease audit, as plain data.

``jobcomp/filetxt`` writes one ``Key=Value ...`` line per finished job (the local
cluster sets ``JobCompLoc=<base>/log/jobcomp.txt``): which node, start and end (to
the second), state, exit code, array job and task. The prolog and epilog append a
JSON line per lease event to each node's ``audit.log``: which device, which job,
when (to the microsecond); :mod:`slurm_tpu.protocol.audit` reads and pairs them.
Pure parsers; reading files is the callers' business.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from slurm_tpu.protocol import audit

_FIELD = re.compile(r"(\w+)=(\S*)")


@dataclass(frozen=True)
class JobRecord:
    """One finished job (or array task) as jobcomp recorded it."""

    job_id: int
    name: str
    user: str
    state: str
    node: str
    start: float | None  # epoch seconds (whole seconds)
    end: float | None
    exit_code: str  # "code:signal"
    array_job_id: int | None = None
    array_task_id: int | None = None

    @property
    def submitted_as(self) -> int:
        """The id sbatch printed: the array job's for array tasks."""
        return self.array_job_id if self.array_job_id is not None else self.job_id


@dataclass(frozen=True)
class Lease:
    """One device held by one job on one node, from acquire to release."""

    node: str
    identity: str
    job_id: int
    start: float
    end: float | None  # None: still held


def _epoch(value: str) -> float | None:
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:  # "Unknown", "None", empty
        return None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def parse_jobcomp(text: str) -> list[JobRecord]:
    """Every job line of a jobcomp/filetxt file (malformed lines are skipped)."""
    records = []
    for line in text.splitlines():
        fields = dict(_FIELD.findall(line))
        job_id = _int(fields.get("JobId"))
        if job_id is None:
            continue
        array_job = _int(fields.get("ArrayJobId"))
        records.append(
            JobRecord(
                job_id=job_id,
                name=fields.get("Name", ""),
                user=fields.get("UserId", "").split("(")[0],
                state=fields.get("JobState", ""),
                node=fields.get("NodeList", ""),
                start=_epoch(fields.get("StartTime", "")),
                end=_epoch(fields.get("EndTime", "")),
                exit_code=fields.get("ExitCode", ""),
                array_job_id=array_job if array_job else None,  # 0 or absent: not an array task
                array_task_id=_int(fields.get("ArrayTaskId")) if array_job else None,
            )
        )
    return records


def parse_audit(text: str, node: str) -> list[Lease]:
    """Leases from one node's audit log: each acquire paired with the event that ended it."""
    spans = audit.pair_leases(audit.read_events(text.splitlines(), f"{node}'s audit.log")).spans
    return [Lease(node, span.identity, span.job_id, span.start, span.end) for span in spans]


def select(records: Iterable[JobRecord], submitted: Iterable[int]) -> list[JobRecord]:
    """The records of the jobs sbatch returned these ids for (array tasks included)."""
    wanted = set(submitted)
    return [r for r in records if r.submitted_as in wanted]
