"""slurm-tpu health as Slurm's HealthCheckProgram, on a real local cluster.

Each node's "current hardware" is a umockdev file under its node directory that
the test swaps (unplug, replug, overheat, re-enumerate); slurmd runs the health
check every few seconds against it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import time

import pytest

from harness import module_command
from harness.localcluster import NodeSpec
from harness.localcluster.cluster import Hooks
from helpers import HARDWARE, run_cli
from slurm_tpu.slurm.parse import parse_key_values, parse_node_state

pytestmark = pytest.mark.slurm
INTERVAL = 3


@pytest.fixture(scope="module")
def cluster(cluster_factory, tmp_path_factory):
    program = tmp_path_factory.mktemp("health") / "health-under-umockdev"
    os.chmod(program.parent, 0o755)
    # Runs as HealthCheckProgram via the harness wrapper (which sets SLURM_TPU_CONFIG
    # for $SLURMD_NODENAME): the real `slurm-tpu health`, on the node's current hardware.
    program.write_text(f"""#!/bin/sh
node_dir=$(dirname "$SLURM_TPU_CONFIG")
[ -f "$node_dir/hardware.umockdev" ] || exit 0
exec umockdev-run --device "$node_dir/hardware.umockdev" -- \\
    {shlex.join(module_command(sys.executable, "harness.localcluster.testbed"))} "$node_dir/hardware.extra" -- \\
    {sys.executable} -m slurm_tpu.cli health --grace 0.5 >>"$node_dir/health.log" 2>&1
""")
    program.chmod(0o755)
    cluster = cluster_factory(
        [
            NodeSpec("n1", str(HARDWARE / "usb_stick_after.umockdev")),
            NodeSpec("n2", str(HARDWARE / "big_node.umockdev")),
            NodeSpec("n3", str(HARDWARE / "empty_node.umockdev")),
        ],
        hooks=Hooks(health=str(program), health_interval=INTERVAL),
    )
    for node, hardware in (("n1", "usb_stick_after"), ("n2", "big_node"), ("n3", "empty_node")):
        plug(cluster, node, HARDWARE / f"{hardware}.umockdev")
    return cluster


def plug(cluster, node: str, umockdev_file) -> None:
    """Make ``umockdev_file`` the node's current hardware (atomically)."""
    node_dir = cluster.node_dir(node)
    tmp = os.path.join(node_dir, "hardware.umockdev.tmp")
    shutil.copyfile(umockdev_file, tmp)
    os.replace(tmp, os.path.join(node_dir, "hardware.umockdev"))
    extra = str(umockdev_file).replace(".umockdev", ".extra")
    target = os.path.join(node_dir, "hardware.extra")
    shutil.rmtree(target, ignore_errors=True)
    if os.path.isdir(extra):
        shutil.copytree(extra, target)


def job_reason(cluster, job: int) -> str:
    out = cluster.command(["scontrol", "-o", "show", "job", str(job)], check=False).stdout
    return parse_key_values(out).get("Reason", "")


def state(cluster, node: str) -> dict:
    return dict(parse_node_state(cluster.show_node(node)))


def wait_for(cluster, node: str, predicate, what: str, timeout: float = 4 * INTERVAL + 10) -> dict:
    deadline = time.monotonic() + timeout
    current = state(cluster, node)
    while time.monotonic() < deadline:
        current = state(cluster, node)
        if predicate(current):
            return current
        time.sleep(0.5)
    log = open(os.path.join(cluster.node_dir(node), "health.log")).read()[-2000:]
    raise AssertionError(f"{node}: {what} not seen within {timeout:g} s; state {current}; health log:\n{log}")


def drained(s: dict) -> bool:
    return "DRAIN" in s["state"]


def health_runs(cluster, node: str) -> int:
    """How many health checks have finished on ``node``: each prints one line, `<node>: ...`."""
    try:
        with open(os.path.join(cluster.node_dir(node), "health.log"), encoding="utf-8") as handle:
            return sum(1 for line in handle if line.startswith(f"{node}: "))
    except FileNotFoundError:
        return 0


