"""One job step across nodes on a real local Slurm cluster (the Dev Board cluster's MPI run,
without MPI): each task infers its share on its own node's Edge TPU.

Two nodes, one USB Edge TPU each (umockdev), the project's prolog/epilog/task-prolog;
libedgetpu is the test double (it logs which device each process opened), so the
models run on the CPU behind a real lease of each node's TPU.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from helpers import TESTS, double_root, repo_hooks, runner_job_workspace

pytestmark = pytest.mark.slurm
USER = "stpu_dana"
USB = "/sys/bus/usb/devices/2-1.3"


@pytest.fixture(scope="module")
def setup(cluster_factory):
    from harness.localcluster import NodeSpec

    with runner_job_workspace("slurm-tpu-step-", USER, image_count=11) as (shared, models, double):
        (shared / "out").mkdir()
        os.chmod(shared / "out", 0o1777)
        hardware = str(TESTS / "isolation" / "hardware" / "n4_one_tpu.umockdev")
        cluster = cluster_factory([NodeSpec("n1", hardware), NodeSpec("n2", hardware)], hooks=repo_hooks())
        yield cluster, models, double, shared / "out"


def _script(cluster, double: Path, out: Path, body: str) -> str:
    return f"""#!/bin/sh
export SLURM_TPU_LIBEDGETPU={double} EDGETPU_DOUBLE_DEVICES=usb:{USB} EDGETPU_DOUBLE_ROOT={double_root(cluster)}
{body}
"""


def _infer(models, out: Path, output: str) -> str:
    """One srun line: every task runs infer on the whole directory, logging the double per node.

    The runner's per-user TPU lock lives in /tmp, one per machine; the simulated nodes
    share this machine and both call their TPU usb-2-1.3, so each node gets its own lock
    directory, as real nodes have their own /tmp.
    """
    return (
        f"srun sh -c 'EDGETPU_DOUBLE_LOG={out}/double-$SLURM_JOB_ID-$SLURMD_NODENAME.log "
        f"SLURM_TPU_LOCK_DIR={out}/locks-$SLURMD_NODENAME exec "
        f"{sys.executable} -m slurm_tpu.cli infer {models['classifier']} {models['images']} "
        f"-o {out}/{output} --no-progress'"
    )


def _keys(path: Path) -> list[str]:
    return [json.loads(line)["input"] for line in path.read_text().splitlines()]


def _everything(models) -> list[str]:
    return [str(p) for p in sorted(models["images"].glob("*.png"))]


def _acquired(cluster, node: str, job: int) -> list[str]:
    path = os.path.join(cluster.node_dir(node), "state", "audit.log")
    with open(path, encoding="utf-8") as handle:
        events = [json.loads(line) for line in handle if line.strip()]
    return [e["identity"] for e in events if e["event"] == "acquire" and e["job_id"] == job]


def _opened(out: Path, job: int, node: str) -> list[str]:
    lines = (out / f"double-{job}-{node}.log").read_text().splitlines()
    return [
        field.split("=", 1)[1]
        for line in lines
        if line.startswith("create ")
        for field in line.split()
        if field.startswith("path=")
    ]


def _array_states(cluster, array: int, timeout: float) -> list[str]:
    """The final states of an array's tasks (``scontrol show job`` lists one line per task)."""
    import time

    from slurm_tpu.slurm.parse import parse_key_values

    final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}
    deadline = time.monotonic() + timeout
    while True:
        lines = cluster.command(["scontrol", "-o", "show", "job", str(array)], check=False).stdout.splitlines()
        states = [parse_key_values(line).get("JobState", "") for line in lines if line.strip()]
        if len(states) == 2 and all(s in final for s in states):
            return states
        if time.monotonic() > deadline:
            raise AssertionError(f"array {array} not finished within {timeout:g} s: {states}")
        time.sleep(0.5)


def test_one_step_two_tasks_two_nodes_covers_every_input_once(setup):
    cluster, models, double, out = setup
    err = out / "step.err"
    job = cluster.sbatch(
        ["-N2", "--ntasks-per-node=1", "--gres=tpu:1", "-o", "/dev/null", "-e", str(err)],
        _script(cluster, double, out, _infer(models, out, "step-%j-%t-%N.jsonl")),
        user=USER,
    )
    assert cluster.wait_for_jobs([job], timeout=120)[job] == "COMPLETED", err.read_text()
    files = sorted(out.glob(f"step-{job}-*.jsonl"))
    assert [f.name for f in files] == [f"step-{job}-0-n1.jsonl", f"step-{job}-1-n2.jsonl"]
    shares = [_keys(f) for f in files]
    assert sorted(k for share in shares for k in share) == _everything(models)
    assert all(shares) and abs(len(shares[0]) - len(shares[1])) <= 1
    for node in ("n1", "n2"):  # each task leased and opened its own node's TPU, by path
        assert _acquired(cluster, node, job) == ["usb-2-1.3"]
        assert _opened(out, job, node) == [USB]


def test_steps_of_an_array_cover_every_input_once(setup):
    cluster, models, double, out = setup
    err = out / "array-%a.err"
    array = cluster.sbatch(
        ["--array=0-1", "-N2", "--ntasks-per-node=1", "--gres=tpu:1", "-o", "/dev/null", "-e", str(err)],
        _script(cluster, double, out, _infer(models, out, "array-%A-%a-%t.jsonl")),
        user=USER,
    )
    states = _array_states(cluster, array, timeout=240)
    assert states == ["COMPLETED", "COMPLETED"], [p.read_text() for p in out.glob("array-*.err")]
    files = sorted(out.glob(f"array-{array}-*.jsonl"))
    assert [f.name for f in files] == [f"array-{array}-{a}-{t}.jsonl" for a in (0, 1) for t in (0, 1)]
    keys = [k for f in files for k in _keys(f)]
    assert sorted(keys) == _everything(models)
    assert all(_keys(f) for f in files)


def test_a_batch_script_without_srun_is_one_process_and_takes_everything(setup):
    """The batch script of a 2-task job sees SLURM_NTASKS=2 and SLURM_PROCID=0; it must not
    take half the inputs (no other task would do the rest)."""
    cluster, models, double, out = setup
    err = out / "batch.err"
    body = (
        f"{sys.executable} -m slurm_tpu.cli infer {models['classifier']} {models['images']} "
        f"-o {out}/batch-%j.jsonl --no-progress"
    )
    job = cluster.sbatch(
        ["-N2", "--ntasks-per-node=1", "--gres=tpu:1", "-o", "/dev/null", "-e", str(err)],
        _script(cluster, double, out, f"export EDGETPU_DOUBLE_LOG={out}/double-batch.log\n{body}"),
        user=USER,
    )
    assert cluster.wait_for_jobs([job], timeout=120)[job] == "COMPLETED", err.read_text()
    assert sorted(_keys(out / f"batch-{job}.jsonl")) == _everything(models)
