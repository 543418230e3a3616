"""An emulated apex (gasket) driver for local clusters: PCIe Edge TPU nodes whose open files are counted.

The epilog and the prolog read the apex driver's sysfs ``write_open_count``
(slurm_tpu/access/revoke.py gasket_writers): gasket_core.c gasket_open() counts a
writable open file of /dev/apex_N and gasket_release() uncounts it only when the
file's last reference goes, so an fd in flight over SCM_RIGHTS, held by a fork
or by a mapping is still counted. Without the card, this process gives a local
cluster the same observable behaviour, per node:

* **The device node is a pseudo-terminal slave**, bind-mounted onto the node's
  path (``<node>/dev/apex_0``; a char-device node made elsewhere with the pty's
  numbers would not open: drivers/tty/pty.c pts_unix98_lookup() finds the tty
  only through its devpts dentry). This process keeps the master. The tty layer
  tells the master when no open file of the slave is left anywhere: pty_close()
  sets TTY_OTHER_CLOSED on the master at the slave's final close (tty_release()
  runs when the file's last reference goes, in flight or not), pty_open() clears
  it, and n_tty_poll() reports POLLHUP on the master while it is set.
* **``class/apex/apex_N/write_open_count`` is served by a small FUSE filesystem**
  (this module speaks the kernel's FUSE protocol on /dev/fuse itself,
  include/uapi/linux/fuse.h; no libfuse), mounted on ``<node>/sys/class/apex``.
  Its read handler polls the master with timeout 0 *when the hook reads*, so the
  answer is never stale: a close that has returned is seen by the next read.
  Like sysfs, a file's value is made at its first read and kept for that open.
* Whatever a job writes to the node is read from the master and dropped, so its
  writes never block on a full pty buffer.

Differences from gasket, both stricter, never laxer: the count is 1 for "at
least one open file" (gasket says how many), and read-only opens count too
(gasket counts writers only). The slave is a tty: a job that opens it without
O_NOCTTY as a session leader gets it as its controlling terminal.

Usage: ``python -m harness.localcluster.apex SYS_ROOT NODE...`` (as root). It
bind-mounts every NODE (an existing file: hardware.materialize's node), mounts
``SYS_ROOT/class/apex`` last (its mount is the sign that it is ready), and on
SIGTERM/SIGINT unmounts both and closes the masters. A mount this process could
not undo (SIGKILL) is detached by LocalCluster.stop().
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
import select
import signal
import stat
import struct
import sys

COUNT_FILE = "write_open_count"
MNT_DETACH = 2
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND = 2, 4, 8, 4096
DRAIN_POLL_MS = 100  # how often a master with no slave open is looked at again (see Card)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """mount(2); OSError on failure."""
    if (
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        )
        != 0
    ):
        error = ctypes.get_errno()
        raise OSError(error, f"mount {source} on {target}: {os.strerror(error)}")


def unmount(target: str) -> bool:
    """Detach ``target`` (umount2 MNT_DETACH); False when it was not mounted (or is gone)."""
    return _libc.umount2(target.encode(), MNT_DETACH) == 0


# ---- the device: a pty slave, its master kept here ---------------------------------------


class Card:
    """One emulated PCIe Edge TPU: ``node`` (bind-mounted pty slave) and its master."""

    def __init__(self, node: str):
        self.node = node
        self.name = os.path.basename(node)  # apex_0: the driver's class directory has the node's name
        self.master, slave = os.openpty()
        self.pts = os.ttyname(slave)
        os.fchown(slave, 0, 0)
        os.fchmod(slave, 0o600)  # what devtmpfs gives /dev/apex_N: root 0600, the idle policy
        os.close(slave)  # from now on, HUP on the master <=> no open file of the slave exists
        fcntl.fcntl(self.master, fcntl.F_SETFL, fcntl.fcntl(self.master, fcntl.F_GETFL) | os.O_NONBLOCK)
        mount(self.pts, node, None, MS_BIND)

    def open_files(self) -> int:
        """1 while any open file of the device exists (in any process, in flight over a socket), else 0.

        Asked at the moment of the call: POLLHUP on the master is the tty layer's
        own state (TTY_OTHER_CLOSED), set by the slave's final close.
        """
        poller = select.poll()
        poller.register(self.master, select.POLLIN)
        events = poller.poll(0)
        return 0 if events and events[0][1] & select.POLLHUP else 1

    def drain(self) -> None:
        """Read and drop what was written to the device (the pty buffer must never fill)."""
        while True:
            try:
                if not os.read(self.master, 65536):
                    return
            except (BlockingIOError, OSError):  # EAGAIN: empty; EIO: no slave open
                return

    def close(self) -> None:
        """Unmount the node (the placeholder underneath shows again) and close the master."""
        unmount(self.node)
        os.close(self.master)


# ---- the attribute: a read-only FUSE filesystem -------------------------------------------
# include/uapi/linux/fuse.h: opcodes and the structures used here.
LOOKUP, FORGET, GETATTR, OPEN, READ, STATFS, RELEASE = 1, 2, 3, 14, 15, 17, 18
FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR, INTERRUPT, DESTROY, BATCH_FORGET = 25, 26, 27, 28, 29, 36, 38, 42
NO_REPLY = (FORGET, BATCH_FORGET, INTERRUPT)
IN_HEADER = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
ATTR = struct.Struct(
    "<QQQQQQIIIIIIIIII"
)  # fuse_attr: ino size blocks a/m/ctime, nsecs, mode nlink uid gid rdev blksize flags
INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")  # fuse_init_out (64 bytes)
READ_IN = struct.Struct("<QQI")  # fh, offset, size
FOPEN_DIRECT_IO = 1  # every read comes here: no page cache between the hook and the tty's state
ROOT = 1
VALID_S = 1  # names and attributes never change while mounted
READ_BUFFER = 1 << 17  # >= FUSE_MIN_READ_BUFFER and a request with max_write (fuse_dev_do_read)


class CountFS:
    """``class/apex`` as the driver shows it: ``apex_N/write_open_count`` for each card, read-only.

    Inodes: 1 the root, 2+2i card i's directory, 3+2i its ``write_open_count``.
    """

    def __init__(self, mountpoint: str, cards: list[Card]):
        self.mountpoint, self.cards = mountpoint, cards
        self.values: dict[int, bytes] = {}  # fh -> the value made at the open file's first read
        self.next_fh = 1
        self.fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        mount(
            "slurm-tpu-apex",
            mountpoint,
            "fuse",
            MS_NOSUID | MS_NODEV | MS_NOEXEC,
            f"fd={self.fd},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions",
        )

    def close(self) -> None:
        unmount(self.mountpoint)
        os.close(self.fd)

    # -- inodes
    def _attr(self, ino: int) -> bytes:
        if ino == ROOT or ino % 2 == 0:
            mode, nlink, size = stat.S_IFDIR | 0o755, 2, 0
        else:
            mode, nlink, size = stat.S_IFREG | 0o444, 1, 4096  # sysfs shows a page
        return ATTR.pack(ino, size, 0, 0, 0, 0, 0, 0, 0, mode, nlink, 0, 0, 0, 4096, 0)

    def _exists(self, ino: int) -> bool:
        return ino == ROOT or 2 <= ino < 2 + 2 * len(self.cards)

    def _entries(self, ino: int) -> list[tuple[int, str, int]]:
        if ino == ROOT:
            return [(2 + 2 * i, card.name, stat.S_IFDIR >> 12) for i, card in enumerate(self.cards)]
        return [(ino + 1, COUNT_FILE, stat.S_IFREG >> 12)]

    # -- requests
    def serve_one(self) -> bool:
        """Answer one request; False when the filesystem was unmounted."""
        try:
            request = os.read(self.fd, READ_BUFFER)
        except OSError as exc:
            if exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):  # ENOENT: the request was interrupted
                return True
            if exc.errno == errno.ENODEV:
                return False
            raise
        _, opcode, unique, ino, _, _, _, _ = IN_HEADER.unpack_from(request)
        body = request[IN_HEADER.size :]
        if opcode in NO_REPLY:
            return True
        try:
            error, reply = 0, self._handle(opcode, ino, body)
        except OSError as exc:
            error, reply = -exc.errno, b""
        try:
            os.write(self.fd, OUT_HEADER.pack(OUT_HEADER.size + len(reply), error, unique) + reply)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # ENOENT: the caller was interrupted meanwhile
                raise
        return opcode != DESTROY

    def _handle(self, opcode: int, ino: int, body: bytes) -> bytes:
        if opcode == INIT:
            _major, minor, readahead = struct.unpack_from("<III", body)
            return INIT_OUT.pack(7, min(minor, 31), readahead, 0, 0, 0, 4096, 1, 0, 0, 0, 0)
        if opcode == DESTROY:
            return b""
        if not self._exists(ino):
            raise OSError(errno.ENOENT, "")
        if opcode == LOOKUP:
            name = body.split(b"\0", 1)[0].decode(errors="replace")
            for child, child_name, _ in self._entries(ino) if ino == ROOT or ino % 2 == 0 else []:
                if child_name == name:
                    return struct.pack("<QQQQII", child, 0, VALID_S, VALID_S, 0, 0) + self._attr(child)
            raise OSError(errno.ENOENT, "")
        if opcode == GETATTR:
            return struct.pack("<QII", VALID_S, 0, 0) + self._attr(ino)
        if opcode in (OPEN, OPENDIR):
            is_dir = ino == ROOT or ino % 2 == 0
            if is_dir != (opcode == OPENDIR):
                raise OSError(errno.EISDIR if is_dir else errno.ENOTDIR, "")
            fh, self.next_fh = self.next_fh, self.next_fh + 1
            return struct.pack("<QII", fh, FOPEN_DIRECT_IO if opcode == OPEN else 0, 0)
        if opcode == READ:
            fh, offset, size = READ_IN.unpack_from(body)
            value = self.values.get(fh)
            if value is None or offset == 0:  # sysfs makes the text at the first read of an open file
                value = b"%d\n" % self.cards[(ino - 3) // 2].open_files()
                self.values[fh] = value
            return value[offset : offset + size]
        if opcode == READDIR:
            fh, offset, size = READ_IN.unpack_from(body)
            entries = [(ino, ".", 4), (ROOT, "..", 4), *self._entries(ino)]
            out = b""
            for index in range(offset, len(entries)):
                child, name, kind = entries[index]
                raw = name.encode()
                record = struct.pack("<QQII", child, index + 1, len(raw), kind) + raw
                record += b"\0" * (-len(record) % 8)
                if len(out) + len(record) > size:
                    break
                out += record
            return out
        if opcode in (RELEASE, RELEASEDIR):
            self.values.pop(struct.unpack_from("<Q", body)[0], None)
            return b""
        if opcode == FLUSH:
            # sysfs files have no flush: ENOSYS tells the kernel so (fs/fuse/file.c fuse_flush() sets
            # fc->no_flush and sends no FLUSH again), so a close costs no round trip to this process.
            raise OSError(errno.ENOSYS, "")
        if opcode == STATFS:
            return struct.pack("<QQQQQIII28x", 0, 0, 0, 0, 0, 4096, 255, 4096)
        raise OSError(errno.ENOSYS, "")


# ---- the process --------------------------------------------------------------------------


def serve(fs: CountFS, cards: list[Card]) -> None:
    """Answer the filesystem and drain the masters until unmounted or signalled.

    A master with no slave open reports POLLHUP on every poll, so it is polled
    only every DRAIN_POLL_MS (nothing can be written to it meanwhile but what
    fits in the pty buffer); the others wake this loop when written to.
    """
    while True:
        waiting = select.poll()
        waiting.register(fs.fd, select.POLLIN)
        idle = False
        for card in cards:
            card.drain()
            if card.open_files():
                waiting.register(card.master, select.POLLIN)
            else:
                idle = True
        for fd, _ in waiting.poll(DRAIN_POLL_MS if idle else None):
            if fd == fs.fd and not fs.serve_one():
                return


def _stop(signum, frame) -> None:
    raise SystemExit(0)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write("usage: python -m harness.localcluster.apex SYS_ROOT NODE...\n")
        return 2
    sys_root, nodes = argv[0], argv[1:]
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    mountpoint = os.path.join(sys_root, "class", "apex")
    os.makedirs(mountpoint, exist_ok=True)
    cards: list[Card] = []
    fs = None
    try:
        for node in nodes:
            cards.append(Card(node))
        fs = CountFS(mountpoint, cards)
        serve(fs, cards)
    finally:
        if fs is not None:
            fs.close()
        for card in cards:
            card.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