def after_two_health_runs(cluster, node: str, timeout: float = 4 * INTERVAL + 10) -> dict:
    """The node's state once two more health checks have finished there.

    slurmd runs one check at a time, so the second to finish after this call began
    after it: whatever that check decided is in the state returned. This is how a
    test sees "the health check left this alone" without sleeping and hoping a check ran.
    """
    wanted = health_runs(cluster, node) + 2
    return wait_for(
        cluster,
        node,
        lambda s: health_runs(cluster, node) >= wanted,
        f"two health checks (log lines '{node}: ...')",
        timeout,
    )


def test_unplug_drains_and_replug_resumes(cluster):
    assert not drained(state(cluster, "n1"))
    plug(cluster, "n1", HARDWARE / "empty_node.umockdev")
    s = wait_for(cluster, "n1", drained, "drain after unplug")
    assert s["reason"] == "slurm-tpu: usb-2-1.3 missing"
    # While drained, a TPU job for n1 is not started: Slurm has looked at it and says why.
    job = cluster.sbatch(["--gres=tpu:1", "-w", "n1", "-o", "/dev/null"], "#!/bin/sh\ntrue\n")
    wait_for(cluster, "n1", lambda s: "ReqNodeNotAvail" in job_reason(cluster, job), f"job {job} held back")
    assert cluster.job_state(job) == "PENDING"
    plug(cluster, "n1", HARDWARE / "usb_stick_after.umockdev")
    wait_for(cluster, "n1", lambda s: not drained(s), "resume after replug")
    assert cluster.wait_for_jobs([job], timeout=60) == {job: "COMPLETED"}


def test_admin_drain_is_left_alone(cluster):
    cluster.command(["scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=disk maintenance"])
    try:
        # n3 has no accelerator, so health would find it healthy: it must not resume.
        s = after_two_health_runs(cluster, "n3")
        assert drained(s) and s["reason"] == "disk maintenance"
        # Same for a node with a real problem: the admin's reason is kept.
        cluster.command(["scontrol", "update", "NodeName=n1", "State=DRAIN", "Reason=bios update"])
        plug(cluster, "n1", HARDWARE / "empty_node.umockdev")
        s = after_two_health_runs(cluster, "n1")
        assert drained(s) and s["reason"] == "bios update"
    finally:
        plug(cluster, "n1", HARDWARE / "usb_stick_after.umockdev")
        for node in ("n1", "n3"):
            cluster.command(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)


def test_reenumeration_during_a_job_causes_no_drain_and_no_config_change(cluster):
    stop = cluster.path("reenumeration.stop")
    job = cluster.sbatch(
        ["--gres=tpu:1", "-w", "n1", "-o", "/dev/null"],
        f"#!/bin/sh\ni=0\nwhile [ ! -e {stop} ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i+1)); done\n",
    )
    wait_for(cluster, "n1", lambda s: cluster.job_state(job) == "RUNNING", f"job {job} to run", 30)
    # Firmware reload / port reset: same port, the other USB id, a new devnum.
    plug(cluster, "n1", HARDWARE / "usb_stick_before.umockdev")
    assert not drained(after_two_health_runs(cluster, "n1"))
    assert cluster.job_state(job) == "RUNNING"  # the checks above ran during the job
    check = run_cli(
        ["gres-conf", "--check", "--output", cluster.gres_conf],
        "usb_stick_before",
        env={"SLURM_TPU_CONFIG": cluster.node_config("n1")},
    )
    assert check.returncode == 0, check.stderr
    plug(cluster, "n1", HARDWARE / "usb_stick_after.umockdev")
    open(stop, "w").close()
    assert cluster.wait_for_jobs([job], timeout=60) == {job: "COMPLETED"}


def test_thermal_trip_drains(cluster, tmp_path):
    hot = tmp_path / "hot.umockdev"
    text = (HARDWARE / "big_node.umockdev").read_text()
    assert "A: temp=44000" in text
    hot.write_text(text.replace("A: temp=44000", "A: temp=91500"))
    shutil.copytree(HARDWARE / "big_node.extra", tmp_path / "hot.extra")
    plug(cluster, "n2", hot)
    s = wait_for(cluster, "n2", drained, "drain on a thermal trip")
    assert s["reason"] == "slurm-tpu: pci-0000:05:00.0 at 91.5 C, above its 85 C trip point"
    plug(cluster, "n2", HARDWARE / "big_node.umockdev")
    wait_for(cluster, "n2", lambda s: not drained(s), "resume after cooling down")
