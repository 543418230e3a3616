"""Programs that hold a device where a look at /proc/PID/fd and /proc/PID/maps does not show it.

Shared by the holder-scan unit tests (test_holder_scan.py) and the cluster tests
(test_hidden_holders.py). Each runs as ``python3 -I -c SCRIPT NODE PIDFILE [OPTION...]``,
writes its pid to PIDFILE (atomically) once it holds NODE the hidden way, then sleeps;
option ``detach`` first leaves its job (double fork, own session), as a job's daemon would.
"""

from __future__ import annotations

_PRELUDE = r"""
import ctypes, os, sys, threading, time
node, pidfile, options = sys.argv[1], sys.argv[2], sys.argv[3:]
if "detach" in options:
    if os.fork():
        sys.exit(0)
    os.setsid()
    if os.fork():
        sys.exit(0)
libc = ctypes.CDLL(None, use_errno=True)

def announce(text):
    with open(pidfile + ".tmp", "w") as handle:
        handle.write(text)
    os.rename(pidfile + ".tmp", pidfile)
"""

# Item 1a: a thread unshares its fd table (unshare(CLONE_FILES) copies it), the main
# thread closes the fd: only /proc/PID/task/TID/fd of that thread still shows it.
PRIVATE_FD_TABLE = (
    _PRELUDE
    + r"""
fd = os.open(node, os.O_RDWR | os.O_NOCTTY)
ready = threading.Event()
keeper_tid = []

def keeper():
    if libc.unshare(0x400) != 0:  # CLONE_FILES
        raise OSError(ctypes.get_errno(), "unshare(CLONE_FILES)")
    keeper_tid.append(threading.get_native_id())
    ready.set()
    time.sleep(3600)

threading.Thread(target=keeper, daemon=True).start()
ready.wait()
os.close(fd)  # gone from the table the leader shares with the process; the keeper has its own copy
announce(f"{os.getpid()} {keeper_tid[0]}")
time.sleep(3600)
"""
)

# Item 1b: a worker thread maps the device (its fd closed), then the thread-group
# leader exits alone (SYS_exit, not exit_group): the leader is a zombie whose
# /proc/PID/maps, map_files and fd are empty; the worker keeps the mapping. With
# option ``fd`` the worker keeps an open fd instead of a mapping.
ZOMBIE_LEADER = (
    _PRELUDE
    + r"""
SYS_EXIT = {"x86_64": 60, "aarch64": 93, "riscv64": 93}[os.uname().machine]
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
keep_fd = "fd" in options
leader = os.getpid()

def worker():
    fd = os.open(node, os.O_RDWR | os.O_NOCTTY)
    if not keep_fd:
        address = libc.mmap(None, 4096, 3, 2, fd, 0)  # PROT_READ|PROT_WRITE, MAP_PRIVATE
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        os.close(fd)
    while open(f"/proc/{leader}/status").read().find("State:\tZ") < 0:
        time.sleep(0.01)  # the leader is gone: only this thread holds the device now
    announce(str(leader))
    time.sleep(3600)

threading.Thread(target=worker).start()
libc.syscall(SYS_EXIT, 0)
"""
)

# Item 3: the device's fd hidden among N (option ``fds=N``, default 19000) fds of /dev/null.
AMONG_DECOYS = (
    _PRELUDE
    + r"""
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
wanted = [int(o[4:]) for o in options if o.startswith("fds=")]
count = min(wanted[0] if wanted else 19000, hard - 64)
base = os.open("/dev/null", os.O_RDONLY)
for _ in range(count // 2):
    os.dup(base)
fd = os.open(node, os.O_RDWR | os.O_NOCTTY)
for _ in range(count - count // 2):
    os.dup(base)
announce(str(os.getpid()))
time.sleep(3600)
"""
)

# Decoys: hold as many fds of /dev/null as the hard limit allows; "ready" on stdout, then wait on stdin.
DECOYS = r"""
import os, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
base = os.open("/dev/null", os.O_RDONLY)
for _ in range(min(int(sys.argv[1]), hard - 64)):
    os.dup(base)
print("ready", flush=True)
sys.stdin.read()
"""
