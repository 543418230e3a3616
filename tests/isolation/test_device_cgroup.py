"""Slurm's device cgroup (ConstrainDevices=yes) as a second layer, on a real cluster with real users.

What slurm_tpu/slurm/device_cgroup.py states, measured: the Edge TPUs' nodes are
made world-accessible (0666) here, so a refusal can only come from the device
cgroup, never from the file's mode; the same user opens the same node from a
plain shell to show it. The cluster runs no slurm-tpu hooks: this tests Slurm's
layer alone.

* Slurm >= 23.02 (the 25.11 leg, SLURM_TPU_TEST_SLURM=/opt/slurm-25.11): a job
  without the GRES, or with another TPU, gets EPERM on the PCIe card; the job
  allocated the card opens it. A USB stick that re-enumerated (new node, slot
  re-pointed as the udev hook does) is no longer covered until slurmd restarts.
* Slurm 22.05 without our gres/tpu plugin: the same job without the GRES opens
  the card (the layer does nothing for ``tpu``: gres_g_get_devices() skips a GRES
  without a plugin). With the plugin (slurm_plugin/, the cluster's PluginDir) the
  plugin hands slurmd the devices and 22.05 refuses as 25.11 does.

Each release runs twice: with the plugin (when one is built for it) and without.

The cgroup config is this module's cluster's alone (LocalCluster.cgroup_conf):
the other cluster tests keep task/none.
"""

from __future__ import annotations

import os
import stat

import pytest
from support import HARDWARE, PCI, USB, finish_cluster, make_cluster, open_as, out, require_root_and_slurm

from slurm_tpu.slurm import device_cgroup

CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_CONF = ("CgroupPlugin=cgroup/v1", "ConstrainDevices=yes", f"CgroupMountpoint={CGROUP_ROOT}")

PROBE = """import errno, os, sys
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY))
        print(path, "OPENED")
    except OSError as exc:
        print(path, errno.errorcode.get(exc.errno, exc.errno))
for line in open("/proc/self/cgroup"):
    if ":devices:" in line:
        print("cgroup", line.strip())
"""


def cgroup_v1_devices_problem() -> str | None:
    """Why this machine cannot run Slurm's cgroup/v1 device controller, else None."""
    if not os.path.isdir(os.path.join(CGROUP_ROOT, "devices")):
        with open("/proc/self/mounts", encoding="utf-8") as handle:
            kinds = sorted({line.split()[2] for line in handle if line.split()[1].startswith(CGROUP_ROOT)})
        return (
            f"no cgroup v1 devices controller at {CGROUP_ROOT}/devices (mounted there: {', '.join(kinds)}); "
            "cgroup/v1 cannot constrain devices and cgroup/v2 is not tested here"
        )
    return None


@pytest.fixture(scope="module", params=[True, False], ids=["gres-plugin", "no-gres-plugin"])
def cluster(users, request):
    require_root_and_slurm()
    problem = cgroup_v1_devices_problem()
    if problem:
        pytest.skip(problem)
    from harness.localcluster.cluster import Hooks, LocalCluster, NodeSpec

    if request.param and not LocalCluster(base="/nonexistent", nodes=[]).gres_plugin_dir:
        pytest.skip("no gres/tpu plugin built for this Slurm (scripts/build-gres-plugin.sh)")
    started = make_cluster(
        [NodeSpec("n1", os.path.join(HARDWARE, "n1_two_tpus.umockdev"))],
        hooks=Hooks(),
        cgroup_conf=CGROUP_CONF,
        gres_plugin=request.param,
    )
    try:
        # The PCIe card's node is the emulated apex driver's pty, bind-mounted once the cluster
        # started: point its slot at it (what `slurm-tpu gres-conf`/`boot` do on a real node before
        # slurmd starts), then restart slurmd, which reads every File='s numbers when it starts.
        regenerate_slots(started)
        restart_slurmd(started)
        yield started
    finally:
        finish_cluster(started)
    # The cluster's stop() removed the cgroups slurmd made for n1.
    import glob

    assert glob.glob(os.path.join(CGROUP_ROOT, "*", "slurm_n1")) == []


def regenerate_slots(cluster) -> None:
    inventory = os.path.join(cluster.node_dir("n1"), "inventory.json")
    cluster._run(
        [*cluster.slurm_tpu, "gres-conf", "--inventory", inventory, "--node", "n1", "--output", cluster.gres_conf],
        env={**cluster.env(), "SLURM_TPU_CONFIG": cluster.node_config("n1")},
    )


