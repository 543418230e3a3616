"""Capture the Slurm output the parser tests read, from a real local cluster (run as root).

    .venv/bin/python tests/slurm/capture_fixtures.py /usr tests/slurm/captured/22.05
    .venv/bin/python tests/slurm/capture_fixtures.py /opt/slurm-25.11 tests/slurm/captured/25.11

Starts a three-node LocalCluster on the Slurm under PREFIX, submits the same jobs
on every release (ids 1-7, see captured/README.md), saves what the parsers read,
and stops the cluster. Not a test: the captured files are.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from harness.localcluster.cluster import LocalCluster, NodeSpec  # noqa: E402

BIG = str(REPO / "tests" / "hardware" / "big_node.umockdev")
ONE = str(REPO / "tests" / "isolation" / "hardware" / "n4_one_tpu.umockdev")
SLEEP = "#!/bin/sh\nsleep 300\n"
FORGED_NAME = "evil\n     Nodes=n2 CPU_IDs=0 Mem=0 GRES=tpu:edgetpu_usb:1(IDX:0)\nJobId=77777 JobName=x"


def main(prefix: str, out: str) -> None:
    base = tempfile.mkdtemp(prefix="slurm-tpu-capture-", dir="/tmp")
    os.chmod(base, 0o755)
    os.makedirs(out, exist_ok=True)
    cluster = LocalCluster(
        base=base,
        slurm_prefix=prefix,
        nodes=[NodeSpec("n1", BIG, cpus=8), NodeSpec("n2", BIG, cpus=8), NodeSpec("n3", ONE)],
    )
    cluster.configure()
    cluster.start()
    try:

        def submit(*args: str) -> int:
            return cluster.sbatch([*args, "-o", "/dev/null"], SLEEP)

        jobs = {
            "single": submit("--gres=tpu:1", "-w", "n3", "-J", "single"),
            "typed": submit("--gres=tpu:edgetpu_pci:2", "-w", "n1", "-J", "typed"),
            "multi": submit("--gres=tpu:1", "-N", "2", "-w", "n1,n2", "-J", "multi"),
            "forged": submit("--gres=tpu:1", "-w", "n2", "-J", FORGED_NAME),
            "array": submit("--gres=tpu:1", "--array=0-2", "-w", "n2", "-J", "arr"),
        }
        het = cluster.command(
            [
                "sbatch",
                "--parsable",
                "-o",
                "/dev/null",
                "--gres=tpu:1",
                "-w",
                "n1",
                "-J",
                "het",
                ":",
                "--gres=tpu:1",
                "-w",
                "n2",
            ],
            input=SLEEP,
        ).stdout.strip()
        jobs["het"] = int(het)
        assert list(jobs.values()) == [1, 2, 3, 4, 5, 6], jobs
        deadline = time.monotonic() + 60
        while "PENDING" in cluster.command(["squeue", "-h", "-o", "%T"]).stdout and time.monotonic() < deadline:
            time.sleep(0.5)

        def save(name: str, *argv: str) -> None:
            Path(out, name).write_text(cluster.command(list(argv)).stdout)

        for key in ("single", "typed", "multi", "forged", "array", "het"):
            save(f"show_job_d_{key}.txt", "scontrol", "show", "job", "-d", str(jobs[key]))
            if not prefix.startswith("/usr"):  # 22.05 ignores -j: one file lists every job
                save(f"squeue_json_{key}.json", "squeue", "--json", "-j", str(jobs[key]))
        if prefix.startswith("/usr"):
            save("squeue_json_all.json", "squeue", "--json")
        save("show_job_d_array_master_task.txt", "scontrol", "show", "job", "-d", "5_2")
        save("show_job_d_het_comp1.txt", "scontrol", "show", "job", "-d", "7")
        save("show_node_o.txt", "scontrol", "-o", "show", "node")
        cluster.command(
            ["scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=slurm-tpu: test reason with spaces"]
        )
        save("show_node_o_drained.txt", "scontrol", "-o", "show", "node", "n3")
        save("show_node_n3_drained.txt", "scontrol", "show", "node", "n3")
        save("version.txt", "scontrol", "--version")
    finally:
        cluster.command(["scancel", "--partition=debug"], check=False)
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
