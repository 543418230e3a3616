"""Attacks on "a device is its job's alone", each played by real users on a real cluster.

n1 has a USB and a PCIe Edge TPU. USB revocation is the epilog power-cycling the
stick's hub port (slurm_tpu/access/revoke.py); here the kernel's side is the
emulated USB core (harness/localcluster/usbcore.py). To show a smuggled fd
*really* dies, the stick's node is pointed at a pseudo-terminal: the emulated
core applies the tty layer's hangup to it, a real kernel revocation after which
every write on any fd of it fails with EIO. The PCIe card cannot be revoked; its
node is pointed at a real driver (/dev/full, /dev/zero) so it can be held open
and mapped, and the epilog must drain the node instead.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from hidden_holders import DECOYS
from support import (
    PCI,
    SMUGGLE,
    USB,
    assert_idle_and_consistent,
    audit,
    clear_lease,
    drain_reason,
    holder_pids,
    inventory,
    kept_in_service,
    leases,
    node_on,
    one_node_two_tpus,
    open_as,
    out,
    owner,
    restore_node,
    resume,
    settle,
    udev_event,
    wait_until,
)

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def cluster():
    yield from one_node_two_tpus()


@pytest.fixture(autouse=True)
def n1_in_service_after(cluster):
    """One failing test must not leave n1 drained: the next ones' jobs would stay PENDING."""
    with kept_in_service(cluster):
        yield


def sys_root(cluster) -> str:
    return os.path.join(cluster.node_dir("n1"), "sys")


def as_user(user: str, argv: list[str], **kwargs) -> subprocess.Popen:
    """A process of ``user`` outside Slurm and outside any job (as from a login shell).

    Started directly as the user (not through runuser, which would stay in
    between), so killing it kills the process that holds what it holds.
    """
    return subprocess.Popen(argv, user=user, group=user, extra_groups=[], cwd="/", **kwargs)


def python_as(user: str, script: str, *args: str, **kwargs) -> subprocess.Popen:
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    kwargs.setdefault("stdout", subprocess.DEVNULL)
    return as_user(user, ["/usr/bin/python3", "-I", "-c", script, *args], **kwargs)


def hold(cluster, user: str, tag: str, gres: str, body: str = "") -> int:
    script = (
        f"#!/bin/sh\n{body}\ntouch {out(cluster, tag)}.started\n"
        f"while [ ! -e {out(cluster, tag)}.stop ]; do sleep 0.1; done\n"
    )
    job = cluster.sbatch(
        ["-w", "n1", f"--gres={gres}", "-o", "/dev/null", "-e", out(cluster, f"{tag}.err")], script, user=user
    )
    wait_until(
        lambda: os.path.exists(out(cluster, f"{tag}.started")) or cluster.job_state(job) == "FAILED",
        180,
        f"job {job} to start",
    )
    assert os.path.exists(out(cluster, f"{tag}.started")), open(out(cluster, f"{tag}.err")).read()
    return job


def stop(cluster, tag: str, job: int) -> str:
    open(out(cluster, f"{tag}.stop"), "w").close()
    return cluster.wait_for_jobs([job], timeout=180)[job]


def usb_on_a_pty(cluster):
    """Make the stick's current node a pseudo-terminal (the one device whose fds can be revoked here)."""
    from harness.localcluster.hardware import usb_sysfs_device

    settle(cluster, "n1")
    master, slave = os.openpty()
    path = os.ttyname(slave)
    os.close(slave)
    device = os.path.join(sys_root(cluster), "bus", "usb", "devices", "2-1.3")
    busnum, devnum = (int(open(os.path.join(device, name)).read()) for name in ("busnum", "devnum"))
    usb_sysfs_device(sys_root(cluster), "2-1.3", busnum, devnum, path)  # the kernel's DEVNAME
    done = udev_event(
        cluster,
        "n1",
        ACTION="add",
        DEVPATH="/devices/emulated-usb/2-1/2-1.3",
        DEVNAME=path,
        SUBSYSTEM="usb",
        DEVTYPE="usb_device",
    )
    assert done.returncode == 0, done.stderr
    assert inventory(cluster, "n1")[USB] == [path] and owner(path) == (0, 0, 0o600)
    return master, path


def probe(cluster, prefix: str, number: int) -> str:
    """Ask an attacker process to write on what it holds; its one-word answer."""
    request = out(cluster, f"{prefix}.probe{number}")
    open(request, "w").close()
    wait_until(lambda: os.path.exists(request + ".result"), 30, f"{prefix} to answer probe {number}")
    return open(request + ".result").read().strip()


