"""Shared Edge TPUs scheduled by real Slurm (issue 32, the Slurm side): ``tpu_shard`` as the config
renders it, with the project's hooks and two real unix users.

n4 has one USB stick (tests/isolation/hardware/n4_one_tpu), shared with 4 shares: its node has
``tpu_shard:4`` and no ``tpu`` at all. n1 has a USB stick (shared, 4 shares) and a PCIe card
(whole): ``tpu:edgetpu_pci:1,tpu_shard:4``. The broker is not part of this test: a shard job
runs with no device of its own today (the Prolog learns shards from another change).
"""

from __future__ import annotations

import json
import os

import pytest

from harness.localcluster import NodeSpec
from helpers import TESTS, wait_until
from slurm_tpu.slurm.parse import parse_key_values

pytestmark = pytest.mark.slurm

ISOLATION_HARDWARE = TESTS / "isolation" / "hardware"
SHARED_STICK, WHOLE_CARD = "usb-2-1.3", "pci-0000:03:00.0"  # both nodes' stick has the same topology path
USERS = ("stpu_alice", "stpu_bob")


@pytest.fixture(scope="module")
def cluster(cluster_factory, users):
    from harness.localcluster.cluster import project_hooks

    started = cluster_factory(
        [
            NodeSpec("n4", str(ISOLATION_HARDWARE / "n4_one_tpu.umockdev"), cpus=4),
            NodeSpec("n1", str(ISOLATION_HARDWARE / "n1_two_tpus.umockdev")),
        ],
        hooks=project_hooks(),
        node_config_extra={"version": 2, "families": {"edgetpu": {"shared": [SHARED_STICK], "shares_per_device": 4}}},
    )
    out = os.path.join(started.base, "out")
    os.makedirs(out, exist_ok=True)
    os.chmod(out, 0o1777)  # both users' jobs write there
    return started


def out(cluster, name: str) -> str:
    return os.path.join(cluster.base, "out", name)


def node(cluster, name: str) -> dict[str, str]:
    return parse_key_values(cluster.command(["scontrol", "-o", "show", "node", name]).stdout)


def audit(cluster, name: str) -> list[dict]:
    path = os.path.join(cluster.node_dir(name), "state", "audit.log")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def squeue_states(cluster, jobs: list[int]) -> dict[int, str]:
    text = cluster.command(["squeue", "-h", "-o", "%i %T", "-j", ",".join(map(str, jobs))]).stdout
    return {int(job): state for job, state in (line.split() for line in text.splitlines())}


# Waits for the file the test creates once it has seen every shard job RUNNING at the same time.
WAIT_FOR_GO = """#!/bin/sh
touch {out}/$SLURM_JOB_ID.started
i=0
while [ ! -e {go} ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done
[ -e {go} ] && touch {out}/$SLURM_JOB_ID.released
"""


