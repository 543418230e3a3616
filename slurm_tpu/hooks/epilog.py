"""Epilog (root, on each node at job end): audit usage, verify, restore idle ownership, drop leases.

Idempotent: a second run, or a run for a job with no lease, changes nothing.
When a process survives holding a device, or a device vanished during the job,
the node is drained with a reason starting ``slurm-tpu:`` (one scontrol call,
only in that case; a device the holder scan could not verify is kept, no drain). TPU shares: hooks/shards.py.
"""

from __future__ import annotations

import os

from .context import HookRun, job_from_env, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


def run(hook: HookRun, answer: Callable[[], None] | None = None) -> int:
    """The epilog's work. ``answer``: the node agent's early answer (see below); None in a hook process."""
    from ..access.ledger import Ledger
    from ..protocol.broker_wire import grant_path
    from . import jobusage, leasing, settings as hook_settings

    hook.probe.mark("imports")
    settings = hook.settings = hook_settings.load(hook.environ, hook.node, create=False)
    hook.probe.mark("settings")
    job = hook.job = job_from_env(hook.environ, settings.node, need_uid=False)
    if not os.path.lexists(settings.state_dir):
        return 0  # never leased anything on this node
    problems: list[str] = []
    with Ledger(settings.state_dir) as ledger:
        ledger.remove_job_env(job.job_id)
        leases = ledger.of_job(job.job_id)
        hook.probe.mark("ledger_read")
        # TPU shares: looked for where the node shares devices, or a grant is left from when it did
        # (one stat; hooks/shards.py is imported only then).
        grant = None
        if settings.shards is not None or os.path.lexists(grant_path(settings.state_dir, job.job_id)):
            from . import shards

            grant = shards.read_grant(ledger, job.job_id)
            if grant is None:
                shards.remove_grant(ledger, job.job_id)  # an unreadable one: nothing to account
        if not leases and grant is None:
            return 0
        records: list = []
        if leases:
            # The node agent (``answer``) answers Slurm here and releases after, off the path of the
            # node's next job (docs/architecture.md): safe because the state lock is taken first and
            # held until the release ends, and a release that fails still drains the node below.
            with ledger.locked(when=answer is not None):
                if answer is not None:
                    answer()
                    hook.probe.mark("answered")
                # Usage before the release (outside the lock in a hook process: it reads only the job's own box).
                records = jobusage.collect(ledger, job.job_id, leases[0].uid, [lease.identity for lease in leases])
                jobusage.discard(ledger, job.job_id)
                hook.probe.mark("usage_box")
                problems = leasing.release(ledger, job.job_id, settings, probe=hook.probe)
            hook.probe.mark("release")
        figures = None
        if grant is not None:
            # The broker's figures (root's, never the job's), then the grant goes.
            figures, notice = shards.close_job(ledger, job.job_id)
            hook.probe.mark("broker_close")
            if notice is not None:
                say(f"epilog: {notice}", error=False)
        uid = leases[0].uid if leases else grant[1]  # type: ignore[index]  # grant: not None without leases
        # For Slurm's own job record (AdminComment), applied later by the accounting collector. After the
        # lock (it needs none): the spool's disk flush never holds up the node's next Prolog.
        jobusage.spool(
            ledger,
            job.job_id,
            uid,
            settings.node,
            len(leases),
            records,
            settings.accounting_spool,
            shares=grant[3] if grant is not None else 0,
            shard_figures=figures,
        )
        hook.probe.mark("spool")
    for notice in problems:
        if isinstance(notice, leasing.Withheld):  # the device waits, the node serves on
            say(f"epilog: slurm-tpu: {notice}; the node stays in service")
    problems = [p for p in problems if not isinstance(p, leasing.Withheld)]
    if not problems:
        return 0
    reason = "slurm-tpu: " + "; ".join(problems)
    say(f"epilog: {reason}")
    # Our own reason is more useful than Slurm's generic "Epilog error".
    return 0 if hook.drain(job.node, reason) else 1


def main(environ=None, answer: Callable[[], None] | None = None, probe=None) -> int:
    """Entry point for epilog/slurm-tpu-epilog; the node agent's worker passes ``answer`` (see run).
    ``probe``: see HookRun."""
    hook = HookRun("epilog", os.environ if environ is None else environ, probe)
    return hook.main(run, answer)
