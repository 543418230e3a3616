"""The lease ledger: one file per leased device under ``<state_dir>/leases/``.

A lease is taken by creating ``leases/<identity>`` exclusively (a finished temp
file ``link()``-ed into place), so two prologs can never both hold a device and
a crash leaves a whole lease or none. Each lease records the job, its user, the
device nodes it was given and the job's whole allocation on this node, so the
epilog never needs to ask Slurm (the task-prolog reads ``jobs/<job>.env``, which
the prolog writes from the same leases). ``audit.log`` gets one JSON
line per acquire/release/reclaim/reenumerate, for the stress test and for
accounting.

Read-modify-write sequences that span the ledger and device ownership (release
vs. a udev re-enumeration, reclaim vs. a late epilog) run under one ``flock`` on
``<state_dir>/.lock``; they take milliseconds.
"""

from __future__ import annotations

import os
import time

from . import statedir

# Annotations only: importing typing costs the hooks milliseconds per job.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterator

LEASES = "leases"
AUDIT = "audit.log"
LOCK = ".lock"
JOBS = "jobs"  # <job>.env: the task-prolog's export lines, written by the prolog
VERSION = 1
HELD, REVOKING, KEPT = "held", "revoking", "kept"  # Lease.phase
_INT_FIELDS = ("job_id", "uid", "prolog_pid", "prolog_start", "version")
_LIST_FIELDS = ("device_nodes", "allocation")


def json_line(record: dict) -> str:
    """One JSON object on one line, for str/int/float/bool/None/list values.

    Hand-rolled so hooks need not import ``json`` (which drags in ``re``) per job.
    """
    def value(item: object) -> str:
        if item is None or isinstance(item, bool):
            return {None: "null", True: "true", False: "false"}[item]
        if isinstance(item, (int, float)):
            return repr(item)
        if isinstance(item, (list, tuple)):
            return "[" + ", ".join(value(i) for i in item) + "]"
        text = str(item)
        out = ['"']
        for char in text:
            if char in '"\\':
                out.append("\\" + char)
            elif ord(char) < 0x20:
                out.append(f"\\u{ord(char):04x}")
            else:
                out.append(char)
        out.append('"')
        return "".join(out)

    return "{" + ", ".join(f"{value(k)}: {value(v)}" for k, v in sorted(record.items())) + "}"


class Lease:
    """One device held by one job on this node.

    Stored as ``key<TAB>value`` lines (lists comma-separated; identities and
    inventory paths never hold commas, tabs or newlines).
    """

    __slots__ = ("identity", "job_id", "uid", "kind", "user", "start", "device_nodes", "allocation", "node",
                 "prolog_pid", "prolog_start", "version", "phase", "phase_since")

    def __init__(self, identity: str, job_id: int, uid: int, kind: str = "edgetpu", user: str = "",
                 start: float = 0.0, device_nodes: tuple[str, ...] = (), allocation: tuple[str, ...] = (),
                 node: str = "", prolog_pid: int = 0, prolog_start: int = 0, version: int = VERSION,
                 phase: str = HELD, phase_since: float = 0.0):
        self.identity, self.job_id, self.uid, self.kind, self.user = identity, job_id, uid, kind, user
        self.start, self.device_nodes, self.allocation, self.node = start, tuple(device_nodes), tuple(allocation), node
        # prolog_start: /proc/<pid>/stat start time, to tell a reused pid apart.
        self.prolog_pid, self.prolog_start, self.version = prolog_pid, prolog_start, version
        # HELD while the job may use it; REVOKING from the moment its end began a USB
        # disconnect until udev reports the re-enumerated device; KEPT when its end
        # found a problem (a holder, a scan that could not finish) and kept it.
        self.phase, self.phase_since = phase, phase_since

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Lease) and self.as_dict() == other.as_dict()

    def __repr__(self) -> str:
        return f"Lease({self.identity!r}, job {self.job_id}, uid {self.uid})"

    def to_bytes(self) -> bytes:
        lines = []
        for name in self.__slots__:
            item = getattr(self, name)
            text = ",".join(item) if name in _LIST_FIELDS else str(item)
            if "\n" in text or "\t" in text:
                raise ValueError(f"lease field {name} holds a tab or newline")
            lines.append(f"{name}\t{text}")
        return ("\n".join(lines) + "\n").encode()

    @classmethod
    def from_bytes(cls, identity: str, raw: bytes) -> "Lease":
        """Parse a lease file; raises ValueError when it is not one."""
        fields = {}
        for line in raw.decode("utf-8", "strict").split("\n"):
            if line:
                key, sep, text = line.partition("\t")
                if not sep:
                    raise ValueError(f"bad line {line[:40]!r}")
                fields[key] = text
        if fields.get("identity") != identity:
            raise ValueError("identity does not match the file name")
        kwargs: dict = {}
        for name in cls.__slots__:
            if name not in fields:
                if name in ("identity", "job_id", "uid"):
                    raise ValueError(f"missing {name}")
                continue
            text = fields[name]
            if name in _INT_FIELDS:
                kwargs[name] = int(text)
            elif name in ("start", "phase_since"):
                kwargs[name] = float(text)
            elif name in _LIST_FIELDS:
                kwargs[name] = tuple(t for t in text.split(",") if t)
            else:
                kwargs[name] = text
        return cls(**kwargs)


