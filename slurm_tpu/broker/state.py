"""The broker's directories under ``<state_dir>/broker/`` (broker_wire), held open by descriptor.

Every directory is opened with O_NOFOLLOW and must be root's and not writable by others
(:mod:`slurm_tpu.access.statedir`); files in them are reached relative to those descriptors,
so a planted symlink is refused, never followed. Sockets are bound through
``/proc/self/fd/<dir>/<name>``: the path resolves through this process's own descriptor of the
directory, whatever was renamed or linked meanwhile (and keeps the path far below the 108
bytes a unix socket address may have).
"""

from __future__ import annotations

import json
import os
import socket

from ..access import statedir
from ..protocol import FormatError, broker_wire as wire

GRANT_LIMIT = 4096  # bytes: a grant file is a line of JSON
STATS_LIMIT = 64 << 10  # bytes: a job's figures file (read back at a restart), as the Epilog reads it


class BrokerState:
    """Open descriptors of the broker's directories (made when missing)."""

    def __init__(self, state_dir: str):
        self.state_dir = state_dir.rstrip("/") or "/"
        top = statedir.open_dir(self.state_dir, create=True)
        try:
            self.root_fd = statedir.open_dir(wire.BROKER_DIR, create=True, parent_fd=top, mode=0o755)
        finally:
            os.close(top)
        self.grants_fd = self._subdir(wire.GRANTS, 0o700)
        self.jobs_fd = self._subdir(wire.ENDPOINTS, 0o755)
        self.stats_fd = self._subdir(wire.STATS, 0o700)

    def _subdir(self, name: str, mode: int) -> int:
        return statedir.open_dir(name, create=True, parent_fd=self.root_fd, mode=mode)

    def close(self) -> None:
        for fd in (self.grants_fd, self.jobs_fd, self.stats_fd, self.root_fd):
            os.close(fd)

    # ---- paths ----

    def bind_path(self, dir_fd: int, name: str) -> str:
        """A path for bind()/unlink of ``name`` in the directory ``dir_fd`` that resolves through the descriptor."""
        return f"/proc/self/fd/{dir_fd}/{statedir.check_name(name)}"

    def control_path(self) -> str:
        return wire.control_path(self.state_dir)

    # ---- grants ----

    def grant_jobs(self) -> list[int]:
        """Job ids of the grant files present (names that are not a job id are ignored)."""
        return sorted(int(name) for name in os.listdir(self.grants_fd) if name.isdigit() and len(name) < 11)

    def read_grant(self, job: int) -> tuple[int, int, int, int]:
        """(job, uid, gid, shares) of grants/<job>: root's regular file, bounded; FormatError otherwise."""
        name = str(int(job))
        source = f"{wire.BROKER_DIR}/{wire.GRANTS}/{name}"
        try:
            raw = statedir.read_file(self.grants_fd, name, limit=GRANT_LIMIT, owner=0)
        except statedir.StateDirError as exc:
            raise FormatError(
                f"{source}: not a root-owned grant file of at most {GRANT_LIMIT} bytes ({exc})", source
            ) from None
        if raw is None:
            raise FormatError(f"no grant for job {name} ({source} does not exist)", source)
        grant = wire.decode_grant(raw, source)
        if grant[0] != int(job):
            raise FormatError(f"{source} grants job {grant[0]}, not {job}", source)
        return grant

    # ---- figures ----

    def write_stats(self, job: int, figures: dict) -> None:
        statedir.write_atomic(
            self.stats_fd, str(int(job)), (json.dumps(figures, sort_keys=True) + "\n").encode(), 0o600
        )

    def read_stats(self, job: int) -> dict:
        """The figures an earlier broker saved for ``job`` ({} when none or unreadable)."""
        try:
            raw = statedir.read_file(self.stats_fd, str(int(job)), limit=STATS_LIMIT)
        except statedir.StateDirError:
            return {}
        if raw is None:
            return {}
        try:
            data = json.loads(raw)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    # ---- sockets ----

    def listen(self, dir_fd: int, name: str, uid: int, gid: int, mode: int, backlog: int = 64) -> socket.socket:
        """A listening unix socket at ``name`` in ``dir_fd``, owned by uid:gid with ``mode`` before it
        appears under its name (bound under a temp name, then renamed over any stale one)."""
        temp = f".{name}.{os.getpid()}.tmp"
        self.unlink(dir_fd, temp)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.bind_path(dir_fd, temp))
            os.chown(temp, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
            # chmod with follow_symlinks=False is unsupported on Linux: the temp name is our own socket
            # in a directory only root writes, so a plain chmod of it is safe.
            os.chmod(temp, mode, dir_fd=dir_fd)
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            listener.listen(backlog)
        except BaseException:
            listener.close()
            self.unlink(dir_fd, temp)
            raise
        return listener

    @staticmethod
    def unlink(dir_fd: int, name: str) -> None:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