def test_nodes_offer_the_shares_and_only_whole_devices_as_tpu(cluster):
    n4, n1 = node(cluster, "n4"), node(cluster, "n1")
    assert n4["Gres"] == "tpu_shard:4", n4["Gres"]
    assert n1["Gres"] == "tpu:edgetpu_pci:1,tpu_shard:4", n1["Gres"]
    for state in (n4["State"], n1["State"]):
        assert state.split("+")[0] == "IDLE", state
    with open(cluster.gres_conf, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    assert "NodeName=n4 Name=tpu_shard Count=4" in lines and "NodeName=n1 Name=tpu_shard Count=4" in lines
    assert not any(SHARED_STICK in line for line in lines if " Name=tpu " in line)


def test_four_shard_jobs_of_two_users_run_at_once_on_one_tpu(cluster):
    go = out(cluster, "shards.go")
    script = WAIT_FOR_GO.format(out=os.path.join(cluster.base, "out"), go=go)
    jobs = [
        cluster.sbatch(["-w", "n4", "--gres=tpu_shard:1", "-o", "/dev/null"], script, user=USERS[i % 2])
        for i in range(4)
    ]
    fifth: list[int] = []
    try:
        # Slurm's own records: all four RUNNING at the same moment, on n4, each holding one share.
        wait_until(lambda: set(squeue_states(cluster, jobs).values()) == {"RUNNING"}, 90, "4 shard jobs RUNNING")
        running = squeue_states(cluster, jobs)
        assert running == dict.fromkeys(jobs, "RUNNING")
        for job in jobs:
            fields = parse_key_values(cluster.command(["scontrol", "-o", "show", "job", str(job)]).stdout)
            assert fields["NodeList"] == "n4" and "tpu_shard" in fields.get("TresPerNode", fields.get("Gres", ""))
        alloc = parse_key_values(cluster.command(["scontrol", "-d", "-o", "show", "node", "n4"]).stdout)
        assert "tpu_shard:4" in alloc.get("GresUsed", ""), alloc.get("GresUsed")
        # A fifth share does not exist: its job waits while the four run.
        fifth.append(
            cluster.sbatch(["-w", "n4", "--gres=tpu_shard:1", "-o", "/dev/null"], "#!/bin/sh\ntrue\n", USERS[0])
        )
        assert squeue_states(cluster, fifth) == {fifth[0]: "PENDING"}
    finally:
        open(go, "w").close()
    states = cluster.wait_for_jobs([*jobs, *fifth], timeout=120)
    assert set(states.values()) == {"COMPLETED"}, states
    for job in jobs:  # each job saw the go file, which exists only after all four were RUNNING
        assert os.path.exists(out(cluster, f"{job}.released"))
    users = {
        parse_key_values(cluster.command(["scontrol", "-o", "show", "job", str(j)]).stdout)["UserId"] for j in jobs
    }
    assert {u.split("(")[0] for u in users} == set(USERS)
    # A shared device is never leased: no acquire for these jobs.
    assert not [e for e in audit(cluster, "n4") if e.get("job_id") in jobs and e.get("event") == "acquire"]


def test_tpu_jobs_lease_only_the_whole_device_and_two_are_refused(cluster):
    script = "#!/bin/sh\ntrue\n"
    jobs = [cluster.sbatch(["--gres=tpu:1", "-o", "/dev/null"], script, user=USERS[i % 2]) for i in range(3)]
    states = cluster.wait_for_jobs(jobs, timeout=120)
    assert set(states.values()) == {"COMPLETED"}, states
    acquired = [e for e in audit(cluster, "n1") if e.get("job_id") in jobs and e.get("event") == "acquire"]
    assert len(acquired) == 3
    named = {json.dumps(e, sort_keys=True) for e in acquired}
    assert all(WHOLE_CARD in e and SHARED_STICK not in e for e in named), named
    assert not [e for e in audit(cluster, "n4") if e.get("job_id") in jobs]  # n4 has no tpu to give
    refused = cluster.command(["sbatch", "--gres=tpu:2", "--wrap", "true"], check=False, user=USERS[0])
    assert refused.returncode != 0
    assert "Requested node configuration is not available" in refused.stderr, refused.stderr


def test_more_shards_than_a_node_has_is_refused_at_submit(cluster):
    refused = cluster.command(["sbatch", "-N1", "--gres=tpu_shard:5", "--wrap", "true"], check=False, user=USERS[1])
    assert refused.returncode != 0
    assert "Requested node configuration is not available" in refused.stderr, refused.stderr
    four = cluster.sbatch(["-w", "n4", "--gres=tpu_shard:4", "-o", "/dev/null"], "#!/bin/sh\ntrue\n", USERS[1])
    assert cluster.wait_for_jobs([four], timeout=60) == {four: "COMPLETED"}


def test_shared_gpus_render_slurms_own_shard_and_run_a_shard_job(cluster_factory):
    """Slurm's gres/shard accepts what the GPU family renders: ``shard`` lines per GPU beside ``gpu``."""
    from helpers import HARDWARE

    gpus = cluster_factory(
        [NodeSpec("g1", str(HARDWARE / "big_node.umockdev"))],
        node_config_extra={"version": 2, "families": {"gpu": {"shared": ["a100_sxm4_80gb"], "shares_per_device": 2}}},
    )
    fields = node(gpus, "g1")
    # Slurm types each GPU's shards by the GPU's type (the shard lines name no Type=: Slurm's doc form).
    assert "shard:a100_sxm4_80gb:4" in fields["Gres"] and "gpu:a100_sxm4_80gb:2" in fields["Gres"], fields["Gres"]
    assert fields["State"].split("+")[0] == "IDLE", fields["State"]
    job = gpus.sbatch(["-w", "g1", "--gres=shard:2", "-o", "/dev/null"], "#!/bin/sh\ntrue\n")
    assert gpus.wait_for_jobs([job], timeout=60) == {job: "COMPLETED"}
    # More shards than one GPU holds: Slurm 22.05 takes the job at submit, but its gres/shard
    # places a job's shards on one GPU, so the job never starts here (what the docs say).
    spread = gpus.sbatch(["-w", "g1", "--gres=shard:3", "-o", "/dev/null"], "#!/bin/sh\ntrue\n")
    wait_until(lambda: "Reason=" in _job(gpus, spread) and "Reason=None" not in _job(gpus, spread), 30, "a reason")
    assert gpus.job_state(spread) == "PENDING" and "Reason=Resources" in _job(gpus, spread)
    gpus.command(["scancel", str(spread)])


def _job(cluster, job: int) -> str:
    return cluster.command(["scontrol", "-o", "show", "job", str(job)]).stdout
