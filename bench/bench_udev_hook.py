#!/usr/bin/env python3
"""Start-up of the udev hook: its ``-I -S`` entry script versus ``slurm-tpu udev-event`` (the CLI).

udev runs the hook on every event of an accelerator (two per USB job: the
revocation's remove and add). One real local cluster (node n1 with a USB and a
PCIe Edge TPU, this checkout's hooks) runs two jobs, so the hooks' snapshot and
inventory exist as on a working node; then each sample is one fresh process
handling the same ``change`` event of the USB stick (its node unchanged, the
usual event), alternating between

- ``cli``: the console script beside this Python, ``slurm-tpu udev-event``
  (what the udev rules ran before the entry script existed);
- ``entry``: ``udev/slurm-tpu-udev-event`` under this Python with ``-I -S``
  (what ``slurm-tpu install`` writes and the rules run).

Each is also run once with ``-X importtime`` to count the modules it imports.

    sudo .venv/bin/python bench/bench_udev_hook.py [--rounds 30]

Prints one JSON document: median milliseconds and module count of each, and
``ratio`` = entry / cli.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from harness.localcluster.cluster import Hooks, LocalCluster, NodeSpec  # noqa: E402

HARDWARE = os.path.join(REPO, "tests", "isolation", "hardware", "n1_two_tpus.umockdev")
USB_IDENTITY, USB_DEVPATH = "usb-2-1.3", "/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1.3"


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_udev_hook: timed out waiting for {what}")
        time.sleep(0.1)


def module_count(argv: list[str], env: dict[str, str]) -> int:
    """How many modules the process ``argv`` imports (``-X importtime`` lines on its stderr)."""
    done = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True, check=True, cwd="/"
    )
    return sum(1 for line in done.stderr.splitlines() if line.startswith("import time:") and "|" in line) - 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="samples per variant (interleaved)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_udev_hook: must run as root (it starts Slurm daemons)", file=sys.stderr)
        return 2
    python = os.path.abspath(sys.executable)
    variants = {
        "cli": [python, os.path.join(os.path.dirname(python), "slurm-tpu"), "udev-event"],
        "entry": [python, "-I", "-S", os.path.join(REPO, "udev", "slurm-tpu-udev-event")],
    }
    base = tempfile.mkdtemp(prefix="slurm-tpu-bench-", dir="/tmp")
    os.chmod(base, 0o755)
    cluster = LocalCluster(
        base=base,
        nodes=[NodeSpec("n1", HARDWARE)],
        hooks=Hooks(
            prolog=os.path.join(REPO, "prolog", "slurm-tpu-prolog"),
            epilog=os.path.join(REPO, "epilog", "slurm-tpu-epilog"),
            task_prolog=os.path.join(REPO, "prolog", "slurm-tpu-task-prolog"),
        ),
    )
    state = os.path.join(cluster.node_dir("n1"), "state")
    try:
        cluster.configure()
        cluster.start()
        for _ in range(2):  # the first job builds the hooks' snapshot; the second runs on it
            job = cluster.sbatch(["--gres=tpu:2", "-w", "n1", "-o", "/dev/null"], "#!/bin/sh\ntrue\n")
            cluster.wait_for_jobs([job], timeout=120)
            wait_for(lambda: not os.listdir(os.path.join(state, "leases")), 60, "the revoked stick to come back")
        with open(os.path.join(state, "inventory.json"), encoding="utf-8") as handle:
            inventory = json.load(handle)
        node = next(a["device_nodes"][0] for a in inventory["accelerators"] if a["identity"] == USB_IDENTITY)
        env = {
            "PATH": "/usr/bin:/bin",
            "SLURM_TPU_CONFIG": cluster.node_config("n1"),
            "SLURMD_NODENAME": "n1",
            "SLURM_CONF": cluster.slurm_conf,
            "ACTION": "change",
            "DEVPATH": USB_DEVPATH,
            "DEVNAME": node,
            "SUBSYSTEM": "usb",
            "DEVTYPE": "usb_device",
        }
        modules = {name: module_count(argv, env) for name, argv in variants.items()}
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for round_ in range(args.rounds):
            for name in sorted(variants, reverse=bool(round_ % 2)):  # A/B, then B/A
                began = time.perf_counter()
                subprocess.run(variants[name], env=env, check=True, cwd="/")
                samples[name].append((time.perf_counter() - began) * 1000)
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    median = {name: round(statistics.median(values), 1) for name, values in samples.items()}
    print(
        json.dumps(
            {
                "rounds": args.rounds,
                "median_ms": median,
                "modules": modules,
                "ratio": round(median["entry"] / median["cli"], 2),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
