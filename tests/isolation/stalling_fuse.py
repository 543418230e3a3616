"""A FUSE filesystem that stops answering: what a user's stalled FUSE server does to a root ``stat``.

``python3 stalling_fuse.py MOUNTPOINT READY_FILE`` mounts (as root, ``allow_other``, the
setting a site enables with ``user_allow_other``) a filesystem of one regular file ``f``
whose attributes are never cached (attr_valid 0): every ``stat`` of it is a GETATTR
request to this server. Once ``f`` has been opened, GETATTR for it is never answered,
as a server that hangs (or a user who stopped it) never answers: any process that
stats the open file through ``/proc/PID/fd/N`` waits until the server dies (the kernel
then fails the request with ENOTCONN). Writes READY_FILE once mounted.

Pure standard library, speaking the kernel's FUSE protocol (include/uapi/linux/fuse.h,
protocol 7.31) on /dev/fuse: no libfuse needed on the test machine. Test-only.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

# Opcodes (include/uapi/linux/fuse.h enum fuse_opcode).
LOOKUP, FORGET, GETATTR, OPEN, RELEASE, FLUSH, INIT = 1, 2, 3, 14, 18, 25, 26
OPENDIR, READDIR, RELEASEDIR, ACCESS, INTERRUPT, DESTROY, BATCH_FORGET = 27, 28, 29, 34, 36, 38, 42
NO_REPLY = {FORGET, INTERRUPT, BATCH_FORGET}
IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
# fuse_attr: ino size blocks atime mtime ctime, their nsec, mode nlink uid gid rdev blksize flags
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")
FILE_NODE, FILE_NAME = 2, b"f"


def attr(node: int) -> bytes:
    mode, nlink = (0o040755, 2) if node == 1 else (0o100644, 1)
    return ATTR.pack(node, 0, 0, 0, 0, 0, 0, 0, 0, mode, nlink, 0, 0, 0, 4096, 0)


def reply(fuse: int, unique: int, payload: bytes = b"", error: int = 0) -> None:
    os.write(fuse, OUT_HEADER.pack(OUT_HEADER.size + len(payload), -error, unique) + payload)


def serve(fuse: int) -> None:
    opened = False
    while True:
        try:
            request = os.read(fuse, (1 << 20) + 4096)
        except OSError:
            return  # unmounted or aborted
        _len, opcode, unique, node, *_ = IN_HEADER.unpack_from(request)
        body = request[IN_HEADER.size :]
        if opcode in NO_REPLY:
            continue
        if opcode == INIT:
            major, minor, readahead = struct.unpack_from("<III", body)
            # fuse_init_out: major minor max_readahead flags max_background congestion_threshold
            # max_write time_gran max_pages map_alignment flags2 max_stack_depth unused[6]
            init_out = struct.pack("<IIIIHHIIHHII6I", 7, 31, readahead, 0, 16, 12, 1 << 17, 1, 0, 0, 0, 0, *[0] * 6)
            reply(fuse, unique, init_out)
        elif opcode == GETATTR:
            if node == FILE_NODE and opened:
                continue  # the stall: never answered
            reply(fuse, unique, struct.pack("<QII", 0, 0, 0) + attr(node))
        elif opcode == LOOKUP:
            if node == 1 and body.rstrip(b"\0") == FILE_NAME:
                # fuse_entry_out: nodeid generation entry_valid attr_valid (+nsec) attr
                reply(fuse, unique, struct.pack("<QQQQII", FILE_NODE, 0, 3600, 0, 0, 0) + attr(FILE_NODE))
            else:
                reply(fuse, unique, error=2)  # ENOENT
        elif opcode in (OPEN, OPENDIR):
            reply(fuse, unique, struct.pack("<QIi", 1, 0, 0))
            opened = opened or (opcode == OPEN and node == FILE_NODE)
        elif opcode in (RELEASE, RELEASEDIR, FLUSH, ACCESS, DESTROY, READDIR):
            reply(fuse, unique)
        else:
            reply(fuse, unique, error=38)  # ENOSYS (STATX and the rest: the kernel falls back)


def main() -> int:
    mountpoint, ready = sys.argv[1], sys.argv[2]
    fuse = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fuse},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
    ms_nosuid, ms_nodev = 2, 4
    if libc.mount(b"stalling-fuse", mountpoint.encode(), b"fuse", ms_nosuid | ms_nodev, options) != 0:
        print(f"stalling_fuse: mount on {mountpoint}: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 1
    with open(ready, "w") as handle:
        handle.write(f"{os.getpid()}\n")
    serve(fuse)
    return 0


if __name__ == "__main__":
    sys.exit(main())
