"""The holder scan (slurm_tpu/access/processes.py) on real processes of this machine, no cluster.

Holders hidden in threads (a private fd table, a zombie thread-group leader), one
read per fd table however many tasks share it, and the order that leaves only a
flood's own processes unverified when the time box runs out.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import pytest
from hidden_holders import AMONG_DECOYS, DECOYS, PRIVATE_FD_TABLE, ZOMBIE_LEADER

from slurm_tpu.access import processes

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, other users' /proc)")


@pytest.fixture
def device(tmp_path):
    """A device node of our own on /dev/zero's numbers (openable, mappable, keeps its vm_file)."""
    node = str(tmp_path / "accel0")
    os.mknod(node, stat.S_IFCHR | 0o600, os.stat("/dev/zero").st_rdev)
    return node


def start(script: str, node: str, pidfile: str, *options: str) -> tuple[subprocess.Popen, str]:
    """Run a hidden_holders program; returns it and what it announced once it holds the node."""
    process = subprocess.Popen([sys.executable, "-I", "-c", script, node, pidfile, *options])
    deadline = time.monotonic() + 30
    while not os.path.exists(pidfile):
        assert process.poll() is None or process.returncode == 0, f"holder failed: {process.returncode}"
        assert time.monotonic() < deadline, "the holder did not get ready"
        time.sleep(0.02)
    return process, open(pidfile).read()


def scan(node: str, **kwargs) -> processes.Scan:
    kwargs.setdefault("budget_s", 30.0)
    return processes.scan_holders([os.stat(node).st_rdev], {os.lstat(node).st_dev}, **kwargs)


def fd_dir_shows(fd_dir: str, rdev: int) -> bool:
    for name in os.listdir(fd_dir):
        try:
            if os.stat(os.path.join(fd_dir, name)).st_rdev == rdev:
                return True
        except OSError:
            pass
    return False


def stop(process: subprocess.Popen, pid: int | None = None) -> None:
    if pid is not None:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    process.kill()
    process.wait()


@needs_root
def test_an_fd_kept_in_a_threads_private_fd_table_is_found(device, tmp_path):
    holder, announced = start(PRIVATE_FD_TABLE, device, str(tmp_path / "pid"))
    try:
        pid, keeper = map(int, announced.split())
        rdev = os.stat(device).st_rdev
        assert not fd_dir_shows(f"/proc/{pid}/fd", rdev)  # what the old scan read
        assert fd_dir_shows(f"/proc/{pid}/task/{keeper}/fd", rdev)
        found = scan(device)
        assert found.complete and found.holders.get(pid) == "fd"
    finally:
        stop(holder)


@needs_root
@pytest.mark.parametrize("how", ["mmap", "fd"])
def test_a_device_held_by_a_thread_under_a_zombie_leader_is_found(device, tmp_path, how):
    holder, announced = start(ZOMBIE_LEADER, device, str(tmp_path / "pid"), *(["fd"] if how == "fd" else []))
    try:
        pid = int(announced)
        assert open(f"/proc/{pid}/maps", "rb").read() == b"" and os.listdir(f"/proc/{pid}/fd") == []
        found = scan(device)
        assert found.complete and found.holders.get(pid) == how
    finally:
        stop(holder)


