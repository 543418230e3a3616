"""Per-job accelerator usage records: written by the runner (the job's user), read by the epilog (root).

They meet in the job's own *usage box*: ``<state_dir>/job-usage/<job>``, a tmpfs the
prolog mounts for that one job (:mod:`slurm_tpu.hooks.jobusage`; of :data:`BOX_BYTES`
bytes and :data:`BOX_INODES` inodes, the job's alone: docs/accounting.md says why).

The runner keeps one file per device, ``<identity>.json``, with the job's running totals
(:func:`encode`), updated under its device lock. The figures are self-reported (a user can
only inflate their own), and :func:`checked` bounds them so a forged record can neither
crash ``report``/``metrics`` nor dominate a total. Energy is root's, never the job's: the Epilog
reads it from the devices (protocol/energy.py); a record's ``energy_j``, which older runners wrote
(always null), is ignored.
"""

from __future__ import annotations

import errno
import os
import stat

from ..identity import is_identity
from . import FormatError, Record, jobenv, json_object

USAGE_DIR_ENV = jobenv.USAGE_DIR  # the job environment contract names it
FORMAT_VERSION = 1
SUFFIX = ".json"  # <identity>.json in the box
# Field names of a record (the epilog's ``usage`` audit event uses the same figures' names).
VERSION_FIELD, INFERENCES, SECONDS = "version", "inferences", "seconds"
MAX_BYTES = 4096  # a record is ~100 bytes; anything larger is not ours
# The box: room for a few dozen records and their temp files, nothing more.
BOX_BYTES = 64 * 1024
BOX_INODES = 64
# Plausibility bounds: a record beyond them is refused whole (a million inferences a second for a year is 3.2e13).
MAX_INFERENCES = 10**14
MAX_SECONDS = 10.0**9


class UsageRecord(Record):
    """What a job did on one device: inference count and seconds in inference."""

    __slots__ = ("identity", "inferences", "seconds")

    def __init__(self, identity: str, inferences: int, seconds: float):
        self.identity, self.inferences, self.seconds = identity, inferences, seconds


def checked(inferences: object, seconds: object) -> tuple[int, float] | None:
    """The figures as (int, float) when each is a number (not a bool) in [0, its bound]
    (NaN fails every comparison; infinities and 1e400, parsed as inf, fail the bounds), else None."""
    if isinstance(inferences, bool) or not isinstance(inferences, int) or not 0 <= inferences <= MAX_INFERENCES:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= MAX_SECONDS:
        return None
    return inferences, float(seconds)


def record_name(identity: str) -> str | None:
    """The box file name for a device identity; None for anything that is not a plain identity."""
    return identity + SUFFIX if is_identity(identity) else None


def encode(inferences: int, seconds: float) -> bytes:
    """A record file's bytes (the current :data:`FORMAT_VERSION`)."""
    import json  # job side only

    return json.dumps({VERSION_FIELD: FORMAT_VERSION, INFERENCES: inferences, SECONDS: round(seconds, 6)}).encode()


def decode(raw: bytes, identity: str) -> UsageRecord:
    """The record in a box file's bytes; :class:`FormatError` says why it is not a plausible one."""
    source = f"usage record {identity}{SUFFIX}"
    if len(raw) > MAX_BYTES:
        raise FormatError(f"{source} is over {MAX_BYTES} bytes", source)
    data = json_object(raw, source)  # imports json: only when a job left a record
    if data.get(VERSION_FIELD) != FORMAT_VERSION:
        raise FormatError(f"{source} is not format version {FORMAT_VERSION}", source)
    figures = checked(data.get(INFERENCES), data.get(SECONDS))  # an old record's energy_j: ignored
    if figures is None:
        raise FormatError(
            f"{source}: figures out of bounds (inferences 0..{MAX_INFERENCES}, seconds 0..{MAX_SECONDS:g})",
            source,
        )
    return UsageRecord(identity, *figures)


def _read(dir_fd: int, name: str, uid: int | None) -> bytes | None:
    """A small regular file's bytes (owned by ``uid``), never through a link; None when there is
    no such file, :class:`FormatError` when there is one that cannot be a record."""
    source = f"usage record {name}"
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        why = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be opened ({exc.strerror})"
        raise FormatError(f"{source} {why}", source) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FormatError(f"{source} is not a regular file", source)
        if uid is not None and info.st_uid != uid:
            raise FormatError(f"{source} belongs to uid {info.st_uid}, not the job's uid {uid}", source)
        if info.st_size > MAX_BYTES:
            raise FormatError(f"{source} is over {MAX_BYTES} bytes", source)
        return os.read(fd, MAX_BYTES + 1)
    except OSError as exc:
        raise FormatError(f"{source} cannot be read ({exc.strerror})", source) from None
    finally:
        os.close(fd)


def read_record(box_fd: int, identity: str, uid: int) -> UsageRecord | None:
    """Root side: the job's record for one of its devices; None when it left none.

    :class:`FormatError` for a record that is there but not acceptable, or an identity that
    names no file (the epilog audits it as ``usage-rejected``).
    """
    name = record_name(identity)
    if name is None:
        raise FormatError(f"{identity[:80]!r} is not a device identity that names a usage record", identity)
    raw = _read(box_fd, name, uid)
    return None if raw is None else decode(raw, identity)


def add_usage(directory: str, identity: str, inferences: int, seconds: float) -> bool:
    """Job side: add figures to the job's totals for ``identity`` in its usage box; False (nothing
    written) when the identity or figures are not plausible or the box refuses the write."""
    name = record_name(identity)
    if name is None or checked(inferences, seconds) is None:
        return False
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            raw = _read(dir_fd, name, os.getuid())
            before = decode(raw, identity) if raw is not None else None
        except FormatError:
            before = None  # not a record we wrote: replaced by one that is
        if before is not None:
            inferences = min(inferences + before.inferences, MAX_INFERENCES)
            seconds = min(seconds + before.seconds, MAX_SECONDS)
        data = encode(inferences, seconds)
        tmp = f".{name}.{os.getpid()}.tmp"
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd
            )
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # replaces, never follows, a link
        except OSError:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
            return False
        return True
    finally:
        os.close(dir_fd)
