"""The emulated apex driver (harness/localcluster/apex.py) counts what gasket counts.

gasket_core.c gasket_open()/gasket_release(): a file of /dev/apex_N is counted
from its open until its *last reference* goes (dup, fork, SCM_RIGHTS in flight),
and sysfs ``write_open_count`` says so whenever it is read. The emulation (a pty
slave for the node, a FUSE attribute that polls the master at read time) must
show the same, read right after the event: no test here waits between the two.
"""

from __future__ import annotations

import array
import os
import signal
import socket
import stat
import subprocess
import sys

import pytest

from harness import module_command
from helpers import wait_until

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/dev/fuse"), reason="needs root and /dev/fuse (mount)"
)


def mounts_under(path: str) -> list[str]:
    with open("/proc/self/mounts", encoding="utf-8") as handle:
        return [line.split()[1] for line in handle if line.split()[1].startswith(str(path) + "/")]


@pytest.fixture()
def driver(tmp_path):
    """Two emulated cards (nodes apex_0, apex_1) and their sysfs; the driver stopped and checked after."""
    nodes = []
    for number in range(2):
        node = tmp_path / "dev" / f"apex_{number}"
        node.parent.mkdir(exist_ok=True)
        os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(240, number))
        nodes.append(str(node))
    sys_root = tmp_path / "sys"
    process = subprocess.Popen(
        module_command(sys.executable, "harness.localcluster.apex", str(sys_root), *nodes),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(
            lambda: os.path.ismount(sys_root / "class" / "apex") or process.poll() is not None,
            30,
            "the emulated driver to mount",
        )
        assert process.poll() is None, "the emulated driver exited"

        def count(number: int = 0) -> str:
            with open(sys_root / "class" / "apex" / f"apex_{number}" / "write_open_count", encoding="ascii") as handle:
                return handle.read()

        yield nodes, count, process
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(timeout=30)
        leftovers = mounts_under(tmp_path)
        for point in leftovers:
            subprocess.run(["umount", "--lazy", point], check=False)
    assert not leftovers, f"the driver left mounts behind: {leftovers}"
    for number, node in enumerate(nodes):  # the placeholder shows again
        assert os.lstat(node).st_rdev == os.makedev(240, number)


def test_the_node_is_an_idle_card_with_its_class_attribute(driver):
    nodes, count, _ = driver
    info = os.lstat(nodes[0])
    assert stat.S_ISCHR(info.st_mode) and (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o600)
    assert os.listdir(os.path.join(os.path.dirname(os.path.dirname(nodes[0])), "sys", "class", "apex")) == [
        "apex_0",
        "apex_1",
    ]
    assert count(0) == "0\n" and count(1) == "0\n"


def test_an_open_is_counted_until_its_close(driver):
    nodes, count, _ = driver
    fd = os.open(nodes[0], os.O_RDWR | os.O_NOCTTY)
    assert count(0) == "1\n" and count(1) == "0\n"
    os.close(fd)
    assert count(0) == "0\n"  # right after close() returned
    reader = os.open(nodes[0], os.O_RDONLY | os.O_NOCTTY)  # stricter than gasket: readers count too
    assert count(0) == "1\n"
    os.close(reader)
    assert count(0) == "0\n"


def test_a_dup_and_a_fork_share_the_open_file(driver):
    nodes, count, _ = driver
    fd = os.open(nodes[0], os.O_RDWR | os.O_NOCTTY)
    copy = os.dup(fd)
    os.close(fd)
    assert count(0) == "1\n"
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # keeps the inherited file until the parent closes the pipe
        os.close(write_end)
        os.read(read_end, 1)
        os._exit(0)
    os.close(read_end)
    os.close(copy)
    assert count(0) == "1\n"  # the child's reference keeps the file open
    os.close(write_end)
    os.waitpid(child, 0)
    assert count(0) == "0\n"


def test_an_fd_in_flight_over_scm_rights_is_counted_until_the_socket_drops_it(driver):
    nodes, count, _ = driver
    sender, receiver = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(nodes[0], os.O_RDWR | os.O_NOCTTY)
    sender.sendmsg([b"f"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
    os.close(fd)
    sender.close()
    assert count(0) == "1\n"  # no process has it in its fd table; the socket's queue does
    receiver.close()
    assert count(0) == "0\n"


def test_what_is_written_to_the_card_is_drained(driver):
    nodes, count, _ = driver
    fd = os.open(nodes[0], os.O_WRONLY | os.O_NOCTTY)
    previous = signal.signal(signal.SIGALRM, signal.default_int_handler)
    signal.alarm(120)  # a write blocked on a full pty buffer fails the test instead of hanging it
    try:
        for _ in range(256):  # 4 MiB, far over any pty buffer
            assert os.write(fd, b"x" * 16384) > 0
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        os.close(fd)
    assert count(0) == "0\n"


def test_a_value_is_made_at_the_first_read_of_an_open_attribute_file(driver):
    nodes, _, _ = driver
    path = os.path.join(
        os.path.dirname(os.path.dirname(nodes[0])), "sys", "class", "apex", "apex_0", "write_open_count"
    )
    with open(path, "rb", buffering=0) as handle:
        assert handle.read(1) == b"0"
        fd = os.open(nodes[0], os.O_RDWR | os.O_NOCTTY)
        try:
            assert handle.read(10) == b"\n"  # the same text, as sysfs keeps it for the open file
            handle.seek(0)
            assert handle.read(10) == b"1\n"  # a read from offset 0 makes it anew
        finally:
            os.close(fd)


def test_a_killed_driver_leaves_mounts_that_the_cluster_stop_detaches(driver, tmp_path):
    from harness.localcluster.cluster import LocalCluster

    nodes, _, process = driver
    process.kill()
    process.wait()
    assert mounts_under(tmp_path)
    LocalCluster(base=str(tmp_path), nodes=[])._unmount_leftovers()
    assert mounts_under(tmp_path) == []
