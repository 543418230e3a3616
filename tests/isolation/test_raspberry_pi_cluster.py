"""Per-job isolation on simulated Raspberry Pi nodes in a real local Slurm cluster.

One cluster for the module, the project's hooks: ``pi4`` is tests/hardware/pi4_coral_usb.umockdev
(two flashed Coral sticks, ``usb-2-1`` on a blue USB 3 port and ``usb-1-1.3`` on a black USB 2 port
behind the VL805's hub), ``pi5`` is tests/hardware/pi5_hailo8l.umockdev (a Hailo-8L at PCIe
0001:01:00.0 and a stick on RP1). Alice's ``--gres=tpu:1`` job gets exactly one stick while Bob's job
runs beside her on the same Pi with the other; each job's own process tries the node the test names
(its own, or the other job's); when Alice's job ends her stick's port is power-cycled and the
re-enumerated stick is idle again. On the Pi 5 a ``--gres=npu:1`` job gets the Hailo.

The arm64 CI leg runs this under qemu-user: few jobs, every wait on a file or a state, long
timeouts and no timing assertion.
"""

from __future__ import annotations

import os

import pytest
from support import (
    finish_cluster,
    inventory,
    leases,
    make_cluster,
    open_as,
    owner,
    require_root_and_slurm,
    wait_until,
)

from helpers import HARDWARE

pytestmark = pytest.mark.slurm

STICKS = {"usb-2-1": "usb:/sys/bus/usb/devices/2-1", "usb-1-1.3": "usb:/sys/bus/usb/devices/1-1.3"}
HAILO, HAILO_ADDRESS = "pci-0001:01:00.0", "0001:01:00.0"
WAIT_S = 240  # qemu-user runs every daemon and hook 5-10x slower: generous, never a measurement


@pytest.fixture(scope="module")
def cluster():
    require_root_and_slurm()
    from harness.localcluster.cluster import NodeSpec

    nodes = [
        NodeSpec("pi4", str(HARDWARE / "pi4_coral_usb.umockdev")),
        NodeSpec("pi5", str(HARDWARE / "pi5_hailo8l.umockdev")),
    ]
    started = make_cluster(nodes)
    yield started
    finish_cluster(started)


# A job: what the task prolog gave it, then (once the test names a node in {tag}.target) whether its
# own process can open that node, then it holds its devices until the test says stop.
JOB = """#!/bin/sh
echo "${{SLURM_TPU_DEVICES-unset}}" > {out}/{tag}.devices
echo "${{SLURM_TPU_EDGETPU_PATHS-unset}}" > {out}/{tag}.paths
echo "${{EDGETPU_VISIBLE_DEVICES-unset}}" > {out}/{tag}.visible
echo "${{SLURM_TPU_HAILO_DEVICES-unset}}" > {out}/{tag}.hailo
touch {out}/{tag}.started
while [ ! -s {out}/{tag}.target ] && [ ! -e {out}/{tag}.stop ]; do sleep 0.1; done
[ -s {out}/{tag}.target ] && /usr/bin/python3 -I -c '
import errno, os, sys
try:
    os.close(os.open(sys.argv[1], os.O_RDWR | os.O_NONBLOCK)); print("OPENED")
except OSError as exc:
    print(errno.errorcode.get(exc.errno, exc.errno))
' "$(cat {out}/{tag}.target)" > {out}/{tag}.probe
while [ ! -e {out}/{tag}.stop ]; do sleep 0.1; done
"""


