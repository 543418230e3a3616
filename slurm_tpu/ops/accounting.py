"""Accounting: who used which accelerator, how much; from the audit log, or from Slurm's own books.

Three parts (docs/accounting.md tells the whole story):

- **the audit log** (:func:`summarize_audit`): lease spans (:mod:`slurm_tpu.protocol.audit`)
  and the Epilog's per-device ``energy`` events (:func:`energy_figures`) summed per user, device
  or job over a period; the only source for ``--by device``.
- **Slurm's accounting** (:func:`sacct_jobs`, :func:`summarize_sacct`): where slurmdbd records
  jobs, a job's accelerator-seconds are each ``gres/<name>`` count of its ``AllocTRES`` times
  its run time within the period, exactly as sreport computes a TRES's usage; its inference
  and energy figures come from its ``AdminComment``.

Energy is never a bare number: every figure carries its method (protocol/energy.py METHODS), and a
group's figure carries every method that went into it (``measured+estimated``; ``unavailable``
among them when some device's figure is missing, so the sum covers the others only).
- **the collector** (:func:`collect`, ``slurm-tpu accounting-collect``): each job's spooled
  figures into its ``AdminComment`` with ``sacctmgr`` (an argument list, no shell), by a
  protocol under which the collectors of a multi-node job's nodes never lose each other's
  items (below). An entry whose job has no finished record yet (slurmctld sends the job's end
  to slurmdbd asynchronously), or that Slurm refuses, stays for the next run: nothing here can
  fail a job or drain a node.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import pwd
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..access import statedir
from ..defaults import ACCOUNTING_WINDOW_S
from ..errors import SlurmCommandError
from ..hooks.jobusage import open_spool
from ..protocol import audit
from ..protocol.audit import LeaseSpan
from ..protocol.energy import MAX_JOULES, METHODS, UNAVAILABLE, join_methods
from ..protocol.job_record import (
    MAX_SPOOL_BYTES,
    SHARES,
    SpoolEntry,
    admin_energy,
    decode_spool,
    encode_spool,
    has_item,
    merge,
    parse_admin_comment,
)

# ---- energy: every figure with its method ------------------------------------------------

JOULES_PER_KWH = 3.6e6


def plausible_joules(value: object) -> bool:
    """A finite, non-negative figure no device could exceed (protocol/energy.py MAX_JOULES)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= MAX_JOULES


@dataclass
class Energy:
    """A group's accelerator energy: the joules of its figures that have them, and every method that
    made it (one ``unavailable`` figure makes the method say so); ``notes``: why figures are unavailable."""

    joules: float | None = None
    methods: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    def add(self, joules: float | None, method: str, note: str = "") -> None:
        self.methods.update(method.split("+"))
        if joules is not None:
            self.joules = (self.joules or 0.0) + joules
        if method == UNAVAILABLE and note and note not in self.notes:
            self.notes.append(note)

    @property
    def method(self) -> str:
        return join_methods(self.methods)

    def to_json(self) -> dict:
        return {
            "energy_j": None if self.joules is None else round(self.joules, 3),
            "energy_kwh": None if self.joules is None else round(self.joules / JOULES_PER_KWH, 9),
            "energy_method": self.method or None,
            "energy_notes": list(self.notes),
        }

    def cells(self) -> list[str]:
        """ENERGY, KWH and METHOD cells of the report's table ('-' where there is no figure)."""
        if self.joules is None:
            return ["-", "-", self.method or "-"]
        return [f"{self.joules:.1f} J", f"{self.joules / JOULES_PER_KWH:.6f}", self.method]


@dataclass(frozen=True)
class DeviceFigure:
    """One job's energy on one device, as the Epilog's ``energy`` audit event says (protocol/audit.py ENERGY)."""

    identity: str
    job_id: int
    uid: int
    end: float  # when the Epilog wrote it: the job's end
    joules: float | None  # None: unavailable (``note`` says why)
    method: str
    seconds: float
    note: str = ""

    @property
    def start(self) -> float:
        return self.end - self.seconds


