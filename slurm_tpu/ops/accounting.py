"""Accounting: who used which accelerator, how much; from the audit log, or from Slurm's own books.

Three parts (docs/accounting.md tells the whole story):

- **the audit log** (:func:`summarize_audit`): lease spans (:mod:`slurm_tpu.protocol.audit`)
  summed per user, device or job over a period; the only source for ``--by device``.
- **Slurm's accounting** (:func:`sacct_jobs`, :func:`summarize_sacct`): where slurmdbd records
  jobs, a job's accelerator-seconds are each ``gres/<name>`` count of its ``AllocTRES`` times
  its run time within the period, exactly as sreport computes a TRES's usage; its inference
  figures come from its ``AdminComment``.
- **the collector** (:func:`collect`, ``slurm-tpu accounting-collect``): each job's spooled
  figures into its ``AdminComment`` with ``sacctmgr`` (an argument list, no shell). An entry
  whose job has no finished record yet (slurmctld sends the job's end to slurmdbd
  asynchronously), or that Slurm refuses, stays for the next run: nothing here can fail a
  job or drain a node.
"""

from __future__ import annotations

import datetime
import os
import pwd
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..access import statedir
from ..errors import SlurmCommandError
from ..protocol.audit import LeaseSpan
from ..protocol.job_record import SPOOL_DIR, decode_spool, merge, parse_admin_comment

# ---- the audit log ------------------------------------------------------------------------


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
        return {
            "jobs": len(self.jobs),
            "leases": self.leases,
            "lease_seconds": round(self.lease_seconds, 3),
            "inferences": self.inferences,
            "inference_seconds": round(self.inference_seconds, 6),
            "mean_latency_ms": round(self.inference_seconds / self.inferences * 1000, 3) if self.inferences else None,
            "energy_j": None if self.energy_j is None else round(self.energy_j, 3),
        }


def user_name(uid: int) -> str:
    """The user's name from the password database (what slurmd resolves too), else the uid."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def summarize_audit(
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


# ---- Slurm's accounting (sacct) -----------------------------------------------------------

FIELDS = ("JobID", "User", "Start", "End", "AllocTRES", "AdminComment")


def accounting_on(options: dict[str, str]) -> bool:
    """Whether slurm.conf's ``options`` (lower-case keys) record jobs through slurmdbd (Slurm's own accounting)."""
    return "slurmdbd" in options.get("accountingstoragetype", "")


def accounting_enabled(slurm) -> bool:
    """Whether the controller records jobs through slurmdbd (``scontrol show config``)."""
    pairs = (line.partition("=") for line in slurm.run("scontrol", "show", "config").splitlines())
    return accounting_on({key.strip().lower(): value for key, _, value in pairs})


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

    start = stamp(since) if since is not None else "1970-01-01T00:00:00"
    args = ["-a", "-n", "-P", "-X", "--noconvert", "-o", ",".join(FIELDS), "-S", start]
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
        return {
            "source": "sacct",
            "jobs": len(self.jobs),
            "tres_seconds": {k: round(v, 3) for k, v in sorted(self.tres_seconds.items())},
            "inferences": self.inferences,
            "inference_seconds": round(self.inference_seconds, 6),
            "mean_latency_ms": round(self.inference_seconds / self.inferences * 1000, 3) if self.inferences else None,
        }


def summarize_sacct(
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


# ---- the collector: spool -> AdminComment -------------------------------------------------

# sacct states of a job whose end slurmdbd has not recorded yet: its record is not final.
UNFINISHED = ("PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "COMPLETING")


@dataclass
class CollectResult:
    applied: dict[int, str] = field(default_factory=dict)  # job -> the AdminComment written
    waiting: dict[int, str] = field(default_factory=dict)  # job -> why it stays for the next run
    refused: dict[str, str] = field(default_factory=dict)  # spool file -> why it is not an entry (left there)


def open_spool(state_dir: str) -> int:
    """The spool directory's descriptor, made root-only (0700) if missing; StateDirError if unsafe."""
    parent = statedir.open_dir(state_dir, create=True)
    try:
        fd = statedir.open_dir(SPOOL_DIR, create=True, parent_fd=parent)
    finally:
        os.close(parent)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o700)  # the figures are the admin's, not the users'
    except BaseException:
        os.close(fd)
        raise
    return fd


def _job_record(slurm, job_id: int) -> tuple[str, str, str, str] | None:
    """(JobID, State, End, AdminComment) of the job's record in Slurm's accounting; None when it has none.

    ``job_id`` is SLURM_JOB_ID (sacct's JobIDRaw). For an array task, ``-j 15`` means every
    task of array 15, so ``modify job where jobid=15`` would write all of them: the record is
    found by its JobIDRaw and selected by its JobID (``15_3``), which names that one task.
    """
    out = slurm.run("sacct", "-n", "-P", "-X", "-j", str(job_id), "-o", "JobIDRaw,JobID,State,End,AdminComment")
    found = None
    for line in out.splitlines():
        raw, job, state, end, comment = (line.split("|", 4) + [""] * 5)[:5]  # AdminComment last: it may hold '|'
        if raw == str(job_id):
            found = (job, state.split()[0] if state else "", end, comment)  # the last run of a requeued job
    return found


def collect(state_dir: str, slurm) -> CollectResult:
    """Apply every spooled entry under ``state_dir`` through ``slurm`` (a :class:`~slurm_tpu.slurm.commands.Slurm`)."""
    result = CollectResult()
    spool = open_spool(state_dir)
    try:
        for name in sorted(os.listdir(spool)):
            if name.startswith("."):
                continue  # an epilog's temp file, renamed into place when complete
            source = f"{state_dir}/{SPOOL_DIR}/{name}"
            try:
                raw = statedir.read_file(spool, name, limit=4096)
                if raw is None:
                    continue  # removed meanwhile
                entry = decode_spool(raw, source)
                if str(entry.job_id) != name:
                    raise ValueError(f"{source} names job {entry.job_id}")
            except (ValueError, statedir.StateDirError) as exc:
                result.refused[name] = str(exc)
                continue
            try:
                record = _job_record(slurm, entry.job_id)
                if record is None:
                    result.waiting[entry.job_id] = "not in Slurm's accounting yet"
                    continue
                job_ref, state, end, comment = record
                # A job that ended while slurmdbd was away is first recorded with its final
                # state and no end (its start message); the end follows, and would carry
                # the controller's (empty) AdminComment over ours: wait for it.
                if state in UNFINISHED or end in ("", "Unknown", "None"):
                    result.waiting[entry.job_id] = f"its end is not recorded yet ({state}, end {end or '?'})"
                    continue
                merged = merge(comment, entry)
                slurm.run(
                    "sacctmgr", "-i", "modify", "job", "where", f"jobid={job_ref}", "set", f"AdminComment={merged}"
                )
            except SlurmCommandError as exc:
                result.waiting[entry.job_id] = str(exc).splitlines()[0] if str(exc) else "Slurm refused"
                continue
            statedir.remove(spool, name)
            result.applied[entry.job_id] = merged
    finally:
        os.close(spool)
    return result
