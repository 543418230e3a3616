"""``<state_dir>/jobs/<job>.env``: the task-prolog's output, prepared by the prolog.

The task-prolog runs before *every* task of a job, as the job's user; reading
the ledger there would cost a Python start per task. The root prolog, which has
just taken the leases, writes the ``export NAME=value`` lines once (variables of
the job environment contract, see ``slurm_tpu.jobenv``), and
``prolog/slurm-tpu-task-prolog`` (a POSIX sh script, no fork) prints them.
"""

from __future__ import annotations

import os

from ..locks import statedir
from ..locks.ledger import JOBS


def render(leases, settings, usage_dir: str | None = None) -> str:
    """The export lines for a job's leases (in allocation order) and its usage box, if any."""
    devices_var, paths_var, gpus_var, usage_var = settings.env_names
    tpus = [lease.identity for lease in leases if lease.kind != "gpu"]
    gpus = [lease.identity for lease in leases if lease.kind == "gpu"]
    paths = [settings.tpu_paths[identity] for identity in tpus]
    lines = [f"export {devices_var}={','.join(tpus)}", f"export {paths_var}={','.join(paths)}",
             f"export {gpus_var}={','.join(gpus)}" if gpus else f"unset {gpus_var}",
             f"export {usage_var}={usage_dir}" if usage_dir else f"unset {usage_var}"]
    return "\n".join(lines) + "\n"


def write(ledger, job_id: int, leases, settings, usage_dir: str | None = None) -> None:
    """Write ``jobs/<job>.env`` atomically (raises OSError/StateDirError, e.g. ENOSPC)."""
    fd = statedir.open_dir(JOBS, create=True, parent_fd=ledger.dir_fd)
    try:
        statedir.write_atomic(fd, f"{job_id}.env", render(leases, settings, usage_dir).encode(), mode=0o644)
    finally:
        os.close(fd)


def remove(ledger, job_id: int) -> None:
    try:
        fd = statedir.open_dir(JOBS, parent_fd=ledger.dir_fd)
    except statedir.StateDirError:
        return
    try:
        statedir.remove(fd, f"{job_id}.env")
    finally:
        os.close(fd)
