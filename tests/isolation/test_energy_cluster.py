"""A GPU job's energy against a real local Slurm cluster: node n1 has two NVIDIA GPUs (a umockdev
description, the driver's /dev/nvidiaN), gres gpu, GPUs not leased (the default), and the NVML double
as ``energy.nvml_library``. Two jobs of two users, one GPU each, get exactly their own GPU's counter
delta; neither user can read or change a start file.
"""

from __future__ import annotations

import os

import pytest
from support import REPO, audit, finish_cluster, make_cluster, open_as, require_root_and_slurm, state_dir, wait_until

import nvml_double

# smt_gpu_node's gres.conf binds each GPU to Cores of its 8 CPUs; on a 2-CPU machine Slurm 25.11 sets
# the node INVAL ("invalid GRES core specification") where 22.05 takes it: run on the system Slurm only.
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        bool(os.environ.get("SLURM_TPU_TEST_SLURM")),
        reason="smt_gpu_node's GPU Cores exceed this machine's CPUs, which Slurm 25.11 refuses (22.05 runs it)",
    ),
]
NODE_HARDWARE = os.path.join(REPO, "tests", "hardware", "smt_gpu_node.umockdev")
GPUS = {"pci-0000:17:00.0": "00000000:17:00.0", "pci-0000:b3:00.0": "00000000:b3:00.0"}
START_MJ = {"pci-0000:17:00.0": 40_000_000_000, "pci-0000:b3:00.0": 90_000_000_000}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_root_and_slurm()
    from harness.localcluster.cluster import NodeSpec

    nvml = tmp_path_factory.mktemp("nvml")
    os.chmod(nvml, 0o755)
    try:
        library = nvml_double.build(nvml)
    except RuntimeError as exc:
        pytest.skip(str(exc))
    gpus = library.parent / "state"  # the double's default: beside it (slurmd passes the hooks no variable)
    for identity, bus_id in GPUS.items():
        nvml_double.set_gpu(gpus, bus_id, energy_mj=START_MJ[identity], power_mw=250_000)
    started = make_cluster(
        [NodeSpec("n1", NODE_HARDWARE)], node_config_extra={"energy": {"nvml_library": str(library)}}
    )
    started.gpus = gpus
    yield started
    finish_cluster(started)


HOLD = """#!/bin/sh
touch {out}/{tag}.started
i=0
while [ ! -e {out}/{tag}.stop ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
"""


def test_two_jobs_get_exactly_their_own_gpus_counter_delta(cluster, users):
    out = os.path.join(cluster.base, "out")
    jobs = {}
    for user, tag in (("stpu_alice", "e1"), ("stpu_bob", "e2")):
        jobs[tag] = cluster.sbatch(
            ["-w", "n1", "--gres=gpu:1", "-o", "/dev/null", "-e", f"{out}/{tag}.err"],
            HOLD.format(out=out, tag=tag),
            user=user,
        )
    for tag, job in jobs.items():
        wait_until(lambda: os.path.exists(f"{out}/{tag}.started"), 60, f"job {job} to start")
    energy_dir = os.path.join(state_dir(cluster, "n1"), "energy")
    starts = {job: os.path.join(energy_dir, str(job)) for job in jobs.values()}
    assert all(os.path.exists(path) for path in starts.values())
    # Root's own files: neither user can read, replace or add one (the directory is root's 0700).
    for user in ("stpu_alice", "stpu_bob"):
        for path in starts.values():
            assert open_as(user, path) == "EACCES"
        assert open_as(user, os.path.join(energy_dir, "999")) == "EACCES"
    # Each GPU burns a different amount while both jobs run.
    burned = {"pci-0000:17:00.0": 1_234_567, "pci-0000:b3:00.0": 7_654_321}
    for identity, bus_id in GPUS.items():
        nvml_double.set_gpu(cluster.gpus, bus_id, energy_mj=START_MJ[identity] + burned[identity])
    for tag in jobs:
        open(f"{out}/{tag}.stop", "w").close()
    states = cluster.wait_for_jobs(list(jobs.values()), timeout=60)
    assert set(states.values()) == {"COMPLETED"}
    events = [e for e in audit(cluster, "n1") if e["event"] == "energy" and e["job_id"] in jobs.values()]
    by_job = {e["job_id"]: e for e in events}
    assert len(events) == 2 and set(by_job) == set(jobs.values())
    assert {e["identity"] for e in events} == set(GPUS)  # one GPU each, different ones
    for event in events:
        assert event["method"] == "measured"
        assert event["joules"] == pytest.approx(burned[event["identity"]] / 1000, abs=1e-3)
    assert not any(os.path.lexists(path) for path in starts.values())  # read once, removed
