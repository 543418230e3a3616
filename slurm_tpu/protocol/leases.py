"""Lease files: ``<state_dir>/leases/<identity>``, one per leased device (root only).

The ledger (:mod:`slurm_tpu.access.ledger`) owns how the files are created (exclusively,
atomically, never through a link); :meth:`Lease.encode` and :meth:`Lease.decode` own
what is in them.

Format (version 1): UTF-8 ``field<TAB>value`` lines, one per field of :data:`FIELDS`,
lists comma-separated. Absent fields take their defaults (files written before
``phase``/``phase_since`` existed read as phase ``held``); unknown fields are ignored, so
a compatible addition needs no new version; an incompatible change must raise
:data:`VERSION`, and this reader refuses files that name a newer one.
"""

from __future__ import annotations

from . import FormatError, Record

TYPE_CHECKING = False  # annotations only: importing typing costs the hooks milliseconds per job
if TYPE_CHECKING:
    from typing import Any

DIR = "leases"  # under the state directory
VERSION = 1
MAX_BYTES = 65536  # a lease is ~300 bytes; anything larger is not one
HELD, REVOKING, RELEASING, KEPT = "held", "revoking", "releasing", "kept"  # Lease.phase
PHASES = (HELD, REVOKING, RELEASING, KEPT)
FREE, UNREADABLE = "free", "unreadable"  # no lease file (before its claim, after its drop); a BadLease
_ENDING = (RELEASING, REVOKING, KEPT, FREE)
# What a phase may become (leasing._move applies it). Only a claim makes a lease HELD. Ending it
# (leasing.end_lease) may begin in any phase (again after its hook died, or to clear a kept lease)
# and goes through RELEASING (holder scan) or REVOKING (USB power-cycle) to KEPT (a problem) or
# FREE (udev_event frees a revoked stick once it is back).
TRANSITIONS = {
    FREE: (HELD,),
    HELD: _ENDING,
    RELEASING: _ENDING,
    REVOKING: _ENDING,
    KEPT: _ENDING,
    UNREADABLE: _ENDING,
}


def check_transition(old: str, new: str) -> None:
    """Raise ValueError unless :data:`TRANSITIONS` lets phase ``old`` become ``new``."""
    if new not in TRANSITIONS.get(old, ()):
        raise ValueError(f"lease phase {old!r} may not become {new!r}")


# Field names, in the order they are written (the order of Lease's constructor).
FIELDS = (
    "identity",
    "job_id",
    "uid",
    "kind",
    "user",
    "start",
    "device_nodes",
    "allocation",
    "node",
    "prolog_pid",
    "prolog_start",
    "version",
    "phase",
    "phase_since",
    "releaser_pid",
    "releaser_start",
)
REQUIRED = ("identity", "job_id", "uid")
_INT_FIELDS = ("job_id", "uid", "prolog_pid", "prolog_start", "version", "releaser_pid", "releaser_start")
_FLOAT_FIELDS = ("start", "phase_since")
_LIST_FIELDS = ("device_nodes", "allocation")