# Alice's helper outside Slurm: takes an fd over a Unix socket, then writes on it when asked.
RECEIVER = r"""
import array, errno, os, socket, sys, time
sock_path, prefix = sys.argv[1], sys.argv[2]
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(sock_path)
server.listen(1)
open(prefix + ".ready", "w").close()
conn, _ = server.accept()
_, ancillary, _, _ = conn.recvmsg(1, socket.CMSG_LEN(4))
fd = array.array("i", ancillary[0][2])[0]
open(prefix + ".got", "w").close()
number = 0
while True:
    request = f"{prefix}.probe{number}"
    while not os.path.exists(request):
        time.sleep(0.02)
    try:
        os.write(fd, b"x")
        answer = "OK"
    except OSError as exc:
        answer = errno.errorcode[exc.errno]
    with open(request + ".tmp", "w") as handle:
        handle.write(answer)
    os.rename(request + ".tmp", request + ".result")  # whole, or not there
    number += 1
"""


def test_fd_passed_over_scm_rights_is_dead_before_the_next_job_gets_the_stick(cluster, users):
    master, pty = usb_on_a_pty(cluster)
    prefix, sock = out(cluster, "recv"), out(cluster, "recv.sock")
    receiver = python_as("stpu_alice", RECEIVER, sock, prefix)
    try:
        wait_until(lambda: os.path.exists(prefix + ".ready"), 30, "the receiver to listen")
        job = hold(cluster, "stpu_alice", "smuggle", "tpu:edgetpu_usb:1", SMUGGLE.format(node=pty, sock=sock, mode=""))
        wait_until(lambda: os.path.exists(prefix + ".got"), 30, "the fd to arrive outside Slurm")
        assert probe(cluster, "recv", 0) == "OK"  # a working device fd, held outside any job
        assert stop(cluster, "smuggle", job) == "COMPLETED"
        nxt = hold(cluster, "stpu_bob", "after", "tpu:edgetpu_usb:1")
        try:
            # Bob has the stick now; alice's smuggled fd must be dead, not merely unlisted.
            assert probe(cluster, "recv", 1) == "EIO"
            bobs = inventory(cluster, "n1")[USB][0]
            assert bobs != pty and owner(bobs) == (users["stpu_bob"], 0, 0o600)
            events = [(e["event"], e.get("job_id")) for e in audit(cluster, "n1") if e.get("identity") == USB]
            assert events.index(("revoke", job)) < events.index(("release", job)) < events.index(("acquire", nxt))
        finally:
            assert stop(cluster, "after", nxt) == "COMPLETED"
    finally:
        receiver.kill()
        receiver.wait()
        os.close(master)
    assert_idle_and_consistent(cluster)


# Alice's racer outside Slurm: opens the stick's node again and again, keeping every fd it gets.
RACER = r"""
import errno, os, sys, time
node, prefix = sys.argv[1], sys.argv[2]
held = []
while not os.path.exists(prefix + ".stop"):
    try:
        held.append(os.open(node, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK))
        with open(prefix + ".count.tmp", "w") as handle:
            handle.write(str(len(held)))
        os.rename(prefix + ".count.tmp", prefix + ".count")
    except OSError:
        pass
    time.sleep(0.001)
working = 0
for fd in held:
    try:
        os.write(fd, b"x")
        working += 1
    except OSError:
        pass
with open(prefix + ".tmp", "w") as handle:
    handle.write(f"{len(held)} {working}")
os.rename(prefix + ".tmp", prefix + ".result")  # whole, or not there
"""


def test_fds_opened_in_any_window_are_dead_before_the_next_job_gets_the_stick(cluster, users):
    master, pty = usb_on_a_pty(cluster)
    prefix = out(cluster, "racer")
    racer = python_as("stpu_alice", RACER, pty, prefix)
    try:
        job = hold(cluster, "stpu_alice", "race", "tpu:edgetpu_usb:1")
        # While alice's job owns the stick her racer gets fds; it keeps opening through the epilog.
        wait_until(lambda: os.path.exists(prefix + ".count"), 30, "the racer to get an fd")
        assert stop(cluster, "race", job) == "COMPLETED"
        nxt = hold(cluster, "stpu_bob", "race2", "tpu:edgetpu_usb:1")
        try:
            open(prefix + ".stop", "w").close()
            wait_until(lambda: os.path.exists(prefix + ".result"), 30, "the racer to test its fds")
            opened, working = map(int, open(prefix + ".result").read().split())
            assert opened >= 1 and working == 0, (opened, working)
            assert open_as("stpu_alice", pty) == "EACCES"  # and no new ones since the epilog began
        finally:
            assert stop(cluster, "race2", nxt) == "COMPLETED"
    finally:
        racer.kill()
        racer.wait()
        os.close(master)
    assert_idle_and_consistent(cluster)


