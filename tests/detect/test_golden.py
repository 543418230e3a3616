"""Rendered files compared with checked-in expected files.

To regenerate after an intended change: UPDATE_GOLDEN=1 pytest tests/detect/test_golden.py
and review the diff of tests/golden/.
"""

from __future__ import annotations

import os

import pytest

from helpers import TESTS, run_cli

GOLDEN = TESTS / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing: run UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == path.read_text(), f"{name} changed; if intended, run UPDATE_GOLDEN=1 pytest {__file__}"


def test_gres_conf_golden():
    result = run_cli(["gres-conf", "--node", "big"], "big_node")
    assert result.returncode == 0, result.stderr
    check_golden("big_node.gres.conf", result.stdout)


def test_node_line_golden():
    result = run_cli(
        ["node-conf", "--node", "big", "--no-hardware", "--set", "CPUs=2", "--set", "RealMemory=1000"], "big_node"
    )
    assert result.returncode == 0, result.stderr
    check_golden("big_node.node.conf", result.stdout)


SHARING = (
    "version: 2\nfamilies:\n  edgetpu: {shared: [usb-2-1, edgetpu_pci], shares_per_device: 4}\n"
    "  gpu: {shared: [a100_sxm4_80gb], shares_per_device: 8}\n"
)


def test_shared_devices_gres_conf_and_node_line_golden(tmp_path):
    """A site sharing a stick and the PCIe cards (tpu_shard) and the A100s (Slurm's shard)."""
    config = tmp_path / "config.yaml"
    config.write_text(SHARING)
    result = run_cli(["--config", str(config), "gres-conf", "--node", "big"], "big_node")
    assert result.returncode == 0, result.stderr
    check_golden("big_node_shared.gres.conf", result.stdout)
    args = ["--config", str(config), "node-conf", "--node", "big", "--no-hardware", "--set", "CPUs=2"]
    result = run_cli(args, "big_node")
    assert result.returncode == 0, result.stderr
    check_golden("big_node_shared.node.conf", result.stdout)


def test_udev_rules_golden():
    # No --run-program, no config: the -I -S hook `slurm-tpu install` puts under /usr/local.
    result = run_cli(["udev-rules"])
    assert result.returncode == 0, result.stderr
    check_golden("60-slurm-tpu.rules", result.stdout)


def test_udev_rules_with_gpu_isolation_and_site_ownership_golden(tmp_path):
    # An old config naming the slurm-tpu console script: rules that run `slurm-tpu udev-event`, as before.
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: 1\ndevices:\n  isolate_gpus: true\n"
        "  idle: {owner: root, group: tpuadmin, mode: '0660'}\n"
        "udev: {run_program: /opt/slurm-tpu/bin/slurm-tpu}\n"
    )
    result = run_cli(["--config", str(config), "udev-rules"])
    assert result.returncode == 0, result.stderr
    check_golden("60-slurm-tpu.isolate-gpus.rules", result.stdout)


def test_site_gres_names_and_types(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: 1\ngres:\n  tpu_name: coral\n  tpu_types: {usb: usbtpu}\n"
        "  gpu_types: {a100_sxm4_80gb: a100}\nfeatures:\n  tpu: [coral]\n"
    )
    result = run_cli(["--config", str(config), "node-conf", "--node", "big", "--no-hardware"], "big_node")
    assert result.returncode == 0, result.stderr
    line = result.stdout.splitlines()[1]
    assert "Gres=coral:usbtpu:2,coral:edgetpu_pci:4,gpu:a100:2," in line
    assert "Feature=coral,usbtpu,edgetpu_pci,gpu,nvidia,a100," in line


@pytest.mark.parametrize("hardware", ["empty_node"])
def test_empty_node_renders_no_gres(hardware):
    line = run_cli(["node-conf", "--node", "e", "--no-hardware"], hardware).stdout.splitlines()[1]
    assert line == "NodeName=e"