def energy_figures(events: Iterable[dict]) -> list[DeviceFigure]:
    """The ``energy`` events among ``events`` (:func:`slurm_tpu.protocol.audit.read_events`), one figure per
    device and run of a job: a requeued job id's runs each count (the Epilog takes a run's start file, so
    it writes one event per device and run; the same line read twice counts once). An event that is not
    a figure with its method is skipped: an unknown method, joules with ``unavailable`` or none without
    it, joules or seconds out of range."""
    found: dict[tuple[str, int, float], DeviceFigure] = {}
    for event in events:
        if event.get(audit.EVENT) != audit.ENERGY:
            continue
        identity, job_id, uid = event.get(audit.IDENTITY), event.get(audit.JOB_ID), event.get(audit.UID, -1)
        joules, method, seconds, note = (event.get(k) for k in ("joules", "method", "seconds", "note"))
        if not isinstance(identity, str) or not isinstance(job_id, int) or not isinstance(method, str):
            continue  # read_events has checked that job_id and uid, when present, are integers
        if method not in METHODS or (joules is None) != (method == UNAVAILABLE):
            continue
        if joules is not None and not plausible_joules(joules):
            continue
        if not plausible_joules(seconds):
            continue
        figure = DeviceFigure(
            identity,
            job_id,
            uid if isinstance(uid, int) else -1,
            float(event[audit.T]),
            None if joules is None else float(joules),
            method,
            float(seconds),  # type: ignore[arg-type]
            note if isinstance(note, str) else "",
        )
        found[(identity, job_id, figure.end)] = figure
    return sorted(found.values(), key=lambda f: (f.end, f.identity))


# ---- the audit log ------------------------------------------------------------------------


@dataclass
class Totals:
    """Sums over a group of lease records."""

    jobs: set[int] = field(default_factory=set)
    leases: int = 0
    lease_seconds: float = 0.0
    inferences: int = 0
    inference_seconds: float = 0.0
    # Root's figures (the Epilog's energy events); a job's own usage figure for energy is not counted.
    energy: Energy = field(default_factory=Energy)

    def add(self, record: LeaseSpan, seconds: float) -> None:
        self.jobs.add(record.job_id)
        self.leases += 1
        self.lease_seconds += seconds
        self.inferences += record.inferences
        self.inference_seconds += record.inference_seconds

    def to_json(self) -> dict:
        return {
            "jobs": len(self.jobs),
            "leases": self.leases,
            "lease_seconds": round(self.lease_seconds, 3),
            "inferences": self.inferences,
            "inference_seconds": round(self.inference_seconds, 6),
            "mean_latency_ms": round(self.inference_seconds / self.inferences * 1000, 3) if self.inferences else None,
            **self.energy.to_json(),
        }


def user_name(uid: int) -> str:
    """The user's name from the password database (what slurmd resolves too), else the uid."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _overlaps(start: float, end: float, since: float | None, until: float | None) -> bool:
    return not ((since is not None and end < since) or (until is not None and start >= until))


def summarize_audit(
    records: Iterable[LeaseSpan],
    by: str,
    since: float | None,
    until: float | None,
    now: float,
    user_name=str,
    energy: Iterable[DeviceFigure] = (),
) -> dict[str, Totals]:
    """Totals per user, device or job for leases overlapping [since, until), with the energy figures
    (:func:`energy_figures`) of the jobs that ran in it: a job's whole figure, not a part of it (a
    figure is one number per job and device; the period only selects the jobs). A job that held a
    device without a lease (TPU shares) appears through its energy figure alone."""
    groups: dict[str, Totals] = {}
    keys: dict[str, Callable[[LeaseSpan | DeviceFigure], str]] = {
        "user": lambda item: user_name(item.uid),
        "device": lambda item: item.identity,
        "job": lambda item: str(item.job_id),
    }
    for record in records:
        if not _overlaps(record.start, record.end if record.end is not None else now, since, until):
            continue
        key = keys[by](record)
        groups.setdefault(key, Totals()).add(record, record.seconds_within(since, until, now))
    for figure in energy:
        if not _overlaps(figure.start, figure.end, since, until):
            continue
        totals = groups.setdefault(keys[by](figure), Totals())
        totals.jobs.add(figure.job_id)
        totals.energy.add(figure.joules, figure.method, figure.note)
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
    energy: dict[str, tuple[float | None, str]] = field(default_factory=dict)  # node -> job_record.admin_energy's


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
        usage, energy = parse_admin_comment(comment), admin_energy(comment)
        rows.append(JobRow(job_id, user, _time(start), _time(end), tres, usage, energy))
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
class ShardTotals:
    """The TPU broker's figures of jobs that held shares (protocol/job_record.py SHARD_KEYS), summed."""

    jobs: set[str] = field(default_factory=set)
    busy_ms: float = 0.0
    inferences: int = 0
    model_swaps: int = 0
    queue_wait_ms: float = 0.0
    model_loads: int = 0

    def add(self, job_id: str, figures: dict[str, float]) -> None:
        self.jobs.add(job_id)
        self.busy_ms += figures.get("shard_busy_ms", 0.0)
        self.inferences += int(figures.get("shard_inferences", 0))
        self.model_swaps += int(figures.get("shard_model_swaps", 0))
        self.queue_wait_ms += figures.get("shard_queue_wait_ms", 0.0)
        self.model_loads += int(figures.get("shard_model_loads", 0))

    def to_json(self) -> dict:
        return {
            "jobs": len(self.jobs),
            "device_seconds": round(self.busy_ms / 1000, 6),
            "inferences": self.inferences,
            "model_swaps": self.model_swaps,
            "queue_wait_seconds": round(self.queue_wait_ms / 1000, 6),
            "model_loads": self.model_loads,
        }


