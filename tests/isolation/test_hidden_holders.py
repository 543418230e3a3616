"""Holders hidden from a look at /proc/PID alone, and floods of open files, played by real users on a real cluster.

n1 has a USB and a PCIe Edge TPU (one_node_two_tpus). The PCIe card cannot be
revoked: its node is pointed at a real driver (/dev/full, /dev/zero) so a job's
leftover process can hold it open or map it, and the epilog must find that
process wherever it hides the device: a thread's private fd table (issue 19,
item 1a), a thread under a zombie thread-group leader (1b), an fd among twenty
thousand decoys in a node holding a million (item 3). A million unrelated fds
must not take the node out of service; an unverifiable scan of a scan-only
device (the USB stick with revocation off, as a GPU or a Hailo card) keeps that
device back, not the node.
"""

from __future__ import annotations

import contextlib
import os
import subprocess

import pytest
from hidden_holders import AMONG_DECOYS, DECOYS, PRIVATE_FD_TABLE, ZOMBIE_LEADER
from support import (
    PCI,
    USB,
    assert_idle_and_consistent,
    audit,
    clear_lease,
    drain_reason,
    inventory,
    leases,
    node_on,
    one_node_two_tpus,
    out,
    owner,
    restore_node,
    resume,
    wait_until,
)

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def cluster():
    yield from one_node_two_tpus()


@contextlib.contextmanager
def card_on(cluster, device: str = "/dev/net/tun"):
    """Point the card's node at a real driver's numbers for the test (yields the node).

    The tun driver by default: any user may open it (tun_chr_open checks nothing;
    only its ioctls need privileges) and no other process here holds it, so a
    holder the epilog names is this test's (other test clusters point their cards
    at /dev/full and /dev/zero). A mapping needs /dev/zero.
    """
    node = inventory(cluster, "n1")[PCI][0]
    rdev = node_on(node, device)
    try:
        yield node
    finally:
        restore_node(node, rdev)


def job_leaving(cluster, user: str, gres: str, script: str, node: str, tag: str, *options: str) -> tuple[int, str]:
    """A job whose daemon (a hidden_holders program, detached) outlives it; returns (job, what it announced)."""
    pidfile = out(cluster, f"{tag}.pid")
    argv = " ".join([node, pidfile, "detach", *options])
    body = f"#!/bin/sh\n/usr/bin/python3 -I -c '{script}' {argv}\nwhile [ ! -s {pidfile} ]; do sleep 0.1; done\n"
    job = cluster.sbatch(
        ["-w", "n1", f"--gres={gres}", "-o", "/dev/null", "-e", out(cluster, f"{tag}.err")], body, user=user
    )
    states = cluster.wait_for_jobs([job], timeout=120)
    assert os.path.exists(pidfile), (states, open(out(cluster, f"{tag}.err")).read())
    return job, open(pidfile).read()


def settled(cluster) -> str:
    """n1's state once no epilog runs there any more (Slurm keeps it COMPLETING until the epilog ends)."""
    wait_until(lambda: "COMPLETING" not in cluster.node_states()["n1"], 120, "n1's epilog to end")
    return cluster.node_states()["n1"]


def names(reason: str, pid: int, how: str) -> bool:
    """Whether the drain reason names ``pid`` as a holder of the card by ``how``.

    Other processes of this machine (other test clusters) may hold the same real
    driver's numbers at the same time: the reason may name them too.
    """
    import re

    match = re.search(rf"pid ([0-9,]+) still holds {re.escape(PCI)} \(([a-z/]+)\)", reason)
    return bool(match) and str(pid) in match.group(1).split(",") and how in match.group(2).split("/")


def kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 30, f"pid {pid} to die")


def back_in_service(cluster, identity: str) -> None:
    """The admin's way back after a drain: clear the kept lease, resume the node."""
    cleared = clear_lease(cluster, identity)
    assert cleared.returncode == 0 and "cleared" in cleared.stdout, cleared.stdout + cleared.stderr
    resume(cluster)


def test_a_thread_with_a_private_fd_table_keeps_the_device_and_is_named(cluster, users):
    with card_on(cluster) as node:
        private_fd_table_is_named(cluster, users, node)
        back_in_service(cluster, PCI)
    assert_idle_and_consistent(cluster)


def private_fd_table_is_named(cluster, users, node: str) -> None:
    pid = None
    try:
        job, announced = job_leaving(cluster, "stpu_alice", "tpu:edgetpu_pci:1", PRIVATE_FD_TABLE, node, "private")
        pid, keeper = map(int, announced.split())
        assert os.stat(f"/proc/{pid}").st_uid == users["stpu_alice"]
        wait_until(lambda: "DRAIN" in cluster.node_states()["n1"], 60, "the epilog to drain n1")
        reason = drain_reason(cluster)
        assert reason.startswith("slurm-tpu:") and names(reason, pid, "fd"), reason
        assert owner(node) == (0, 0, 0o600)
        assert {r["identity"]: r["phase"] for r in leases(cluster, "n1")} == {PCI: "kept"}
    finally:
        if pid:
            kill(pid)


@pytest.mark.parametrize("how", ["mmap", "fd"])
def test_a_thread_under_a_zombie_leader_keeps_the_device_and_is_named(cluster, users, how):
    # /dev/zero for the mapping: mappable, and the mapping keeps the device file.
    with card_on(cluster, "/dev/zero" if how == "mmap" else "/dev/net/tun") as node:
        zombie_leader_is_named(cluster, node, how)
        back_in_service(cluster, PCI)
    assert_idle_and_consistent(cluster)


