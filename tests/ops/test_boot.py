"""slurm-tpu boot: slots and the hooks' inventory come back after a reboot wiped /dev and /run."""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest

from helpers import HARDWARE, run_cli


@pytest.fixture
def node(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("slot nodes need root (mknod)")
    root = tmp_path / "node"
    root.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(root, 0o755)
    config = root / "config.yaml"
    config.write_text(
        f"version: 1\nnode_name: big\ndevices: {{slot_dir: {root}/dev-slots}}\n"
        f"state_dir: {root}/run-state\ninventory_file: {root}/var/inventory.json\n"
    )
    result = run_cli(["--config", str(config), "gres-conf", "--output", str(root / "gres.conf")], "big_node")
    assert result.returncode == 0, result.stderr
    return root, config


def test_boot_restores_slots_and_state_even_for_an_absent_device(node, tmp_path):
    root, config = node
    slots_before = sorted(os.listdir(root / "dev-slots"))
    assert len(slots_before) == 6
    shutil.rmtree(root / "dev-slots")  # the reboot: /dev and /run are tmpfs
    shutil.rmtree(root / "run-state")
    unplugged = tmp_path / "unplugged.umockdev"
    blocks = (HARDWARE / "big_node.umockdev").read_text().split("\n\n")
    unplugged.write_text("\n\n".join(b for b in blocks if "usb2/2-1\n" not in b + "\n"))
    shutil.copytree(HARDWARE / "big_node.extra", tmp_path / "unplugged.extra")
    result = run_cli(["--config", str(config), "boot"], str(unplugged))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "slurm-tpu boot: 9 of 10 configured accelerator(s) present; absent: usb-2-1 (placeholder slots)"
    )
    assert sorted(os.listdir(root / "dev-slots")) == slots_before  # every File= exists again
    placeholder = os.stat(root / "dev-slots" / "usb-2-1")
    assert stat.S_ISCHR(placeholder.st_mode) and placeholder.st_rdev == os.makedev(0, 0)
    assert stat.S_IMODE(placeholder.st_mode) == 0o600
    state = json.loads((root / "run-state" / "inventory.json").read_text())
    assert len(state["accelerators"]) == 10  # the absent one stays configured: health reports it


def test_boot_without_a_configured_inventory_says_what_to_run(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"version: 1\ninventory_file: {tmp_path}/none.json\nstate_dir: {tmp_path}/state\n")
    result = run_cli(["--config", str(config), "boot"], "empty_node")
    assert result.returncode == 2
    assert result.stderr.strip().endswith("run `slurm-tpu gres-conf --output /etc/slurm/gres.conf` once on this node")