def restart_slurmd(cluster) -> None:
    cluster.stop_slurmd("n1")
    cluster.start_slurmd("n1")
    cluster._wait(cluster._all_nodes_up, 90, "n1 did not come back")


def covered(cluster) -> bool:
    """Whether the device cgroup covers tpu here: Slurm >= 23.02, or our gres/tpu plugin loaded."""
    return device_cgroup.covers_gres_without_plugin(slurmd_version(cluster)) or bool(cluster.gres_plugin_dir)


def slurmd_version(cluster) -> str:
    from slurm_tpu.slurm.installation import version_of

    version = version_of(cluster.slurm.program("slurmd"))
    assert version, "slurmd -V said no version"
    return version


def node_of(cluster, identity: str) -> str:
    import json

    with open(os.path.join(cluster.node_dir("n1"), "inventory.json"), encoding="utf-8") as handle:
        [node] = [a["device_nodes"][0] for a in json.load(handle)["accelerators"] if a["identity"] == identity]
    return node


def slot_rdev(cluster, identity: str) -> int:
    return os.lstat(os.path.join(cluster.node_dir("n1"), "slots", identity)).st_rdev


def run_probe(cluster, name: str, paths: list[str], gres: str | None = None, user: str = "stpu_alice") -> dict:
    """Submit a job (as ``user``) that opens ``paths``; path -> 'OPENED'/'EPERM'/..., plus its devices cgroup."""
    probe = out(cluster, "probe.py")
    if not os.path.exists(probe):
        with open(probe, "w", encoding="utf-8") as handle:
            handle.write(PROBE)
        os.chmod(probe, 0o644)
    args = ["-o", out(cluster, f"{name}.out")] + ([f"--gres={gres}"] if gres else [])
    job = cluster.sbatch(args, f"#!/bin/sh\nexec /usr/bin/python3 -I {probe} {' '.join(paths)}\n", user=user)
    assert cluster.wait_for_jobs([job], 180)[job] == "COMPLETED"
    with open(out(cluster, f"{name}.out"), encoding="utf-8") as handle:
        results = dict(line.split(" ", 1) for line in handle.read().splitlines() if " " in line)
    # The job ran inside the job's devices cgroup, which is what decides below.
    assert f"/job_{job}/" in results.get("cgroup", ""), results
    return results


def permissive(path: str) -> None:
    os.chmod(path, 0o666)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666


def test_a_job_without_the_gres_is_refused_the_pcie_card_by_the_cgroup(cluster):
    card = node_of(cluster, PCI)
    permissive(card)
    assert os.stat(card).st_rdev == slot_rdev(cluster, PCI)  # slurmd read these numbers at its start
    assert open_as("stpu_alice", card) == "OPENED"  # the mode lets her in outside a job
    without = run_probe(cluster, "without", [card])
    if not covered(cluster):
        # 22.05 without the plugin: the job is in a devices cgroup, yet tpu is not in it: nothing.
        assert without[card] == "OPENED", without
        return
    assert without[card] == "EPERM", without
    other = run_probe(cluster, "other-tpu", [card], gres="tpu:edgetpu_usb:1")
    assert other[card] == "EPERM", other
    allocated = run_probe(cluster, "allocated", [card], gres="tpu:edgetpu_pci:1")
    assert allocated[card] == "OPENED", allocated


def test_a_re_enumerated_usb_stick_is_not_covered_until_slurmd_restarts(cluster):
    version = slurmd_version(cluster)
    if not covered(cluster):
        pytest.skip(f"Slurm {version}: {device_cgroup.where_it_holds(version)}")
    old = node_of(cluster, USB)
    permissive(old)
    # The simulated stick's node has a driverless major: a permitted open() fails with ENXIO,
    # after the permission checks; EPERM is the device cgroup's refusal.
    assert open_as("stpu_alice", old) == "ENXIO"
    assert run_probe(cluster, "usb-before", [old])[old] == "EPERM"
    # Re-enumeration: a new node (new device number) and the slot re-pointed at it, as the
    # udev hook does; slurmd keeps denying the numbers it read at start.
    new = os.path.join(os.path.dirname(old), "099")
    os.mknod(new, stat.S_IFCHR | 0o666, os.makedev(os.major(os.stat(old).st_rdev), 200))
    try:
        permissive(new)
        from slurm_tpu.access.slots import ensure_slot

        assert ensure_slot(os.path.join(cluster.node_dir("n1"), "slots"), USB, new)
        assert run_probe(cluster, "usb-after", [new])[new] == "ENXIO"  # past the cgroup: not covered
        restart_slurmd(cluster)
        assert run_probe(cluster, "usb-restarted", [new])[new] == "EPERM"
    finally:
        os.unlink(new)
