"""The emulated USB core (harness/localcluster/usbcore.py) never waits for udev, as the kernel does not.

An epilog holds the node's state lock while it waits for a revoked stick to detach; a
udev hook run for *another* stick of the node waits for that lock. When the emulated
core ran udev hooks in its own loop, the second stick's disconnect waited for the first
stick's udev hook: the epilog gave up after 10 s, kept the lease and drained the node
(first seen at scale: bench/bench_scale.py, a node with two sticks).
"""

from __future__ import annotations

import os

import pytest

from harness.localcluster import scalenodes
from harness.localcluster.cluster import NodeSpec
from helpers import wait_until

pytestmark = pytest.mark.slurm


def _port_disable(cluster, node: str, port: str) -> str:
    device = os.path.join(cluster.node_dir(node), "sys", "bus", "usb", "devices", port)
    return os.path.join(os.path.realpath(os.path.join(device, "port")), "disable")


def test_a_stick_detaches_while_another_sticks_udev_hook_waits_for_the_state_lock(cluster_factory, tmp_path):
    from slurm_tpu.access.ledger import Ledger

    hardware = scalenodes.write_kinds(str(tmp_path), {"mixed4"})["mixed4"]
    cluster = cluster_factory([NodeSpec("n1", hardware)])
    devices = os.path.join(cluster.node_dir("n1"), "sys", "bus", "usb", "devices")
    assert sorted(os.listdir(devices)) == ["1-1.4", "2-1"]
    disables = {port: _port_disable(cluster, "n1", port) for port in ("1-1.4", "2-1")}
    state = os.path.join(cluster.node_dir("n1"), "state")
    os.makedirs(state, exist_ok=True)
    with Ledger(state) as ledger, ledger.locked():  # as an epilog waiting for a stick to detach holds it
        try:
            with open(disables["2-1"], "w") as handle:
                handle.write("1\n")
            wait_until(lambda: not os.path.lexists(os.path.join(devices, "2-1")), 60, "the first stick to detach")
            # Its udev remove hook now waits for the lock; the kernel goes on with the second stick.
            with open(disables["1-1.4"], "w") as handle:
                handle.write("1\n")
            wait_until(
                lambda: not os.path.lexists(os.path.join(devices, "1-1.4")),
                60,
                "the second stick to detach while the first one's udev hook waits",
            )
        finally:
            for disable in disables.values():
                with open(disable, "w") as handle:
                    handle.write("0\n")
    wait_until(lambda: sorted(os.listdir(devices)) == ["1-1.4", "2-1"], 60, "both sticks to come back")
