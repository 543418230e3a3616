"""``<state_dir>/jobs/<job>.env``: the task-prolog's output, prepared by the prolog.

The task-prolog runs before *every* task of a job, as the job's user; reading
the ledger there would cost a Python start per task. The root prolog, which has
just taken the leases, writes the ``export NAME=value`` lines once (variables of
the job environment contract, see ``slurm_tpu.protocol.jobenv``), and
``prolog/slurm-tpu-task-prolog`` (a POSIX sh script, no fork) prints them. The
variables and each device's entries come precomputed from the families through
the hooks' snapshot; ``<state_dir>/no-devices.env`` (every variable unset but
``EDGETPU_VISIBLE_DEVICES``, exported empty; written with the snapshot) is what the
task-prolog prints for a job with no device here.
"""

from __future__ import annotations

import os

from ..access import statedir
from ..access.ledger import JOBS
from ..protocol.jobenv import USAGE_DIR


def render(leases, settings, usage_dir: str | None = None) -> str:
    """The export lines for a job's leases (in allocation order) and its usage box, if any.

    Each family variable lists its devices' entries; a device without one is left
    out (the prolog refuses such a device before leasing it).
    """
    lines = []
    for variable in settings.variables:
        entries = [settings.values.get(lease.identity, {}).get(variable.name) for lease in leases
                   if lease.kind == variable.kind]
        entries = [entry for entry in entries if entry is not None]
        if entries or not variable.unset_when_empty:
            lines.append(f"export {variable.name}={','.join(entries)}")
        else:
            lines.append(f"unset {variable.name}")
    lines.append(f"export {USAGE_DIR}={usage_dir}" if usage_dir else f"unset {USAGE_DIR}")
    return "\n".join(lines) + "\n"


def render_unset(settings) -> str:
    """``<state_dir>/no-devices.env``: every variable of the contract unset (a job with no device on this node),
    except a library's view of the devices, which reads unset as "all of them": that one is exported empty."""
    lines = [f"export {v.name}=" if v.never_unset else f"unset {v.name}" for v in settings.variables]
    return "\n".join([*lines, f"unset {USAGE_DIR}"]) + "\n"


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
