"""Epilog (root, on each node at job end): audit usage, verify, restore idle ownership, drop leases.

Idempotent: a second run, or a run for a job with no lease, changes nothing.
When a process survives holding a device, or a device vanished during the job,
the node is drained with a reason starting ``slurm-tpu:`` (one scontrol call,
only in that case; a device the holder scan could not verify is kept, no drain).
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
    from . import jobusage, leasing, settings as hook_settings

    hook.probe.mark("imports")
    settings = hook.settings = hook_settings.load(hook.environ, hook.node, create=False)
    hook.probe.mark("settings")
    job = hook.job = job_from_env(hook.environ, settings.node, need_uid=False)
    if not os.path.lexists(settings.state_dir):
        return 0  # never leased anything on this node
    with Ledger(settings.state_dir) as ledger:
        ledger.remove_job_env(job.job_id)
        leases = ledger.of_job(job.job_id)
        hook.probe.mark("ledger_read")
        if not leases:
            return 0
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
        # For Slurm's own job record (AdminComment), applied later by the accounting collector. After the
        # lock (it needs none): the spool's disk flush never holds up the node's next Prolog.
        jobusage.spool(
            ledger, job.job_id, leases[0].uid, settings.node, len(leases), records, settings.accounting_spool
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
