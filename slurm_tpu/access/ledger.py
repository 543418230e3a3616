"""The lease ledger: one file per leased device under ``<state_dir>/leases/``, and ``audit.log``.

A lease is taken by creating ``leases/<identity>`` exclusively (a finished temp file
``link()``-ed into place), so two prologs can never both hold a device and a crash leaves a
whole lease or none. Each lease records what the epilog needs, so it never asks Slurm. What
the files hold is :mod:`slurm_tpu.protocol.leases` and :mod:`slurm_tpu.protocol.audit`; this
module owns how they are written (exclusive, atomic, never through a link).

Read-modify-write sequences that span the ledger and device ownership (release vs. a udev
re-enumeration, reclaim vs. a late epilog) run under one ``flock`` on ``<state_dir>/.lock``
(``with ledger.locked():``).
"""

from __future__ import annotations

import os
import time

from ..protocol import FormatError, audit, leases

# The ledger's records and phases, for its callers (HELD, KEPT, RELEASING, REVOKING are re-exported).
from ..protocol.leases import HELD, KEPT, RELEASING, REVOKING, BadLease, Lease  # noqa: F401
from . import statedir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

LEASES = leases.DIR
AUDIT = audit.FILE
LOCK = ".lock"


class Ledger:
    """The open state directory: leases, audit log and the state lock."""

    def __init__(self, state_dir: str, create: bool = True):
        self.state_dir = state_dir
        self.dir_fd = statedir.open_dir(state_dir, create=create)
        try:
            self.leases_fd = statedir.open_dir(LEASES, create=create, parent_fd=self.dir_fd)
        except statedir.StateDirError as exc:
            os.close(self.dir_fd)
            raise statedir.StateDirError(
                str(exc).replace(LEASES, os.path.join(state_dir, LEASES), 1), os.path.join(state_dir, LEASES)
            ) from exc
        self._lock_fd: int | None = None
        self._depth = 0  # nested locked() blocks; 0: not held

    def close(self) -> None:
        for fd in (self.leases_fd, self.dir_fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._lock_fd, self._depth = None, 0

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- locking ---------------------------------------------------------------
    def locked(self, when: bool = True) -> _Block:
        """``with ledger.locked():`` holds the state lock (``flock``, blocking) for the block, the one
        way to take it; nested blocks share it. ``when`` False: a block that leaves the lock as it is."""
        return _Block(self, 1 if when else 0)

    def unlocked(self) -> _Block:
        """``with ledger.unlocked():`` lets the held lock go for the block, however deeply held, and
        takes it back after it (a release's holder scan)."""
        assert self._depth, "unlocked() outside locked()"
        return _Block(self, None)

    @property
    def held(self) -> bool:
        """Whether this ledger holds the state lock (what functions that need it assert)."""
        return self._depth > 0

    def _hold(self, depth: int) -> None:
        """Hold the lock ``depth`` blocks deep: taken when the depth leaves 0, let go when it returns."""
        if bool(depth) != bool(self._depth):
            import fcntl

            if self._lock_fd is None:
                self._lock_fd = os.open(
                    LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.dir_fd
                )
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX if depth else fcntl.LOCK_UN)
        self._depth = depth

    # ---- leases ----------------------------------------------------------------
    def read(self, identity: str) -> Lease | BadLease | None:
        """The lease on ``identity``, a BadLease if unreadable, None if free."""
        try:
            raw = statedir.read_file(self.leases_fd, identity, limit=leases.MAX_BYTES)
            return None if raw is None else Lease.decode(identity, raw)
        except (statedir.StateDirError, FormatError) as exc:
            return BadLease(identity, str(exc))

    def claim(self, lease: Lease) -> bool:
        """Atomically create the lease; False when the device is already leased."""
        return statedir.create_exclusive(self.leases_fd, lease.identity, lease.encode())

    def rewrite(self, lease: Lease) -> None:
        """Replace the lease file (its phase changed) atomically."""
        statedir.write_atomic(self.leases_fd, lease.identity, lease.encode())

    def drop(self, identity: str) -> bool:
        """Remove the lease file on ``identity`` (whoever holds it)."""
        return statedir.remove(self.leases_fd, identity)

    def names(self) -> list[str]:
        """Lease file names (temp files left by a crash are skipped)."""
        return sorted(n for n in os.listdir(self.leases_fd) if not n.startswith("."))

    def all(self) -> Iterator[Lease | BadLease]:
        return (lease for lease in map(self.read, self.names()) if lease is not None)

    def of_job(self, job_id: int) -> list[Lease]:
        """The job's leases on this node, in its allocation order."""
        mine = [lease for lease in self.all() if isinstance(lease, Lease) and lease.job_id == job_id]
        order = mine[0].allocation if mine else ()
        rank = {identity: i for i, identity in enumerate(order)}
        return sorted(mine, key=lambda lease: (rank.get(lease.identity, len(rank)), lease.identity))

    def sweep_temps(self) -> None:
        """Remove temp files of processes that died between write and link."""
        for name in os.listdir(self.leases_fd):
            pid = name.rsplit(".", 2)[-2] if name.startswith(".") and name.endswith(".tmp") else ""
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                statedir.remove(self.leases_fd, name)

    # ---- the job's environment file (its format: protocol/envfile.py) -----------
    def write_job_env(self, job_id: int, text: str) -> None:
        """Write ``jobs/<job>.env`` atomically, readable by the job's task prolog (raises OSError or
        StateDirError)."""
        from ..protocol import envfile  # here, not at the top: the udev hook opens a ledger and never needs it

        fd = statedir.open_dir(envfile.DIR, create=True, parent_fd=self.dir_fd)
        try:
            statedir.write_atomic(fd, envfile.file_name(job_id), text.encode(), mode=0o644)
        finally:
            os.close(fd)

    def remove_job_env(self, job_id: int) -> None:
        """Remove the job's environment file, if any (the epilog; a second run changes nothing)."""
        from ..protocol import envfile

        try:
            fd = statedir.open_dir(envfile.DIR, parent_fd=self.dir_fd)
        except statedir.StateDirError:
            return
        try:
            statedir.remove(fd, envfile.file_name(job_id))
        finally:
            os.close(fd)

    # ---- audit -----------------------------------------------------------------
    def audit(self, event: str, **fields: object) -> None:
        """Append one audit record (never raises: the audit log must not fail a job)."""
        try:
            statedir.append_line(self.dir_fd, AUDIT, audit.encode(event, time.time(), fields))
        except (OSError, statedir.StateDirError):
            pass

    def last_holder(self, identity: str, uid: int | None = None, limit: int = 1 << 20) -> tuple[int, int] | None:
        """(job_id, uid) of the last job (of ``uid``, when given) the audit log shows acquiring ``identity``;
        None if unknown.
        Reads only the log's last ``limit`` bytes (a failure path: naming the job that leaked a device)."""
        try:
            fd = os.open(AUDIT, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)
        except OSError:
            return None
        try:
            size = os.fstat(fd).st_size
            start = max(0, size - limit)
            tail = os.pread(fd, size - start, start)
        except OSError:
            return None
        finally:
            os.close(fd)
        if start:
            tail = tail[tail.find(b"\n") + 1 :]  # the first line is cut
        return audit.last_acquire(tail, identity, uid)


class _Block:
    """A locked() block (``deeper`` 1, or 0) or an unlocked() one (None); not contextlib: an import per hook."""

    __slots__ = ("ledger", "deeper", "outer")

    def __init__(self, ledger: Ledger, deeper: int | None):
        self.ledger, self.deeper, self.outer = ledger, deeper, 0

    def __enter__(self) -> Ledger:
        self.outer = self.ledger._depth
        self.ledger._hold(0 if self.deeper is None else self.outer + self.deeper)
        return self.ledger

    def __exit__(self, *exc: object) -> None:
        self.ledger._hold(self.outer)
