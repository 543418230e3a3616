"""Helpers for the runner tests (``from runner_support import ...``; never import a conftest)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

USB_A = "/sys/bus/usb/devices/2-1.3"
USB_B = "/sys/bus/usb/devices/2-1.4"
# The usbfs node of each stick (bus 2; device numbers as a hub enumerates them) and a PCIe card.
USB_NODES = {USB_A: (2, 5), USB_B: (2, 6)}
PCI = "/dev/apex_0"


def device_root(root: Path) -> Path:
    """A stand-in for / that the double opens devices under (EDGETPU_DOUBLE_ROOT): each stick's
    sysfs busnum/devnum and its /dev/bus/usb/BBB/DDD node, and /dev/apex_0. The nodes are
    plain files the tests' user can open; the isolation tests use real char devices."""
    for sysfs, (bus, dev) in USB_NODES.items():
        directory = root / sysfs.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "busnum").write_text(f"{bus}\n")
        (directory / "devnum").write_text(f"{dev}\n")
        node = root / "dev" / "bus" / "usb" / f"{bus:03d}" / f"{dev:03d}"
        node.parent.mkdir(parents=True, exist_ok=True)
        node.touch()
    (root / PCI.lstrip("/")).touch()
    return root


def double_log(env: dict[str, str]) -> list[dict[str, str]]:
    """The double's log as dicts: {'call': 'create', 'type': 'usb', 'path': ..., 'pid': ...}."""
    path = Path(env["EDGETPU_DOUBLE_LOG"])
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        call, *fields = line.split(" ")
        entry = {"call": call}
        entry.update(f.split("=", 1) for f in fields)
        entries.append(entry)
    return entries


def run_cli(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """``slurm-tpu ARGS`` in a fresh process, as a job script would run it."""
    return subprocess.run(
        [sys.executable, "-c", "from slurm_tpu.cli import run; run()", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
