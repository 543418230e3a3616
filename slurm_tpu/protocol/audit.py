"""Audit events: ``<state_dir>/audit.log``, one JSON object per line (root only).

Every hook appends an event when it takes, ends or changes a lease (one ``O_APPEND`` write,
:meth:`slurm_tpu.access.ledger.Ledger.audit`). Readers use :func:`read_events` and
:func:`pair_leases`, the one place that knows which events open and close a lease.

Format (version 1): a JSON object per line with at least ``t`` (epoch seconds) and
``event`` (one of :data:`EVENTS`); lease events add ``identity``, ``job_id`` and ``uid``.
Version 1 lines carry no version field; a later incompatible format adds ``"v": N`` and
this reader skips such lines, as it skips a torn last line. The writer is on the root
hooks' path: it builds the JSON text by hand (no ``json`` import, which drags in ``re``).
"""

from __future__ import annotations

from . import FormatError, Record, json_object

TYPE_CHECKING = False  # annotations only: importing typing costs the hooks milliseconds per job
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

FILE = "audit.log"  # under the state directory
VERSION = 1
VERSION_FIELD = "v"  # absent on version 1 lines

# Fields every reader relies on (a usage event's figures are protocol.usage's, imported where read).
T, EVENT, IDENTITY, JOB_ID, UID = "t", "event", "identity", "job_id", "uid"

# Event names, with the fields each adds to t/event.
ACQUIRE = "acquire"  # identity, job_id, uid, nodes: the prolog leased the device
REVOKE = "revoke"  # identity, job_id, uid, devnum, by_job: the job's fds on it are dead (USB)
RELEASE = "release"  # identity, job_id, uid, by_job[, vanished]: lease ended, device idle
RECLAIM = "reclaim"  # same fields: a stale lease (job gone) ended by a later hook
CLEAR = "clear"  # same fields: `slurm-tpu leases --clear` / health ended a kept lease
ROLLBACK = "rollback"  # identity, job_id, uid: the prolog failed and gave its leases back
USAGE = "usage"  # identity, job_id, uid, inferences, seconds: the job's figures (older lines: energy_j, ignored)
USAGE_UNAVAILABLE = "usage-unavailable"  # job_id, uid, reason: the job ran without a usage box
USAGE_REJECTED = "usage-rejected"  # identity, job_id, uid, reason: its usage record was not acceptable
REVOKE_FAILED = "revoke-failed"  # identity, job_id, uid, error: the lease was kept
SCAN_INCOMPLETE = "scan-incomplete"  # identity, job_id, scanned, total, unverified: the scan ran out of time
SURVIVOR = "survivor"  # identity, job_id, pids/how or writers: a process kept the device open
REENUMERATE = "reenumerate"  # identity[, job_id, uid], nodes, changed: a device got new nodes (udev)
REMOVE = "remove"  # identity: a device disappeared (udev)
# job_id, uid, reason: the node's TPU broker did not open (prolog) or close (epilog) the job's endpoint. The
# prolog's stderr reaches slurmd's log only when it fails (22.05 logs a successful one's at debug2): this is
# the node's trail of a job that started with its shares unusable.
BROKER_UNAVAILABLE = "broker-unavailable"
# identity, job_id, uid, joules (null: unavailable), method, seconds, note: the job's energy on one device
# (protocol/energy.py says how each method is obtained); written by the Epilog.
ENERGY = "energy"
# job_id, uid, reason: the Prolog could not take a job's energy start readings (or the Epilog read no start
# file it found): the job ran; the Epilog's energy events say which figures this cost.
ENERGY_UNAVAILABLE = "energy-unavailable"
# The job lost the device at the first CLOSING event; the device is free again at a FREEING one
# (a revoked USB stick stays leased until udev sees it back and releases it).
FREEING = (RELEASE, RECLAIM, CLEAR, ROLLBACK)
CLOSING = (REVOKE, *FREEING)
_OTHERS = (
    USAGE,
    USAGE_UNAVAILABLE,
    USAGE_REJECTED,
    REVOKE_FAILED,
    SCAN_INCOMPLETE,
    SURVIVOR,
    REENUMERATE,
    REMOVE,
    BROKER_UNAVAILABLE,
    ENERGY,
    ENERGY_UNAVAILABLE,
)
EVENTS = frozenset((ACQUIRE, *CLOSING, *_OTHERS))


