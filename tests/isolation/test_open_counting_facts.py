"""Why the hooks do not count a device's open files with inotify or fanotify: the kernel's own behaviour.

Counting IN_OPEN minus IN_CLOSE_* on a device node would give its number of open file
descriptions only if the kernel queued one event per open and per last close. It does
not: inotify drops an event identical to the one still unread at the tail of its queue
(fs/notify/inotify/inotify_fsnotify.c, inotify_merge), so two opens before the reader
reads count as one, and a job's user who opens twice and closes once looks gone while
holding the device. fanotify reports no open or close of a device node at all without
FAN_REPORT_FID ("path type events are only relevant for files and dirs"), and with it
merges one process's opens and closes of a file into one event. These tests pin those
facts on the running kernel (docs/security.md, "Why not count open files"); if one ever
fails, the kernel changed and counting deserves a second look.
"""

from __future__ import annotations

import ctypes
import os
import select
import stat
import struct
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, fanotify)")

IN_OPEN, IN_CLOSE_WRITE, IN_CLOSE_NOWRITE = 0x20, 0x08, 0x10
FAN_CLOSE_WRITE, FAN_CLOSE_NOWRITE, FAN_OPEN = 0x08, 0x10, 0x20
FAN_CLOEXEC, FAN_NONBLOCK, FAN_CLASS_NOTIF, FAN_REPORT_FID, FAN_MARK_ADD = 0x1, 0x2, 0x0, 0x200, 0x1
AT_FDCWD = -100
INOTIFY_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)
FANOTIFY_METADATA = struct.Struct("IBBHQii")  # event_len, vers, reserved, metadata_len, mask, fd, pid

libc = ctypes.CDLL(None, use_errno=True)
libc.fanotify_mark.argtypes = (ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p)


@pytest.fixture
def node(tmp_path):
    """A device node of our own on /dev/zero's numbers (opens and closes reach a real driver)."""
    path = str(tmp_path / "accel0")
    os.mknod(path, stat.S_IFCHR | 0o600, os.stat("/dev/zero").st_rdev)
    return path


def inotify_counts(fd: int) -> tuple[int, int]:
    """(open events, close events) queued on the inotify instance ``fd``."""
    opens = closes = 0
    data = os.read(fd, 1 << 16) if select.select([fd], [], [], 0)[0] else b""
    offset = 0
    while offset < len(data):
        _wd, mask, _cookie, length = INOTIFY_EVENT.unpack_from(data, offset)
        offset += INOTIFY_EVENT.size + length
        opens += bool(mask & IN_OPEN)
        closes += bool(mask & (IN_CLOSE_WRITE | IN_CLOSE_NOWRITE))
    return opens, closes


def in_child(code: str, node: str) -> None:
    """Run ``code`` (with ``node`` bound) in a process of its own, to its end."""
    subprocess.run([sys.executable, "-I", "-c", f"import os\nnode = {node!r}\n{code}"], check=True)


def test_inotify_counts_two_opens_read_late_as_one(node):
    watcher = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
    assert watcher >= 0, os.strerror(ctypes.get_errno())
    try:
        assert libc.inotify_add_watch(watcher, node.encode(), IN_OPEN | IN_CLOSE_WRITE | IN_CLOSE_NOWRITE) >= 0
        # Read between the events: one each.
        first = os.open(node, os.O_RDONLY)
        assert inotify_counts(watcher) == (1, 0)
        second = os.open(node, os.O_RDONLY)
        assert inotify_counts(watcher) == (1, 0)
        os.close(first)
        os.close(second)
        assert inotify_counts(watcher) == (0, 1)  # the two identical closes, unread between them: one
        # Two opens, then one close, read only after: one open, one close, while a file is still open.
        first, second = os.open(node, os.O_RDONLY), os.open(node, os.O_RDONLY)
        os.close(first)
        assert inotify_counts(watcher) == (1, 1)
        os.close(second)
    finally:
        os.close(watcher)


def fanotify_events(fd: int) -> list[int]:
    """The masks of the events queued on the fanotify group ``fd`` (their descriptors closed)."""
    masks = []
    while select.select([fd], [], [], 0)[0]:
        data = os.read(fd, 1 << 16)
        offset = 0
        while offset < len(data):
            length, _vers, _reserved, _meta, mask, event_fd, _pid = FANOTIFY_METADATA.unpack_from(data, offset)
            offset += length
            masks.append(mask)
            if event_fd >= 0:
                os.close(event_fd)
    return masks


@pytest.mark.parametrize("report_fid", [False, True], ids=["path-events", "fid-events"])
def test_fanotify_does_not_count_a_device_nodes_opens(node, report_fid):
    flags = FAN_CLOEXEC | FAN_NONBLOCK | FAN_CLASS_NOTIF | (FAN_REPORT_FID if report_fid else 0)
    group = libc.fanotify_init(flags, os.O_RDONLY | os.O_CLOEXEC)
    if group < 0:
        pytest.skip(f"fanotify_init: {os.strerror(ctypes.get_errno())}")
    try:
        mask = FAN_OPEN | FAN_CLOSE_WRITE | FAN_CLOSE_NOWRITE
        assert libc.fanotify_mark(group, FAN_MARK_ADD, mask, AT_FDCWD, node.encode()) == 0
        in_child("files = [os.open(node, os.O_RDONLY) for _ in range(3)]\nfor f in files:\n    os.close(f)", node)
        masks = fanotify_events(group)
        if not report_fid:
            assert masks == []  # a char device is neither a file nor a directory: no event
        else:  # three opens and three closes of one process: one event saying "opened and closed"
            assert masks == [FAN_OPEN | FAN_CLOSE_NOWRITE]
    finally:
        os.close(group)