class BadLease:
    """A file in leases/ that is not a readable lease (it is reclaimable)."""

    __slots__ = ("identity", "reason", "job_id", "uid", "device_nodes")

    def __init__(self, identity: str, reason: str):
        self.identity, self.reason = identity, reason
        self.job_id, self.uid, self.device_nodes = -1, -1, ()


class Ledger:
    """The open state directory: leases, audit log and the state lock."""

    def __init__(self, state_dir: str, create: bool = True, require_root: bool = True):
        self.state_dir = state_dir
        self.dir_fd = statedir.open_dir(state_dir, create=create, require_root=require_root)
        try:
            self.leases_fd = statedir.open_dir(LEASES, create=create, parent_fd=self.dir_fd,
                                               require_root=require_root)
        except statedir.StateDirError as exc:
            os.close(self.dir_fd)
            raise statedir.StateDirError(str(exc).replace(LEASES, os.path.join(state_dir, LEASES), 1),
                                         os.path.join(state_dir, LEASES)) from exc
        self._lock_fd: int | None = None

    def close(self) -> None:
        for fd in (self.leases_fd, self.dir_fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._lock_fd = None

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- locking ---------------------------------------------------------------
    def lock(self) -> "Ledger":
        """Take the state lock (blocking); released by :meth:`unlock` or close()."""
        import fcntl

        if self._lock_fd is None:
            self._lock_fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                                    dir_fd=self.dir_fd)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        return self

    def unlock(self) -> None:
        import fcntl

        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    # ---- leases ----------------------------------------------------------------
    def read(self, identity: str) -> Lease | BadLease | None:
        """The lease on ``identity``, a BadLease if unreadable, None if free."""
        try:
            raw = statedir.read_file(self.leases_fd, identity, limit=65536)
        except statedir.StateDirError as exc:
            return BadLease(identity, str(exc))
        if raw is None:
            return None
        try:
            return Lease.from_bytes(identity, raw)
        except (ValueError, KeyError, TypeError) as exc:
            return BadLease(identity, f"unreadable lease ({exc})")

    def claim(self, lease: Lease) -> bool:
        """Atomically create the lease; False when the device is already leased."""
        return statedir.create_exclusive(self.leases_fd, lease.identity, lease.to_bytes())

    def rewrite(self, lease: Lease) -> None:
        """Replace the lease file (its phase changed) atomically."""
        statedir.write_atomic(self.leases_fd, lease.identity, lease.to_bytes())

    def drop(self, identity: str) -> bool:
        """Remove the lease file on ``identity`` (whoever holds it)."""
        return statedir.remove(self.leases_fd, identity)

    def names(self) -> list[str]:
        """Lease file names (temp files left by a crash are skipped)."""
        return sorted(n for n in os.listdir(self.leases_fd) if not n.startswith("."))

    def all(self) -> Iterator[Lease | BadLease]:
        for name in self.names():
            lease = self.read(name)
            if lease is not None:
                yield lease

    def of_job(self, job_id: int) -> list[Lease]:
        """The job's leases on this node, in its allocation order."""
        mine = [lease for lease in self.all() if isinstance(lease, Lease) and lease.job_id == job_id]
        order = mine[0].allocation if mine else ()
        rank = {identity: i for i, identity in enumerate(order)}
        return sorted(mine, key=lambda lease: (rank.get(lease.identity, len(rank)), lease.identity))

    def sweep_temps(self) -> int:
        """Remove temp files of processes that died between write and link."""
        removed = 0
        for name in os.listdir(self.leases_fd):
            if name.startswith(".") and name.endswith(".tmp"):
                try:
                    pid = int(name.rsplit(".", 2)[-2])
                except ValueError:
                    continue
                if not os.path.exists(f"/proc/{pid}"):
                    removed += statedir.remove(self.leases_fd, name)
        return removed

    # ---- audit -----------------------------------------------------------------
    def audit(self, event: str, **fields: object) -> None:
        """Append one audit record (never raises: the audit log must not fail a job)."""
        record = {"t": round(time.time(), 6), "event": event, **fields}
        try:
            statedir.append_line(self.dir_fd, AUDIT, (json_line(record) + "\n").encode())
        except (OSError, statedir.StateDirError):
            pass


def process_start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat (clock ticks since boot), 0 if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return 0
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = data[data.rfind(b")") + 2:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return 0
