"""The accounting collector: each job's spooled figures into its ``AdminComment`` in Slurm's database.

Runs as root on each node (``slurm-tpu accounting-collect``, once or ``--every``
seconds as a service). The epilog spools one entry per job that leased devices
here (:mod:`slurm_tpu.protocol.job_record` says why there and in that form); the
collector applies each with ``sacctmgr -i modify job where jobid=N set
AdminComment=...`` (an argument list, no shell), merging the node's item into what
the field already holds, and removes the entry only once Slurm took it. An entry
whose job has no finished record yet (slurmctld sends the job's end to slurmdbd
asynchronously), or that Slurm refuses (slurmdbd down), stays for the next run:
nothing here can fail a job or drain a node.

The spool directory is made by the first run (root, 0700): its existence is what
tells the epilog that a collector runs on this node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..access import statedir
from ..errors import SlurmCommandError
from ..protocol.job_record import SPOOL_DIR, decode_spool, merge

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

    ``job_id`` is the job's own id (SLURM_JOB_ID, sacct's JobIDRaw). For an array task
    that is not the id Slurm's tools select it by: ``-j 15`` means every task of array
    15 (whose last task has raw id 15), so ``modify job where jobid=15`` would write all
    of them. The record is the one whose JobIDRaw is the job's id, and it is selected by
    its JobID (``15_3``), which names that one task.
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