def pci_node_on(cluster, device: str) -> tuple[str, int]:
    """Point the PCIe card's node at a real driver's numbers; returns (node, original rdev)."""
    node = inventory(cluster, "n1")[PCI][0]
    return node, node_on(node, device)


# A daemon of the job (double fork, own session) that maps the device and closes its fd.
MAPPER = """/usr/bin/python3 -I -c '
import ctypes, os, sys, time
if os.fork(): sys.exit(0)
os.setsid()
if os.fork(): sys.exit(0)
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
fd = os.open(sys.argv[1], os.O_RDWR)
libc.mmap(None, 4096, 3, 2, fd, 0)
os.close(fd)
open(sys.argv[2], "w").write(str(os.getpid()))
time.sleep(120)
' {node} {pidfile}
while [ ! -s {pidfile} ]; do sleep 0.1; done"""


def test_mapping_with_its_fd_closed_is_found_and_the_health_check_restores_idle(cluster, users):
    from slurm_tpu.config import load_config
    from slurm_tpu.ops.health_check import clear_kept_leases

    node, rdev = pci_node_on(cluster, "/dev/zero")  # mappable, and the mapping keeps the device file
    pidfile = out(cluster, "mapper.pid")
    job = cluster.sbatch(
        ["-w", "n1", "--gres=tpu:edgetpu_pci:1", "-o", "/dev/null", "-e", "/dev/null"],
        "#!/bin/sh\n" + MAPPER.format(node=node, pidfile=pidfile) + "\n",
        user="stpu_alice",
    )
    mapper = None
    try:
        cluster.wait_for_jobs([job], timeout=180)
        mapper = int(open(pidfile).read())
        assert not [
            fd
            for fd in os.listdir(f"/proc/{mapper}/fd")
            if os.stat(f"/proc/{mapper}/fd/{fd}").st_rdev == os.stat(node).st_rdev
        ]  # no fd left: only the mapping
        wait_until(lambda: "DRAIN" in cluster.node_states()["n1"], 120, "the epilog to drain n1")
        reason = drain_reason(cluster)
        assert reason.startswith("slurm-tpu:") and mapper in holder_pids(reason) and "mmap" in reason, reason
        assert owner(node) == (0, 0, 0o600)
    finally:
        if mapper:
            os.kill(mapper, 9)
    wait_until(lambda: not os.path.exists(f"/proc/{mapper}"), 30, "the mapper to die")
    # The admin resumes; the health check ends the kept lease and the card is idle at once
    # (once no process maps /dev/zero's numbers: a test run beside this one may, for a while).
    wait_until(
        lambda: clear_kept_leases(load_config(cluster.node_config("n1"))) == [(PCI, "cleared")],
        180,
        "the health check to clear the kept lease",
    )
    assert leases(cluster, "n1") == [] and owner(node) == (0, 0, 0o600)
    resume(cluster)
    restore_node(node, rdev)
    assert_idle_and_consistent(cluster)


def set_scan_budget(cluster, seconds: float | None) -> None:
    import yaml

    path = cluster.node_config("n1")
    with open(path, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    devices = config.setdefault("devices", {})
    if seconds is None:
        devices.pop("holder_scan_seconds", None)
    else:
        devices["holder_scan_seconds"] = seconds
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle)