class Job:
    """A job of ``user`` on ``node`` holding ``gres`` until :meth:`finish`."""

    def __init__(self, cluster, user: str, node: str, tag: str, gres: str):
        self.cluster, self.tag = cluster, tag
        self.out = os.path.join(cluster.base, "out")
        script = JOB.format(out=self.out, tag=tag)
        self.id = cluster.sbatch(
            ["-w", node, f"--gres={gres}", "-o", "/dev/null", "-e", self.path("err")], script, user=user
        )
        wait_until(
            lambda: (
                os.path.exists(self.path("started"))
                or cluster.job_state(self.id) not in ("PENDING", "CONFIGURING", "RUNNING", "")
            ),
            WAIT_S,
            f"job {self.id} ({tag}) to start",
        )
        assert os.path.exists(self.path("started")), self.read("err")

    def path(self, what: str) -> str:
        return os.path.join(self.out, f"{self.tag}.{what}")

    def read(self, what: str) -> str:
        try:
            with open(self.path(what), encoding="utf-8") as handle:
                return handle.read().strip()
        except FileNotFoundError:
            return ""

    def probe(self, node: str) -> str:
        """Have the job's own process open ``node``: OPENED, EACCES, ENXIO..."""
        with open(self.path("target.tmp"), "w", encoding="utf-8") as handle:
            handle.write(node)
        os.rename(self.path("target.tmp"), self.path("target"))  # the job never reads half a path
        return wait_until(lambda: self.read("probe"), WAIT_S, f"job {self.id} ({self.tag}) to probe {node}")

    def finish(self) -> str:
        open(self.path("stop"), "w").close()
        return self.cluster.wait_for_jobs([self.id], timeout=WAIT_S)[self.id]


def test_pi4_job_gets_one_stick_and_another_users_job_cannot_open_it(cluster, users):
    alice, bob = users["stpu_alice"], users["stpu_bob"]
    before = inventory(cluster, "pi4")
    assert sorted(before) == sorted(STICKS)
    job_a = Job(cluster, "stpu_alice", "pi4", "a", "tpu:1")
    try:
        mine = job_a.read("devices")
        assert mine in STICKS  # exactly one of the Pi's two sticks
        assert job_a.read("paths") == STICKS[mine] and job_a.read("visible") == STICKS[mine].removeprefix("usb:")
        node_a = before[mine][0]
        assert owner(node_a) == (alice, 0, 0o600)
        [other] = [identity for identity in STICKS if identity != mine]
        assert owner(before[other][0]) == (0, 0, 0o600)  # the other stick stays idle
        held = {row["identity"]: row for row in leases(cluster, "pi4", settled=False)}
        assert set(held) == {mine} and held[mine]["job_id"] == job_a.id and held[mine]["uid"] == alice
        # Her own process gets past the kernel's permission check (ENXIO: no driver behind the node).
        assert job_a.probe(node_a) == "ENXIO"
        assert open_as("stpu_bob", node_a) == "EACCES"  # Bob outside any job
        job_b = Job(cluster, "stpu_bob", "pi4", "b", "tpu:1")  # Bob's job, at the same time, same Pi
        try:
            assert job_b.read("devices") == other and job_b.read("paths") == STICKS[other]
            assert owner(before[other][0]) == (bob, 0, 0o600)
            assert job_b.probe(node_a) == "EACCES"  # Alice's stick, from inside Bob's job
        finally:
            assert job_b.finish() == "COMPLETED"
    finally:
        state = job_a.finish()
    assert state == "COMPLETED"
    assert leases(cluster, "pi4") == []  # waits for both revoked sticks to come back
    assert not os.path.lexists(node_a)  # revoked: that usb_device and its node are gone
    after = inventory(cluster, "pi4")
    assert sorted(after) == sorted(STICKS)  # back at the same ports
    assert after[mine] != before[mine]  # ...re-enumerated, with a new node
    assert owner(after[mine][0]) == (0, 0, 0o600)
    assert open_as("stpu_alice", after[mine][0]) == "EACCES"


def test_pi5_job_gets_the_hailo_card_and_only_its_owner_can_open_it(cluster, users):
    card = inventory(cluster, "pi5")[HAILO][0]
    job = Job(cluster, "stpu_bob", "pi5", "h", "npu:1")
    try:
        assert job.read("hailo") == HAILO_ADDRESS  # HailoRT's device id: the PCI address
        assert job.read("devices") == ""  # no Edge TPU for this job, though the Pi 5 has one
        assert owner(card) == (users["stpu_bob"], 0, 0o600)
        assert job.probe(card) == "ENXIO"
        assert open_as("stpu_alice", card) == "EACCES"
    finally:
        assert job.finish() == "COMPLETED"
    wait_until(lambda: leases(cluster, "pi5") == [], WAIT_S, "the Hailo's lease to end")
    assert owner(card) == (0, 0, 0o600)
    assert open_as("stpu_bob", card) == "EACCES"
