"""The collectors of a two-node job on a real slurmdbd: neither node's figures are lost from its AdminComment.

Each node spools its own entry (in its own, persistent accounting spool) and each node's
collector reads the job's AdminComment, adds its item and writes the whole text back; there is no
lock across nodes (slurm_tpu/ops/accounting.py: the protocol). Here the two collectors race in the
worst order, driven step by step (A reads, B reads, A writes, B writes: B's write erases A's
item, which is what happened before the protocol), on a clock only the test moves; then the next
runs repair it and empty both spools. Then the real command, on both nodes, with the real clock.
"""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from helpers import TESTS, USERS, repo_hooks, wait_until

pytestmark = pytest.mark.slurm
USER = USERS[0]
NODES = ("n1", "n2")
# Each node's job step writes its usage record (3 and 5 inferences): the figures tell the items apart.
JOB = """#!/bin/sh
exec srun -N2 --ntasks-per-node=1 sh -c 'case "$SLURMD_NODENAME" in n1) n=3;; *) n=5;; esac
printf "{\\"version\\": 1, \\"inferences\\": $n, \\"seconds\\": 0.5, \\"energy_j\\": null}" \
    > "$SLURM_TPU_USAGE_DIR/usb-2-1.3.json"'
"""


@pytest.fixture(scope="module")
def cluster(accounting_factory):
    from harness.localcluster import NodeSpec

    hardware = str(TESTS / "isolation" / "hardware" / "n4_one_tpu.umockdev")
    cluster = accounting_factory([NodeSpec(node, hardware) for node in NODES], hooks=repo_hooks())
    out = os.path.join(cluster.base, "out")
    os.makedirs(out, exist_ok=True)
    os.chmod(out, 0o1777)  # the job's user writes its stderr here
    for node in NODES:  # each node's collector has run once: from now on its epilog spools
        done = collect(cluster, node)
        assert done.returncode == 0, done.stdout + done.stderr
    return cluster


def collect(cluster, node: str, window: str = "1") -> subprocess.CompletedProcess:
    """`slurm-tpu accounting-collect` as root on ``node``."""
    env = cluster.env({"SLURM_TPU_CONFIG": cluster.node_config(node)})
    argv = [*cluster.slurm_tpu, "accounting-collect", "--window", window]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


def admin_comment(cluster, job: int) -> str:
    return cluster.command(["sacct", "-n", "-P", "-X", "-j", str(job), "-o", "AdminComment"]).stdout.strip()


def figures(comment: str) -> dict[str, int]:
    from slurm_tpu.protocol.job_record import parse_admin_comment

    return {node: int(values["inferences"]) for node, values in parse_admin_comment(comment).items()}


def run_job(cluster) -> int:
    err = os.path.join(cluster.base, "out", "two-node.err")
    job = cluster.sbatch(["-N2", "-w", ",".join(NODES), "--gres=tpu:1", "-o", "/dev/null", "-e", err], JOB, user=USER)
    assert cluster.wait_for_jobs([job], timeout=120)[job] == "COMPLETED", open(err).read()
    # Each node's epilog spools the job's entry there (epilogs end after the job's state does).
    wait_until(
        lambda: all(os.path.exists(os.path.join(cluster.accounting_spool(n), str(job))) for n in NODES),
        60,
        f"job {job}'s entries in both nodes' spools",
    )
    return job


def test_two_collectors_racing_lose_an_item_and_their_next_runs_put_it_back(cluster, manual_clock):
    from slurm_tpu.hooks.jobusage import open_spool
    from slurm_tpu.ops.accounting import Read, collect as collect_spool, mark_written, read_record, write_item
    from slurm_tpu.protocol.job_record import decode_spool
    from slurm_tpu.slurm.commands import Slurm

    job = run_job(cluster)
    slurm, clock, window = Slurm(cluster.slurm, cluster.env()), manual_clock.clock, 60.0
    spools = {node: cluster.accounting_spool(node) for node in NODES}
    raws = {}
    for node in NODES:
        with open(os.path.join(spools[node], str(job)), "rb") as handle:
            raws[node] = handle.read()
    entries = {node: decode_spool(raw, node) for node, raw in raws.items()}
    assert {node: entry.inferences for node, entry in entries.items()} == {"n1": 3, "n2": 5}
    # slurmctld sends the job's end to slurmdbd asynchronously: until then a read says why it waits.
    wait_until(lambda: isinstance(read_record(slurm, entries["n1"], clock, window), Read), 90, "the job's end in sacct")

    def write(node: str, read: Read) -> None:
        fd = open_spool(spools[node])
        try:
            mark = write_item(slurm, read, clock, window)
            assert mark is not None and mark_written(fd, str(job), raws[node], entries[node], mark)
        finally:
            os.close(fd)

    read_a = read_record(slurm, entries["n1"], clock, window)
    read_b = read_record(slurm, entries["n2"], clock, window)
    assert isinstance(read_a, Read) and isinstance(read_b, Read)
    write("n1", read_a)
    assert figures(admin_comment(cluster, job)) == {"n1": 3}
    write("n2", read_b)
    assert figures(admin_comment(cluster, job)) == {"n2": 5}  # n1's figures erased by n2's stale read

    def run(node: str):
        return collect_spool(spools[node], slurm, window, clock)

    # Within the window each entry waits (kept, marked written); a window later n1 finds its item
    # missing and writes it again, n2 finds its own there: final, its entry goes.
    early = run("n1")
    assert job in early.waiting and not early.applied and os.listdir(spools["n1"]) == [str(job)]
    manual_clock.advance(window)
    assert set(run("n1").applied) == {job}
    assert set(run("n2").confirmed) == {job} and os.listdir(spools["n2"]) == []
    assert figures(admin_comment(cluster, job)) == {"n1": 3, "n2": 5}
    manual_clock.advance(window)
    assert set(run("n1").confirmed) == {job} and os.listdir(spools["n1"]) == []
    assert figures(admin_comment(cluster, job)) == {"n1": 3, "n2": 5}


def test_the_spool_is_root_only_on_the_configured_path_outside_the_state_dir(cluster):
    job = run_job(cluster)
    for node in NODES:
        spool = cluster.accounting_spool(node)
        assert spool == os.path.join(cluster.node_dir(node), "accounting-spool")
        state = cluster.state_dir(node)
        assert os.path.commonpath([spool, state]) != state  # not under the state dir (/run: a tmpfs)
        assert not os.path.exists(os.path.join(state, "accounting-spool"))
        info, entry = os.lstat(spool), os.lstat(os.path.join(spool, str(job)))
        assert stat.S_ISDIR(info.st_mode) and (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o700)
        assert stat.S_ISREG(entry.st_mode) and (entry.st_uid, stat.S_IMODE(entry.st_mode)) == (0, 0o600)
        assert [name for name in os.listdir(spool) if name.startswith(".")] == []  # written whole, renamed in
        # The job's user can neither read nor plant an entry there.
        planted = cluster.command(["sh", "-c", f"ls {spool}; echo x > {spool}/1"], user=USER, check=False)
        assert planted.returncode != 0 and not os.path.exists(os.path.join(spool, "1"))


def test_the_collectors_of_both_nodes_leave_both_items_and_empty_spools(cluster):
    job = run_job(cluster)

    def drained() -> bool:
        for node in NODES:
            done = collect(cluster, node)
            assert done.returncode == 0, done.stdout + done.stderr
        return not any(os.listdir(cluster.accounting_spool(node)) for node in NODES)

    wait_until(drained, 120, f"job {job}'s entries confirmed on both nodes")
    assert figures(admin_comment(cluster, job)) == {"n1": 3, "n2": 5}