class Lease(Record):
    """One device held by one job on this node."""

    __slots__ = FIELDS

    def __init__(
        self,
        identity: str,
        job_id: int,
        uid: int,
        kind: str = "edgetpu",
        user: str = "",
        start: float = 0.0,
        device_nodes: tuple[str, ...] = (),
        allocation: tuple[str, ...] = (),
        node: str = "",
        prolog_pid: int = 0,
        prolog_start: int = 0,
        version: int = VERSION,
        phase: str = HELD,
        phase_since: float = 0.0,
        releaser_pid: int = 0,
        releaser_start: int = 0,
    ):
        self.identity, self.job_id, self.uid, self.kind, self.user = identity, job_id, uid, kind, user
        self.start, self.device_nodes, self.allocation, self.node = start, tuple(device_nodes), tuple(allocation), node
        # *_start: /proc/<pid>/stat start time, to tell a reused pid apart.
        self.prolog_pid, self.prolog_start, self.version = prolog_pid, prolog_start, version
        # HELD while the job may use it; REVOKING from a USB disconnect until udev reports the
        # device back; RELEASING while the hook releaser_pid scans for holders without the state
        # lock; KEPT when its end found a problem (a holder, an unfinished scan).
        self.phase, self.phase_since = phase, phase_since
        self.releaser_pid, self.releaser_start = releaser_pid, releaser_start

    def __repr__(self) -> str:
        return f"Lease({self.identity!r}, job {self.job_id}, uid {self.uid})"

    def encode(self) -> bytes:
        """The lease file's bytes (always the current :data:`VERSION`)."""
        lines = []
        for name in FIELDS:
            item: Any = VERSION if name == "version" else getattr(self, name)  # a list field's: strings
            text = ",".join(item) if name in _LIST_FIELDS else str(item)
            if "\n" in text or "\t" in text or (name in _LIST_FIELDS and any("," in i for i in item)):
                raise ValueError(f"lease field {name} holds a tab, newline or (in a list) a comma")
            lines.append(f"{name}\t{text}")
        return ("\n".join(lines) + "\n").encode()

    @classmethod
    def decode(cls, identity: str, raw: bytes) -> Lease:
        """The lease in file ``leases/<identity>``; :class:`FormatError` names what is wrong."""
        source = f"{DIR}/{identity}"
        try:
            text = raw.decode("utf-8", "strict")
        except UnicodeDecodeError:
            raise FormatError(f"lease file {source} is not UTF-8 text", source) from None
        fields: dict[str, str] = {}
        for number, line in enumerate(text.split("\n"), 1):
            if not line:
                continue
            key, sep, value = line.partition("\t")
            if not sep:
                raise FormatError(f"lease file {source} line {number}: no tab in {line[:40]!r}", source)
            if key in fields:
                raise FormatError(f"lease file {source} line {number}: field {key!r} given twice", source)
            fields[key] = value
        for name in REQUIRED:
            if name not in fields:
                raise FormatError(f"lease file {source}: field {name!r} is missing", source)
        if fields["identity"] != identity:
            raise FormatError(
                f"lease file {source}: names device {fields['identity'][:80]!r}, not its file name", source
            )
        kwargs: dict = {name: _value(name, fields[name], source) for name in FIELDS if name in fields}
        if kwargs.get("version", VERSION) > VERSION:
            raise FormatError(
                f"lease file {source} has format version {kwargs['version']}; this slurm-tpu "
                f"reads up to {VERSION}: run the same slurm-tpu on every node and hook",
                source,
            )
        if kwargs.get("phase", HELD) not in PHASES:
            raise FormatError(f"lease file {source}: unknown phase {kwargs['phase'][:40]!r}", source)
        return cls(**kwargs)


def _value(name: str, text: str, source: str) -> object:
    """One field's value, strictly: plain decimal integers, finite floats."""
    if name in _INT_FIELDS:
        digits = text[1:] if text.startswith("-") else text
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 20:
            raise FormatError(f"lease file {source}: field {name!r} is not an integer: {text[:40]!r}", source)
        return int(text)
    if name in _FLOAT_FIELDS:
        try:
            number = float(text)
        except ValueError:
            number = float("nan")
        if not text.isascii() or number - number != 0:  # NaN or an infinity (no math import for the hooks)
            raise FormatError(f"lease file {source}: field {name!r} is not a finite number: {text[:40]!r}", source)
        return number
    if name in _LIST_FIELDS:
        return tuple(item for item in text.split(",") if item)
    return text


class BadLease:
    """A file in leases/ that is not a readable lease (it is reclaimable)."""

    __slots__ = ("identity", "reason", "job_id", "uid", "device_nodes")

    def __init__(self, identity: str, reason: str):
        self.identity, self.reason = identity, reason
        self.job_id, self.uid, self.device_nodes = -1, -1, ()