# ---- writer (root hooks: no json) -----------------------------------------------
_ESCAPES = {ord('"'): '\\"', ord("\\"): "\\\\", **{code: f"\\u{code:04x}" for code in range(0x20)}}


def encode(event: str, t: float, fields: dict) -> bytes:
    """One audit line (with its newline) for str/int/float/bool/None/list values, as
    ``json.dumps(sort_keys=True)`` writes it (but non-ASCII characters kept as UTF-8)."""
    record = {T: round(t, 6), EVENT: event, **fields}
    return ("{" + ", ".join(f"{_json(k)}: {_json(v)}" for k, v in sorted(record.items())) + "}\n").encode()


def _json(item: object) -> str:
    if item is None or isinstance(item, bool):
        return {None: "null", True: "true", False: "false"}[item]
    if isinstance(item, (int, float)):
        # json.dumps spells a non-finite float NaN/Infinity (not JSON, but json.loads reads them back).
        return repr(item) if _finite(item) else {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[repr(item)]
    if isinstance(item, (list, tuple)):
        return "[" + ", ".join(_json(i) for i in item) + "]"
    return '"' + str(item).translate(_ESCAPES) + '"'


def last_acquire(tail: bytes, identity: str, uid: int | None = None) -> tuple[int, int] | None:
    """(job_id, uid) of the last ``acquire`` of ``identity`` (by a job of ``uid``, when given) among the
    audit lines in ``tail``; None if none.

    For the root hooks' failure path, so no json: it reads lines :func:`encode` wrote. A
    string value escapes every ``"`` it holds, so no forged string can look like a
    top-level ``"key": value`` field; a torn or foreign line simply does not match.
    """
    wanted = f'"{IDENTITY}": {_json(identity)}'.encode()
    acquire = f'"{EVENT}": {_json(ACQUIRE)}'.encode()
    for line in reversed(tail.split(b"\n")):
        if wanted in line and acquire in line:
            job_id, owner = _int_field(line, JOB_ID), _int_field(line, UID)
            if job_id is not None and owner is not None and uid in (None, owner):
                return job_id, owner
    return None


def _int_field(line: bytes, name: str) -> int | None:
    key = f'"{name}": '.encode()
    start = line.find(key)
    if start < 0:
        return None
    start += len(key)
    end = start + (line[start : start + 1] == b"-")
    while end < len(line) and line[end : end + 1].isdigit():
        end += 1
    try:
        return int(line[start:end])
    except ValueError:
        return None


# ---- reader ------------------------------------------------------------------
def decode(line: str, source: str = FILE) -> dict:
    """One audit event from one line (``t`` as a float); :class:`FormatError` says why it is not one.

    Only the fields every reader relies on are checked; the others are the consumer's.
    """
    event = json_object(line, source)
    if event.get(VERSION_FIELD, VERSION) != VERSION:
        raise FormatError(
            f"{source}: audit format version {event[VERSION_FIELD]!r}; this slurm-tpu reads {VERSION}", source
        )
    if not isinstance(event.get(EVENT), str):
        raise FormatError(f"{source}: no event name", source)
    if not _number(event.get(T)):
        raise FormatError(f"{source}: time {T!r} is not a finite number", source)
    event[T] = float(event[T])
    if IDENTITY in event and not isinstance(event[IDENTITY], str):
        raise FormatError(f"{source}: {IDENTITY!r} is not a string", source)
    for name in (JOB_ID, UID):
        if name in event and (isinstance(event[name], bool) or not isinstance(event[name], int)):
            raise FormatError(f"{source}: {name!r} is not an integer", source)
    return event


def read_events(lines: Iterable[str], source: str = FILE) -> Iterator[dict]:
    """The well-formed events among ``lines`` (see :func:`decode`); the others are skipped."""
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                yield decode(line, f"{source} line {number}")
            except FormatError:
                continue


def _number(value: object) -> bool:
    """A finite int or float that a float can hold (json reads 1e400 as inf, 10**400 as an int)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return _finite(float(value))
    except OverflowError:
        return False


def _finite(value: float) -> bool:
    """Neither NaN nor an infinity (inf - inf and NaN - NaN are NaN; no math import on the hooks' path)."""
    return value - value == 0


# ---- pairing -------------------------------------------------------------------
class LeaseSpan(Record):
    """One job's lease on one device, from its ``acquire`` on, with the sum of its plausible ``usage``.

    ``end``: when the job lost the device (the first CLOSING event); ``freed``: when the
    device was free again (None while it is not).
    """

    __slots__ = ("identity", "job_id", "uid", "start", "end", "freed", "inferences", "inference_seconds")

    def __init__(self, identity: str, job_id: int, uid: int, start: float):
        self.identity, self.job_id, self.uid, self.start = identity, job_id, uid, start
        self.end: float | None = None
        self.freed: float | None = None
        self.inferences, self.inference_seconds = 0, 0.0

    def seconds_within(self, since: float | None, until: float | None, now: float) -> float:
        """Lease time (start to end) overlapping [since, until); a lease still held counts up to ``now``."""
        start = max(self.start, since) if since is not None else self.start
        end = self.end if self.end is not None else now
        if until is not None:
            end = min(end, until)
        return max(0.0, end - start)


class Pairing:
    """What :func:`pair_leases` found: the spans in start order, and exclusivity conflicts (one
    line each: a device acquired while another lease on it was not freed, freed by a job that
    did not hold it, or released by a job that never acquired it)."""

    __slots__ = ("spans", "conflicts")

    def __init__(self, spans: list[LeaseSpan], conflicts: list[str]):
        self.spans, self.conflicts = spans, conflicts


def pair_leases(events: Iterable[dict]) -> Pairing:
    """Pair each ``acquire`` with the events that close it, per (device, job), in log order.

    Events without an identity and a job id are not about a lease; closing events of
    leases whose acquire the log does not hold (planted by hand, or a prolog that died
    before auditing) are passed over too.
    """
    from .usage import INFERENCES, SECONDS, checked

    spans: list[LeaseSpan] = []
    conflicts: list[str] = []
    open_spans: dict[tuple[str, int], LeaseSpan] = {}  # acquired, not yet freed
    latest: dict[tuple[str, int], LeaseSpan] = {}  # for usage, which the epilog writes before its release
    holder: dict[str, int] = {}  # device -> the job whose lease on it is not freed
    for event in events:
        identity, job_id, name = event.get(IDENTITY), event.get(JOB_ID), event[EVENT]
        if not isinstance(identity, str) or not isinstance(job_id, int) or isinstance(job_id, bool):
            continue
        key, t = (identity, job_id), float(event[T])
        if name == ACQUIRE:
            if identity in holder:
                conflicts.append(f"{identity} acquired by job {job_id} at {t} while job {holder[identity]} held it")
            if key in open_spans:  # acquired again without a close in the log: the newer one counts
                spans.remove(open_spans[key])
            uid = event.get(UID, -1)
            span = LeaseSpan(identity, job_id, uid if isinstance(uid, int) else -1, t)
            spans.append(span)
            open_spans[key] = latest[key] = span
            holder[identity] = job_id
        elif name in CLOSING:
            closed = open_spans.get(key)
            if name in FREEING:
                held_by = holder.get(identity)
                if held_by == job_id:
                    del holder[identity]
                elif held_by is not None:
                    conflicts.append(f"{name} of {identity} by job {job_id} at {t} while job {held_by} held it")
                elif name in (RELEASE, ROLLBACK):  # a reclaim or clear may end a lease nobody audited
                    conflicts.append(f"{name} of {identity} by job {job_id} at {t}, which never acquired it")
            if closed is None:
                continue
            if closed.end is None:
                closed.end = t
            if name in FREEING:
                closed.freed = t
                del open_spans[key]
        elif name == USAGE and key in latest:
            # An older line's energy_j was the job's own claim: root's energy events replace it.
            figures = checked(event.get(INFERENCES), event.get(SECONDS))
            if figures is None:
                continue  # implausible numbers: not counted at all
            span = latest[key]
            span.inferences += figures[0]
            span.inference_seconds += figures[1]
    spans.sort(key=lambda s: (s.start, s.identity))
    return Pairing(spans, conflicts)
