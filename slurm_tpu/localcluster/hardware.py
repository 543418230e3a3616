"""Simulated node hardware: umockdev description -> inventory with real device nodes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from dataclasses import replace

from ..model import Inventory

# Majors 240-254 are reserved for local/experimental use: no real driver answers
# them, so the nodes we make can be opened/owned but reach no hardware.
EXPERIMENTAL_MAJOR = 240


def detect_under_umockdev(umockdev_file: str, slurm_tpu: list[str], python: str) -> Inventory:
    """Run the real ``slurm-tpu detect --json`` against a umockdev testbed.

    Files that no udev device announces (NVIDIA procfs, driver-made nodes) are
    taken from ``<name>.extra/`` beside the umockdev file when it exists.
    """
    extra = os.path.splitext(umockdev_file)[0] + ".extra"
    completed = subprocess.run(
        ["umockdev-run", "--device", umockdev_file, "--", python, "-m", "slurm_tpu.localcluster.testbed",
         extra, "--", *slurm_tpu, "detect", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"detect under umockdev failed for {umockdev_file}: {completed.stderr.strip()}")
    return Inventory.from_json(json.loads(completed.stdout))


def materialize(inventory: Inventory, dev_root: str, minor_start: int = 0) -> Inventory:
    """Create a real char device for each device node, under ``dev_root``.

    ``/dev/bus/usb/002/005`` becomes ``<dev_root>/bus/usb/002/005`` (root:root
    0600, the idle policy), and the returned inventory names the new paths.
    """
    minor = minor_start
    accelerators = []
    for accelerator in inventory:
        nodes = []
        for node in accelerator.device_nodes:
            relative = os.path.relpath(node, "/dev")
            target = os.path.join(dev_root, relative)
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            if os.path.lexists(target):
                os.unlink(target)
            os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(EXPERIMENTAL_MAJOR, minor))
            os.chmod(target, 0o600)
            minor += 1
            nodes.append(target)
        accelerators.append(replace(accelerator, device_nodes=tuple(nodes)))
    return replace(inventory, accelerators=tuple(accelerators))
