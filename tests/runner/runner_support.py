"""Helpers for the runner tests (``from runner_support import ...``; never import a conftest)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

USB_A = "/sys/bus/usb/devices/2-1.3"
USB_B = "/sys/bus/usb/devices/2-1.4"


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