@dataclass
class SacctTotals:
    jobs: set[str] = field(default_factory=set)
    tres_seconds: dict[str, float] = field(default_factory=dict)
    inferences: int = 0
    inference_seconds: float = 0.0
    shards: ShardTotals | None = None  # jobs of the group that held TPU shares (their AdminComment says)
    energy: Energy = field(default_factory=Energy)  # the nodes' figures in the AdminComment, with their methods

    def to_json(self) -> dict:
        data = {
            "source": "sacct",
            "jobs": len(self.jobs),
            "tres_seconds": {k: round(v, 3) for k, v in sorted(self.tres_seconds.items())},
            "inferences": self.inferences,
            "inference_seconds": round(self.inference_seconds, 6),
            "mean_latency_ms": round(self.inference_seconds / self.inferences * 1000, 3) if self.inferences else None,
            **self.energy.to_json(),
        }
        if self.shards is not None:
            data["shards"] = self.shards.to_json()
        return data


def summarize_sacct(
    rows: Iterable[JobRow], by: str, tres: Iterable[str], since: float | None, until: float | None, now: float
) -> dict[str, SacctTotals]:
    """Totals per user or job over [since, until): ``tres`` (``gres/tpu``...) seconds and inference figures,
    for jobs that held TPU shares the broker's figures (device time, inferences, swaps, queue wait), and
    the energy of the jobs' accelerators with its methods (each job's whole figure, as in :func:`summarize_audit`)."""
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
            if SHARES in figures:  # an item written before shards existed has none
                if totals.shards is None:
                    totals.shards = ShardTotals()
                totals.shards.add(row.job_id, figures)
        for joules, method in row.energy.values():
            totals.energy.add(joules, method)
    return dict(sorted(groups.items()))


# ---- the collector: spool -> AdminComment -------------------------------------------------
#
# Every node of a multi-node job spools its own entry, and each node's collector writes the
# job's whole AdminComment (sacct reads it, sacctmgr replaces it: Slurm has no compare-and-set),
# so two collectors can interleave: A reads, B reads, A writes, B writes, and B's write, made
# from a read without A's item, erases it. No lock spans the nodes; instead:
#
# 1. Bounded window. A collector writes only while at most ``window`` (W) seconds have passed since
#    it started the read the write is made from: the read gets W/2 (else it is abandoned), and
#    sacctmgr the rest (its timeout). A read that returned too late is made again.
# 2. Written, then confirmed. After writing its item (or finding it there), a collector keeps
#    the entry, marked with the time (after the write returned). A later run, at least W after
#    that mark, reads again: the item still there is final, and the entry is removed; the item
#    missing is written again (and marked again).
#
# Why an item found at least W after its write is final: a write that erases it must come from a
# read that did not see it, so a read started before the item took effect (before the mark), and
# take effect after the check (until the check nothing erased it), more than W after that read
# started, which step 1 rules out. Every erasure is therefore seen by the check that follows it, and
# repaired by its node's next run; each repair is a new write of the same item, so the entries of
# all nodes converge once their writes stop overlapping (each run of a collector reads afresh).
# What this assumes: a write takes effect before sacctmgr returns or is killed at its timeout (a
# slurmdbd that applied a request received long before would break step 1), and the clocks measure
# time at the same rate on every node (not that they agree: each node only measures its own intervals).