def test_a_flood_of_decoy_fds_neither_stretches_the_epilog_nor_drains_the_node(cluster, users):
    # PCIe: the apex driver counts the writers itself; a scan the flood cut short leaves
    # only read-only holders unseen (the residual docs/security.md names), so the card goes back.
    node = inventory(cluster, "n1")[PCI][0]
    set_scan_budget(cluster, 0.05)
    decoys = [
        python_as("stpu_alice", DECOYS, "1000000", stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(10)
    ]
    try:
        for decoy in decoys:
            assert decoy.stdout.readline().strip() == "ready"  # ~20000 fds each: far more than 50 ms of stats
        job = cluster.sbatch(
            ["-w", "n1", "--gres=tpu:edgetpu_pci:1", "-o", "/dev/null"], "#!/bin/sh\ntrue\n", user="stpu_alice"
        )
        cluster.wait_for_jobs([job], timeout=180)
        wait_until(
            lambda: any(e["event"] == "release" and e["job_id"] == job for e in audit(cluster, "n1")),
            120,
            "the epilog to release the card",
        )
        assert any(e["event"] == "scan-incomplete" and e["job_id"] == job for e in audit(cluster, "n1"))
        wait_until(lambda: "COMPLETING" not in cluster.node_states()["n1"], 120, "the epilog to end")
        assert "DRAIN" not in cluster.node_states()["n1"], drain_reason(cluster)
        assert owner(node) == (0, 0, 0o600) and leases(cluster, "n1") == []
    finally:
        for decoy in decoys:
            decoy.kill()
            decoy.wait()
        set_scan_budget(cluster, None)
    assert_idle_and_consistent(cluster)


# Alice's process that accepts a connection but never reads it: the fd sent stays in flight.
NEVER_READS = r"""
import os, socket, sys, time
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(sys.argv[1])
server.listen(1)
open(sys.argv[2], "w").close()
conn, _ = server.accept()
time.sleep(120)
"""


def test_pci_fd_in_flight_is_caught_by_the_drivers_count_of_writers(cluster, users):
    # The card's node is the emulated apex driver's pty (harness/localcluster/apex.py): its
    # write_open_count follows the node's real open files, as gasket_open()/gasket_release() do.
    node = inventory(cluster, "n1")[PCI][0]
    sock, ready = out(cluster, "inflight.sock"), out(cluster, "inflight.ready")
    sink = python_as("stpu_alice", NEVER_READS, sock, ready)
    count = os.path.join(sys_root(cluster), "class", "apex", os.path.basename(node), "write_open_count")
    try:
        wait_until(lambda: os.path.exists(ready), 30, "the sink to listen")
        assert open(count).read() == "0\n"
        job = hold(
            cluster, "stpu_alice", "inflight", "tpu:edgetpu_pci:1", SMUGGLE.format(node=node, sock=sock, mode="")
        )
        assert stop(cluster, "inflight", job) == "COMPLETED"
        wait_until(lambda: "DRAIN" in cluster.node_states()["n1"], 120, "the epilog to drain n1")
        reason = drain_reason(cluster)
        assert reason.startswith("slurm-tpu:") and "1 writable fd(s)" in reason and PCI in reason
        assert f"after job {job}" in reason, reason
        assert owner(node) == (0, 0, 0o600)
        assert open(count).read() == "1\n"  # still in the sink's socket queue: no process shows it
    finally:
        sink.kill()
        sink.wait()
    assert open(count).read() == "0\n"  # its last reference went with the sink's socket
    cleared = clear_lease(cluster, PCI)
    assert cleared.returncode == 0 and "cleared" in cleared.stdout, cleared.stderr
    resume(cluster)
    assert_idle_and_consistent(cluster)


def test_a_user_process_titled_slurmstepd_does_not_keep_a_stale_lease_alive(cluster, users):
    from slurm_tpu.access.ledger import Lease, Ledger

    node = inventory(cluster, "n1")[PCI][0]
    with Ledger(os.path.join(cluster.node_dir("n1"), "state")) as ledger:  # job 63 died with its node
        assert ledger.claim(
            Lease(identity=PCI, job_id=63, uid=users["stpu_alice"], prolog_pid=1, prolog_start=1, device_nodes=(node,))
        )
    os.chown(node, users["stpu_alice"], -1)
    forged = as_user("stpu_alice", ["bash", "-c", "exec -a 'slurmstepd: [63.batch]' sleep 120"])
    try:
        wait_until(
            lambda: open(f"/proc/{forged.pid}/cmdline", "rb").read().startswith(b"slurmstepd: [63."),
            30,
            "the forged title",
        )
        row = {r["identity"]: r for r in leases(cluster, "n1")}[PCI]
        assert row["state"].startswith("stale")
        job = hold(cluster, "stpu_bob", "forged", "tpu:edgetpu_pci:1")
        assert owner(node) == (users["stpu_bob"], 0, 0o600)
        assert stop(cluster, "forged", job) == "COMPLETED"
    finally:
        forged.kill()
        forged.wait()
    assert any(e["event"] == "reclaim" and e["job_id"] == 63 for e in audit(cluster, "n1"))
    assert_idle_and_consistent(cluster)
