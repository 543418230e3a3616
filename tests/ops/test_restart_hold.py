"""A GRES count change without --controller-command: held drained, resumed by health later.

Slurm 22.05 takes a slurmctld restart for a count change with File=. A compute node
cannot do that itself, so the node is held drained with a reason naming what to
restart; `slurm-tpu health` resumes it only once slurmctld reports the new GRES.
"""

from __future__ import annotations

import json
import sys

import pytest

from harness import module_command
from harness.localcluster import NodeSpec
from harness.localcluster.hardware import materialize
from helpers import HARDWARE, merge_umockdev, run_cli
from slurm_tpu.ops.health_policy import HOLD_PREFIX
from slurm_tpu.slurm.parse import parse_node_state

pytestmark = pytest.mark.slurm


def test_count_change_is_held_until_the_controller_knows(cluster_factory, tmp_path, monkeypatch):
    from slurm_tpu.config import load_config
    from slurm_tpu.families import inventory_from_json
    from slurm_tpu.ops.configure import configure_node
    from slurm_tpu.ops.restart import RestartCommands, apply_hardware_change

    cluster = cluster_factory([NodeSpec("n1", str(HARDWARE / "usb_stick_after.umockdev"))])
    # The node now has a second stick: detect it (real libudev), make its nodes real.
    both = tmp_path / "two_sticks.umockdev"
    both.write_text(merge_umockdev(HARDWARE / "usb_stick_after.umockdev", HARDWARE / "usb_second_stick.umockdev"))
    detected = run_cli(["detect", "--json"], str(both))
    assert detected.returncode == 0, detected.stderr
    live = materialize(
        inventory_from_json(json.loads(detected.stdout)), f"{cluster.node_dir('n1')}/dev", minor_start=100
    )
    config = load_config(cluster.node_config("n1"))
    result = configure_node(config, live, "n1", cluster.gres_conf, cluster.path("etc", "nodes.conf"))
    assert result.changed and result.new_gres == "tpu:edgetpu_usb:2"
    manage = module_command(sys.executable, "harness.localcluster")
    commands = RestartCommands(
        [*manage, "stop-slurmd", cluster.base, "n1"], [*manage, "start-slurmd", cluster.base, "n1"], ()
    )
    logged: list[str] = []
    from slurm_tpu.slurm.commands import Slurm

    assert (
        apply_hardware_change(Slurm(environ=cluster.env()), "n1", True, commands, result.new_gres, logged.append)
        is False
    )
    state = parse_node_state(cluster.show_node("n1"))
    assert "DRAIN" in state["state"] and state["reason"].startswith(HOLD_PREFIX)
    assert "restart slurmctld, then slurmd on n1, to apply Gres=tpu:edgetpu_usb:2" in state["reason"]

    def health() -> str:
        out = run_cli(
            ["health", "--node", "n1"],
            str(both),
            env={"SLURM_TPU_CONFIG": cluster.node_config("n1"), "SLURM_CONF": cluster.slurm_conf},
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "no change: slurm-tpu: accelerators changed; restart slurmctld" in health()
    assert "DRAIN" in parse_node_state(cluster.show_node("n1"))["state"]
    # The admin does what the reason says.
    cluster.stop_slurmd("n1")
    cluster.restart_slurmctld()
    cluster.start_slurmd("n1")
    cluster._wait(lambda: cluster.node_states().get("n1", "").startswith(("IDLE", "MIXED")), 60, "n1 back")
    assert "resumed" in health()
    state = parse_node_state(cluster.show_node("n1"))
    assert "DRAIN" not in state["state"] and state["gres"] == "tpu:edgetpu_usb:2"
    job = cluster.sbatch(["--gres=tpu:2", "-w", "n1", "-o", "/dev/null"], "#!/bin/sh\ntrue\n")
    assert cluster.wait_for_jobs([job], timeout=60) == {job: "COMPLETED"}