# sacct states of a job whose end slurmdbd has not recorded yet: its record is not final.
UNFINISHED = ("PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "COMPLETING")
WINDOW_S = ACCOUNTING_WINDOW_S  # default W: the same on every node (a run checks its own writes W after them)
READS = 3  # reads of one entry per run, when the window runs out, before it waits for the next run


class Clock:
    """The collector's time. :meth:`now`: seconds that never go back (CLOCK_BOOTTIME, which counts
    a suspend too), for a window within one run; :meth:`mark`: the spool's text for now, from which
    :meth:`since` measures in a later run, across a reboot too (then by the wall clock, the only
    one that spans it). Tests drive a subclass by hand."""

    def __init__(self) -> None:
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
                self.boot = handle.read().strip()
        except OSError:
            self.boot = ""  # then every mark is measured by the wall clock

    def now(self) -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME)

    def wall(self) -> float:
        return time.time()

    def mark(self) -> str:
        return f"{self.boot or '-'} {self.now():.3f} {self.wall():.3f}"

    def since(self, mark: str) -> float | None:
        """Seconds since ``mark`` (None: not a mark)."""
        try:
            boot, uptime, wall = mark.split()
            then, then_wall = float(uptime), float(wall)
        except ValueError:
            return None
        if self.boot and boot == self.boot:
            return self.now() - then
        return self.wall() - then_wall


@dataclass
class CollectResult:
    applied: dict[int, str] = field(default_factory=dict)  # job -> the AdminComment written (checked later)
    confirmed: dict[int, str] = field(default_factory=dict)  # job -> the AdminComment its item is final in
    waiting: dict[int, str] = field(default_factory=dict)  # job -> why it stays for the next run
    refused: dict[str, str] = field(default_factory=dict)  # spool file -> why it is not an entry (left there)
    busy: bool = False  # another collector holds this spool: nothing done


def _job_record(slurm, job_id: int, timeout: float | None = None) -> tuple[str, str, str, str] | None:
    """(JobID, State, End, AdminComment) of the job's record in Slurm's accounting; None when it has none.

    ``job_id`` is SLURM_JOB_ID (sacct's JobIDRaw). For an array task, ``-j 15`` means every
    task of array 15, so ``modify job where jobid=15`` would write all of them: the record is
    found by its JobIDRaw and selected by its JobID (``15_3``), which names that one task.
    """
    out = slurm.run(
        "sacct", "-n", "-P", "-X", "-j", str(job_id), "-o", "JobIDRaw,JobID,State,End,AdminComment", timeout=timeout
    )
    found = None
    for line in out.splitlines():
        raw, job, state, end, comment = (line.split("|", 4) + [""] * 5)[:5]  # AdminComment last: it may hold '|'
        if raw == str(job_id):
            found = (job, state.split()[0] if state else "", end, comment)  # the last run of a requeued job
    return found


@dataclass(frozen=True)
class Read:
    """One collector's read of a job's record, and when it started (:meth:`Clock.now`)."""

    entry: SpoolEntry
    job_ref: str  # what sacctmgr selects the job by
    comment: str
    started: float


def read_record(slurm, entry: SpoolEntry, clock: Clock, window: float = WINDOW_S) -> Read | str:
    """The job's record as a :class:`Read`, or why the entry waits (no finished record yet);
    SlurmCommandError when sacct fails or takes more than half the window."""
    started = clock.now()
    record = _job_record(slurm, entry.job_id, timeout=window / 2)
    if record is None:
        return "not in Slurm's accounting yet"
    job_ref, state, end, comment = record
    # A job that ended while slurmdbd was away is first recorded with its final state and no
    # end (its start message); the end follows, and would carry the controller's (empty)
    # AdminComment over ours: wait for it.
    if state in UNFINISHED or end in ("", "Unknown", "None"):
        return f"its end is not recorded yet ({state}, end {end or '?'})"
    return Read(entry, job_ref, comment, started)


def write_item(slurm, read: Read, clock: Clock, window: float = WINDOW_S) -> str | None:
    """Write the AdminComment ``read`` saw with the entry's item in it, if that can take effect within
    ``window`` of the read's start: the mark of the write (taken after it returned), or None when
    the window is spent (read again). SlurmCommandError when sacctmgr fails or runs past the window."""
    left = window - (clock.now() - read.started)
    if left < window / 2:
        return None
    merged = merge(read.comment, read.entry)
    where = f"jobid={read.job_ref}"
    slurm.run("sacctmgr", "-i", "modify", "job", "where", where, "set", f"AdminComment={merged}", timeout=left)
    return clock.mark()


def mark_written(spool_fd: int, name: str, raw: bytes, entry: SpoolEntry, mark: str) -> bool:
    """Record in the spool that the entry's item was written at ``mark``, unless the file is no longer
    ``raw`` (an epilog's new entry for the job, or another run's mark); whether it was recorded."""
    if statedir.read_file(spool_fd, name, limit=MAX_SPOOL_BYTES) != raw:
        return False
    written = SpoolEntry(
        entry.job_id,
        entry.node,
        entry.devices,
        entry.inferences,
        entry.inference_seconds,
        entry.energy_j,
        mark,
        entry.shards,
        entry.energy_method,
    )
    statedir.write_atomic(spool_fd, name, encode_spool(written), 0o600)
    return True


