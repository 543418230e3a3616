"""Who is at the other end of a unix socket, and whether it may use a job's endpoint.

The kernel says the peer's pid, uid and gid at connect time (``SO_PEERCRED``): nothing the
peer writes is believed. A job endpoint admits a peer whose uid is the grant's AND whose
process belongs to the job (:func:`slurm_tpu.access.processes.pid_in_job`: the job's cgroup,
else a parent chain reaching the job's slurmstepd). The file mode (0600, the job's user)
already keeps every other uid out; the process check keeps out the same user's processes of
other jobs or of no job (a login shell).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable

from ..access.processes import pid_in_job

_UCRED = struct.Struct("3i")


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the peer, as the kernel recorded them at connect."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


def job_peer_refusal(
    sock: socket.socket, job: int, uid: int, in_job: Callable[[int, int], bool] = pid_in_job
) -> str | None:
    """None when the peer may use job ``job``'s endpoint; else the one line it is told."""
    pid, peer_uid, _ = peer_credentials(sock)
    if peer_uid != uid:
        return f"this endpoint belongs to job {job}, whose user is not uid {peer_uid}"
    if pid <= 0 or not in_job(pid, job):
        return (
            f"this endpoint belongs to job {job} and process {pid} is not one of its tasks: "
            "use the endpoint from inside that job (srun/sbatch), not from another job or a login shell"
        )
    return None
