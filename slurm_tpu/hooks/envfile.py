"""Writing and removing ``<state_dir>/jobs/<job>.env`` (the format: slurm_tpu/protocol/envfile.py).

The root prolog writes the job's file once it holds the leases; the epilog
removes it. Both go through the checked state directory's descriptor (never a
link), and the write is atomic.
"""

from __future__ import annotations

import os

from ..access import statedir
from ..protocol.envfile import DIR, file_name, render


def write(ledger, job_id: int, leases, settings, usage_dir: str | None = None) -> None:
    """Write ``jobs/<job>.env`` atomically (raises OSError/StateDirError, e.g. ENOSPC)."""
    fd = statedir.open_dir(DIR, create=True, parent_fd=ledger.dir_fd)
    try:
        statedir.write_atomic(fd, file_name(job_id), render(leases, settings, usage_dir).encode(), mode=0o644)
    finally:
        os.close(fd)


def remove(ledger, job_id: int) -> None:
    """Remove the job's file, if any (the epilog; a second run changes nothing)."""
    try:
        fd = statedir.open_dir(DIR, parent_fd=ledger.dir_fd)
    except statedir.StateDirError:
        return
    try:
        statedir.remove(fd, file_name(job_id))
    finally:
        os.close(fd)
