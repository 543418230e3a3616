"""Slurm accepts what slurm-tpu generates: real slurmctld + slurmd, real jobs."""

from __future__ import annotations

import subprocess

import pytest

from harness.localcluster import NodeSpec
from helpers import HARDWARE, run_cli
from slurm_tpu.slurm.parse import parse_key_values, parse_slurmd_c

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(
        [
            NodeSpec("n1", str(HARDWARE / "big_node.umockdev")),
            NodeSpec("n2", str(HARDWARE / "usb_stick_after.umockdev")),
            NodeSpec("n3", str(HARDWARE / "empty_node.umockdev")),
        ]
    )


def node(cluster, name: str) -> dict[str, str]:
    return parse_key_values(cluster.command(["scontrol", "-o", "show", "node", name]).stdout)


def test_nodes_report_generated_gres_and_features(cluster):
    n1, n2, n3 = (node(cluster, n) for n in ("n1", "n2", "n3"))
    # Slurm adds each GPU type's socket affinity, derived from our Cores= lines.
    assert n1["Gres"] == (
        "tpu:edgetpu_usb:2,tpu:edgetpu_pci:4,gpu:a100_sxm4_80gb:2(S:0-1),"
        "gpu:radeon_rx_6800:1(S:0-1),gpu:tegra_ga10b:1(S:0-1)"
    )
    assert n1["AvailableFeatures"] == (
        "tpu,edgetpu,edgetpu_usb,edgetpu_pci,gpu,nvidia,a100_sxm4_80gb,amd,radeon_rx_6800,tegra_ga10b"
    )
    assert n2["Gres"] == "tpu:edgetpu_usb:1" and n2["AvailableFeatures"] == "tpu,edgetpu,edgetpu_usb"
    assert n3["Gres"] == "(null)"
    for state in (n1["State"], n2["State"], n3["State"]):
        assert state.split("+")[0] in ("IDLE", "MIXED"), state


def test_gres_conf_names_only_existing_slot_nodes(cluster):
    text = open(cluster.gres_conf).read()
    files = [parse_key_values(line)["File"] for line in text.splitlines() if line.startswith("NodeName=")]
    assert len(files) == 10 + 1  # n1: 6 TPUs + 4 GPUs; n2: 1 TPU; n3: none
    import os
    import stat

    for path in files:
        assert stat.S_ISCHR(os.stat(path).st_mode), path
    assert any(p.endswith("/nodes/n1/slots/usb-1-1.4") for p in files)


def test_tpu_job_starts_and_too_many_is_refused(cluster):
    job = cluster.sbatch(["--gres=tpu:1", "-w", "n2", "-o", "/dev/null"], "#!/bin/sh\ntrue\n")
    assert cluster.wait_for_jobs([job], timeout=60) == {job: "COMPLETED"}
    six = cluster.sbatch(["--gres=tpu:6", "-w", "n1", "-o", "/dev/null"], "#!/bin/sh\ntrue\n")
    assert cluster.wait_for_jobs([six], timeout=60) == {six: "COMPLETED"}
    refused = cluster.command(["sbatch", "--gres=tpu:7", "--wrap", "true"], check=False)
    assert refused.returncode != 0
    assert "Requested node configuration is not available" in refused.stderr
    typed = cluster.command(["sbatch", "--gres=tpu:edgetpu_pci:2", "-w", "n2", "--wrap", "true"], check=False)
    assert typed.returncode != 0  # n2 has a USB stick only


def test_gpu_and_constraint_requests(cluster):
    job = cluster.sbatch(["--gres=gpu:a100_sxm4_80gb:2", "--constraint=amd", "-o", "/dev/null"], "#!/bin/sh\ntrue\n")
    assert cluster.wait_for_jobs([job], timeout=60) == {job: "COMPLETED"}
    assert "NodeList=n1" in cluster.command(["scontrol", "show", "job", str(job)]).stdout


def test_node_conf_merges_slurmd_hardware_facts():
    result = run_cli(["node-conf", "--node", "x"], "empty_node")
    assert result.returncode == 0, result.stderr
    line = parse_key_values(result.stdout.splitlines()[1])
    facts = parse_slurmd_c(subprocess.run(["slurmd", "-C"], capture_output=True, text=True).stdout)
    assert line["NodeName"] == "x"
    assert line["CPUs"] == facts["CPUs"] and line["RealMemory"] == facts["RealMemory"]
    assert line["CoresPerSocket"] == facts["CoresPerSocket"]