THREADS_SHARING_A_TABLE = r"""
import os, sys, threading, time
base = os.open("/dev/null", os.O_RDONLY)
for _ in range(int(sys.argv[1])):
    os.dup(base)
for _ in range(int(sys.argv[2])):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


@needs_root
def test_an_fd_table_shared_by_many_threads_is_read_once(device, monkeypatch):
    if processes._kcmp() is None:
        pytest.skip("no kcmp(2) here: every table is read")
    many = subprocess.Popen(
        [sys.executable, "-I", "-c", THREADS_SHARING_A_TABLE, "2000", "50"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    read: list[str] = []
    real = processes._table_holds

    def counting(fd_dir, wanted, deadline):
        read.append(fd_dir)
        return real(fd_dir, wanted, deadline)

    monkeypatch.setattr(processes, "_table_holds", counting)
    try:
        assert many.stdout.readline().strip() == "ready"
        assert len(os.listdir(f"/proc/{many.pid}/task")) == 51
        assert scan(device).complete
        assert len([d for d in read if d.startswith(f"/proc/{many.pid}/")]) == 1
    finally:
        stop(many)


def start_decoys(count: int, fds_each: int, user: str | None = None) -> list[subprocess.Popen]:
    prefix = ["runuser", "-u", user, "--"] if user else []
    decoys = [
        subprocess.Popen(
            [*prefix, "/usr/bin/python3", "-I", "-c", DECOYS, str(fds_each)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    for decoy in decoys:
        assert decoy.stdout.readline().strip() == "ready"
    return decoys


def decoy_pids(decoys: list[subprocess.Popen]) -> set[int]:
    """The pids holding the fds (runuser stays in between as the parent)."""
    pids = set()
    for decoy in decoys:
        for pid in [decoy.pid, *map(int, open(f"/proc/{decoy.pid}/task/{decoy.pid}/children").read().split())]:
            if processes._fd_count(f"/proc/{pid}/fd") >= 1000:
                pids.add(pid)
    return pids


def table_pid(fd_dir: str) -> int:
    return int(fd_dir.split("/")[2])


@needs_root
def test_a_holder_hidden_among_decoys_is_found_and_the_flood_is_read_last(device, tmp_path, monkeypatch):
    decoys = start_decoys(4, 5000, user="nobody")
    holder, announced = start(AMONG_DECOYS, device, str(tmp_path / "pid"), "fds=5000")
    order: list[str] = []
    real = processes._table_holds

    def recording(fd_dir, wanted, deadline):
        order.append(fd_dir)
        return real(fd_dir, wanted, deadline)

    monkeypatch.setattr(processes, "_table_holds", recording)
    try:
        pid, flood = int(announced), decoy_pids(decoys)
        found = scan(device, first_uid=0)  # the holder is root's, like the ended job's user here
        # (Other processes of this machine may hold /dev/zero's numbers: only ours are asserted.)
        assert found.complete and found.holders.get(pid) == "fd" and not set(found.holders) & flood
        pids = [table_pid(d) for d in order]
        assert flood <= set(pids) and pid in pids
        # Ordinary tables (init's) before the large ones; the job user's large ones before others'.
        assert pids.index(1) < pids.index(pid) < min(pids.index(p) for p in flood)
    finally:
        stop(holder)
        for decoy in decoys:
            stop(decoy)


@needs_root
def test_a_box_that_runs_out_names_the_unread_processes_and_proves_nothing(device, monkeypatch):
    decoys = start_decoys(3, 5000)
    real = processes._table_holds

    def out_of_time_at_the_flood(fd_dir, wanted, deadline):  # the box runs out where the large tables begin
        return None if processes._fd_count(fd_dir) >= processes._HEAVY_FDS else real(fd_dir, wanted, deadline)

    monkeypatch.setattr(processes, "_table_holds", out_of_time_at_the_flood)
    try:
        flood = decoy_pids(decoys)
        found = scan(device)
        assert not found.complete and not set(found.holders) & flood
        assert {pid for pid, _, _ in found.unverified} >= flood
        assert all(fds >= processes._HEAVY_FDS for _, _, fds in found.unverified)  # nobody ordinary
        assert found.scanned == found.total - len(found.unverified)
    finally:
        for decoy in decoys:
            stop(decoy)


@needs_root
def test_the_scan_still_ends_at_its_budget():
    decoys = start_decoys(10, 19000)  # 190000 fds: far more than 50 ms of stat() calls
    try:
        started = time.monotonic()
        found = processes.scan_holders([os.makedev(240, 250)], set(), 0.05)
        assert not found.complete and found.holders == {}
        assert time.monotonic() - started < 5  # the budget plus one listing of a table, not every stat
    finally:
        for decoy in decoys:
            stop(decoy)


STALLING_FUSE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stalling_fuse.py")

# Holds a file of the stalling FUSE server (argv[3]) and the device: PIDFILE gets "<pid> <fd of the file>".
HOLD_STALLED_FILE_AND_DEVICE = r"""
import os, sys, time
node, pidfile, stalled_path = sys.argv[1:4]
stalled = os.open(stalled_path, os.O_RDONLY)  # os.open: no fstat, which would wait for the server itself
device = os.open(node, os.O_RDWR)
with open(pidfile + ".tmp", "w") as handle:
    handle.write(f"{os.getpid()} {stalled}")
os.rename(pidfile + ".tmp", pidfile)
time.sleep(3600)
"""


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def wchan(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/wchan") as handle:
            return handle.read()
    except OSError:
        return ""


@needs_root
def test_an_fd_on_a_stalled_fuse_server_does_not_stall_the_scan(device, tmp_path):
    """Where users may mount FUSE for others (user_allow_other), one fd on a file whose server stopped
    answering must not stall the holder scan, and with it every release on the node: root's stat of such
    a file through /proc waits for the server forever."""
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse on this machine")
    mountpoint, ready = tmp_path / "mnt", tmp_path / "ready"
    mountpoint.mkdir()
    server = subprocess.Popen([sys.executable, "-I", STALLING_FUSE, str(mountpoint), str(ready)])
    holder = probe = None
    try:
        wait_for(lambda: ready.exists() or server.poll() is not None, "the FUSE server to mount")
        assert server.poll() is None, "the stalling FUSE server could not mount (see its message above)"
        holder, announced = start(HOLD_STALLED_FILE_AND_DEVICE, device, str(tmp_path / "pid"), str(mountpoint / "f"))
        pid, stalled_fd = map(int, announced.split())
        # The stall is real: a plain stat of that fd through /proc waits in the FUSE request.
        probe = subprocess.Popen(["stat", "-L", f"/proc/{pid}/fd/{stalled_fd}"], stderr=subprocess.DEVNULL)
        wait_for(lambda: wchan(probe.pid) == "request_wait_answer", "root's stat to wait on the FUSE server")
        scan_code = (
            "import os, sys\nfrom slurm_tpu.access import processes\n"
            "found = processes.scan_holders([os.stat(sys.argv[1]).st_rdev], {os.lstat(sys.argv[1]).st_dev}, 30.0)\n"
            "print(found.complete, *sorted(found.holders))\n"
        )
        # In a child: a scan that waits on the server waits uninterruptibly (once the server has read the
        # request, the kernel waits it out, SIGKILL or not) until the server dies.
        scanner = subprocess.Popen(
            [sys.executable, "-c", scan_code, device], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            out, err = scanner.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()  # the one way to free it
            scanner.communicate()
            pytest.fail("the holder scan waited on the stalled FUSE server")
        assert scanner.returncode == 0, err
        assert out.split() == ["True", str(pid)]  # complete, and the device's holder named
    finally:
        server.kill()  # first: its /dev/fuse closes and the kernel fails every request still waiting
        server.wait()
        for process in (probe, holder):
            if process is not None:
                stop(process)
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)