def _settle(spool_fd: int, name: str, raw: bytes, entry: SpoolEntry, slurm, window: float, clock: Clock, result):
    """One entry's step of the protocol (above): wait, write, mark or remove it."""
    job = entry.job_id
    age = clock.since(entry.written) if entry.written else None
    if age is not None and age < window:
        result.waiting[job] = f"written {age:.0f} s ago; checked once {window:g} s have passed"
        return
    for _ in range(READS):
        got = read_record(slurm, entry, clock, window)
        if isinstance(got, str):
            result.waiting[job] = got
            return
        if has_item(got.comment, entry):
            if age is not None:  # still there W after the write: final
                statedir.remove(spool_fd, name)
                result.confirmed[job] = got.comment
            else:  # there, but not marked (a run that stopped after its write): from now on
                mark_written(spool_fd, name, raw, entry, clock.mark())
                result.waiting[job] = f"its item is there; checked once {window:g} s have passed"
            return
        mark = write_item(slurm, got, clock, window)
        if mark is not None:
            mark_written(spool_fd, name, raw, entry, mark)
            result.applied[job] = merge(got.comment, entry)
            return
    result.waiting[job] = f"Slurm's accounting answered slower than the window ({window:g} s)"


def _adopt(legacy: str, spool_fd: int, result: CollectResult) -> None:
    """Move the entries of an older slurm-tpu's spool (``<state_dir>/accounting-spool``, on /run) into
    ``spool_fd`` (an entry already there wins). The directory stays: an epilog of the older code
    (an agent not yet restarted) still spools there, and /run is gone at the next boot anyway."""
    if not os.path.lexists(legacy):
        return
    try:
        old = open_spool(legacy)
    except statedir.StateDirError as exc:
        result.refused[legacy] = str(exc)
        return
    try:
        for name in sorted(os.listdir(old)):
            if name.startswith("."):
                continue
            try:
                raw = statedir.read_file(old, name, limit=MAX_SPOOL_BYTES)
                if raw is None:
                    continue
                decode_spool(raw, f"{legacy}/{name}")
                if statedir.read_file(spool_fd, name, limit=MAX_SPOOL_BYTES) is None:
                    statedir.write_atomic(spool_fd, name, raw, 0o600)
            except (ValueError, OSError, statedir.StateDirError) as exc:  # OSError: a full disk, the entry stays
                result.refused[f"{legacy}/{name}"] = getattr(exc, "strerror", None) or str(exc)
                continue
            statedir.remove(old, name)
    finally:
        os.close(old)


def collect(
    spool: str,
    slurm,
    window: float = WINDOW_S,
    clock: Clock | None = None,
    legacy: str | None = None,
) -> CollectResult:
    """Apply every entry of the spool ``spool`` (config ``accounting_spool``) through ``slurm`` (a
    :class:`~slurm_tpu.slurm.commands.Slurm`), by the protocol above with window ``window``; first
    adopt the entries of ``legacy``, an older slurm-tpu's spool, if there is one. One collector per
    spool at a time: another one's run leaves this one ``busy``."""
    result = CollectResult()
    clock = clock or Clock()
    spool_fd = open_spool(spool, create=True)
    try:
        try:
            fcntl.flock(spool_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            result.busy = True
            return result
        if legacy and os.path.normpath(legacy) != os.path.normpath(spool):
            _adopt(legacy, spool_fd, result)
        for name in sorted(os.listdir(spool_fd)):
            if name.startswith("."):
                continue  # an epilog's temp file, renamed into place when complete
            source = f"{spool}/{name}"
            try:
                raw = statedir.read_file(spool_fd, name, limit=MAX_SPOOL_BYTES)
                if raw is None:
                    continue  # removed meanwhile
                entry = decode_spool(raw, source)
                if str(entry.job_id) != name:
                    raise ValueError(f"{source} names job {entry.job_id}")
            except (ValueError, statedir.StateDirError) as exc:
                result.refused[name] = str(exc)
                continue
            try:
                _settle(spool_fd, name, raw, entry, slurm, window, clock, result)
            except SlurmCommandError as exc:
                result.waiting[entry.job_id] = str(exc).splitlines()[0] if str(exc) else "Slurm refused"
            except (OSError, statedir.StateDirError) as exc:  # the spool itself (a full disk): the entry stays
                result.waiting[entry.job_id] = f"{source}: {getattr(exc, 'strerror', None) or exc}"
    finally:
        os.close(spool_fd)
    return result