def zombie_leader_is_named(cluster, node: str, how: str) -> None:
    pid = None
    try:
        job, announced = job_leaving(
            cluster,
            "stpu_alice",
            "tpu:edgetpu_pci:1",
            ZOMBIE_LEADER,
            node,
            f"zombie-{how}",
            *(["fd"] if how == "fd" else []),
        )
        pid = int(announced)
        assert "Z (zombie)" in open(f"/proc/{pid}/status").read()
        wait_until(lambda: "DRAIN" in cluster.node_states()["n1"], 60, "the epilog to drain n1")
        reason = drain_reason(cluster)
        assert reason.startswith("slurm-tpu:") and names(reason, pid, how), reason
        assert owner(node) == (0, 0, 0o600)
    finally:
        if pid:
            kill(pid)


def start_flood(user: str, processes: int, fds_each: int = 20000) -> list[subprocess.Popen]:
    """``user``'s processes outside Slurm, each holding as many fds as its hard limit allows."""
    flood = [
        subprocess.Popen(
            ["/usr/bin/python3", "-I", "-c", DECOYS, str(fds_each)],
            user=user,
            group=user,
            extra_groups=[],
            cwd="/",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    for decoy in flood:
        assert decoy.stdout.readline().strip() == "ready"
    return flood


def stop_flood(flood: list[subprocess.Popen]) -> None:
    for decoy in flood:
        decoy.kill()
        decoy.wait()


def open_fds() -> int:
    total = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                total += os.stat(f"/proc/{name}/fd").st_size  # the fd count (Linux >= 6.2)
            except OSError:
                pass
    return total


def test_a_million_decoy_fds_of_another_user_leave_the_node_in_service_and_a_holder_named(cluster, users):
    with card_on(cluster) as node:
        million_decoys(cluster, node)
        back_in_service(cluster, PCI)
    assert_idle_and_consistent(cluster)


def million_decoys(cluster, node: str) -> None:
    flood = start_flood("stpu_bob", 51)  # bob, no job of his anywhere (any local user): 51 x 19936 fds
    pid = None
    try:
        assert open_fds() >= 1_000_000
        # A job that leaves nothing: its epilog reads every table in the flood, the node stays in service.
        job = cluster.sbatch(
            ["-w", "n1", "--gres=tpu:edgetpu_pci:1", "-o", "/dev/null"], "#!/bin/sh\ntrue\n", user="stpu_alice"
        )
        assert cluster.wait_for_jobs([job], timeout=120)[job] == "COMPLETED"
        assert settled(cluster) == "IDLE", drain_reason(cluster)
        assert leases(cluster, "n1") == [] and owner(node) == (0, 0, 0o600)
        assert any(e["event"] == "release" and e["job_id"] == job for e in audit(cluster, "n1"))
        # Alice hides her fd of the card among 19000 decoys of her own, in the same flood: named.
        job, announced = job_leaving(cluster, "stpu_alice", "tpu:edgetpu_pci:1", AMONG_DECOYS, node, "among")
        pid = int(announced)
        assert os.stat(f"/proc/{pid}/fd").st_size > 19000
        wait_until(lambda: "DRAIN" in cluster.node_states()["n1"], 60, "the epilog to drain n1")
        reason = drain_reason(cluster)
        assert reason.startswith("slurm-tpu:") and names(reason, pid, "fd"), reason
    finally:
        stop_flood(flood)
        if pid:
            kill(pid)


def set_devices(cluster, **values) -> None:
    """Set (a value) or reset (None) keys of n1's ``devices:`` config section."""
    import yaml

    path = cluster.node_config("n1")
    with open(path, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    devices = config.setdefault("devices", {})
    for key, value in values.items():
        if value is None:
            devices.pop(key, None)
        else:
            devices[key] = value
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle)


def test_an_unverifiable_scan_keeps_the_device_back_not_the_node(cluster, users):
    # The stick without revocation has only the scan, as a GPU or a Hailo card; a box of
    # 50 ms stands for a flood larger than any box (any user can open more fds than it reads).
    stick = inventory(cluster, "n1")[USB][0]
    set_devices(cluster, revoke=False, holder_scan_seconds=0.05)
    flood = start_flood("stpu_bob", 10)
    try:
        job = cluster.sbatch(
            ["-w", "n1", "--gres=tpu:edgetpu_usb:1", "-o", "/dev/null"], "#!/bin/sh\ntrue\n", user="stpu_alice"
        )
        assert cluster.wait_for_jobs([job], timeout=120)[job] == "COMPLETED"
        assert settled(cluster) == "IDLE", drain_reason(cluster)  # bob did not take n1 out of service
        assert {r["identity"]: r["phase"] for r in leases(cluster, "n1")} == {USB: "kept"}
        assert owner(stick) == (0, 0, 0o600)  # nobody gets a stick that may still be held
        record = [e for e in audit(cluster, "n1") if e["event"] == "scan-incomplete" and e["job_id"] == job][-1]
        assert f"uid {users['stpu_bob']}" in record["unverified"]
    finally:
        stop_flood(flood)
        set_devices(cluster, holder_scan_seconds=None)
    # The flood is gone: the next job given the stick scans again, completely, and gets it.
    job = cluster.sbatch(
        ["-w", "n1", "--gres=tpu:edgetpu_usb:1", "-o", "/dev/null"], "#!/bin/sh\ntrue\n", user="stpu_bob"
    )
    try:
        assert cluster.wait_for_jobs([job], timeout=120)[job] == "COMPLETED"
        assert any(
            e["event"] == "acquire" and e["job_id"] == job and e["identity"] == USB for e in audit(cluster, "n1")
        )
        assert settled(cluster) == "IDLE", drain_reason(cluster)
    finally:
        set_devices(cluster, revoke=None)
    assert_idle_and_consistent(cluster)
