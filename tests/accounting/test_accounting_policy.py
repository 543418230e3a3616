"""Slurm's own limits on accelerators, with real users on a real cluster with slurmdbd.

The recipes of docs/accounting.md ("Slurm's own accounting: sacct, sreport, QOS limits"), each
checked the way a user meets it: a per-user TPU cap (QOS ``MaxTRESPerUser``) holds
her second job pending; a TPU-minutes budget (``GrpTRESMins`` with ``safe``) keeps
a job that would overrun it from starting; ``DenyOnLimit`` refuses an over-cap
request at submit; and naming a QOS she is not allowed is refused, so the cap
cannot be bypassed.
"""

from __future__ import annotations

import pytest

from conftest import controller_view, job_field
from helpers import TESTS, wait_until

pytestmark = pytest.mark.slurm
ALICE, BOB = "stpu_alice", "stpu_bob"
SLEEP = "#!/bin/sh\nexec sleep 600\n"


@pytest.fixture(scope="module")
def cluster(accounting_factory):
    from harness.localcluster import NodeSpec

    cluster = accounting_factory(
        [NodeSpec("n1", str(TESTS / "isolation" / "hardware" / "n1_two_tpus.umockdev"), cpus=4)]
    )
    # The recipes: a capped QOS (per user at most one TPU; DenyOnLimit refuses a job over a
    # per-job cap at submit), and a wide one alice is not allowed.
    cluster.sacctmgr(
        "add", "qos", "tpucap", "MaxTRESPerUser=gres/tpu=1", "MaxTRESPerJob=gres/tpu=1", "Flags=DenyOnLimit"
    )
    cluster.sacctmgr("add", "qos", "wide")
    cluster.sacctmgr("modify", "user", ALICE, "set", "qos=tpucap", "defaultqos=tpucap")
    # The controller has the QOS (one update carries all its limits) and lets alice use it.
    wait_until(lambda: "MaxTRESPJ=gres/tpu=1" in controller_view(cluster, "qos", "tpucap"), 60, "the QOS")
    wait_until(
        lambda: (
            cluster.command(
                ["sbatch", "--test-only", "--qos=tpucap", "--wrap=true"], user=ALICE, check=False
            ).returncode
            == 0
        ),
        60,
        "alice allowed QOS tpucap",
    )
    return cluster


@pytest.fixture
def cleanup(cluster):
    jobs: list[int] = []
    yield jobs
    if jobs:
        cluster.command(["scancel", *map(str, jobs)], check=False)
        cluster.wait_for_jobs(jobs, timeout=120)


def test_qos_cap_holds_a_users_second_tpu_job_pending(cluster, cleanup):
    first = cluster.sbatch(["--gres=tpu:1", "-o", "/dev/null"], SLEEP, user=ALICE)
    cleanup.append(first)
    second = cluster.sbatch(["--gres=tpu:1", "-o", "/dev/null"], SLEEP, user=ALICE)
    cleanup.append(second)
    wait_until(lambda: cluster.job_state(first) == "RUNNING", 60, "alice's first job to run")
    # The node has a second TPU free; only the QOS holds her second job back.
    wait_until(
        lambda: job_field(cluster, second, "Reason") == "QOSMaxGRESPerUser",
        60,
        "alice's second job pending with QOSMaxGRESPerUser",
    )
    assert cluster.job_state(second) == "PENDING"
    # The cap is hers: bob (QOS normal) takes the second TPU.
    other = cluster.sbatch(["--gres=tpu:1", "-o", "/dev/null"], SLEEP, user=BOB)
    cleanup.append(other)
    wait_until(lambda: cluster.job_state(other) == "RUNNING", 60, "bob's job to run beside alice's")
    assert job_field(cluster, second, "Reason") == "QOSMaxGRESPerUser"


def test_deny_on_limit_refuses_an_over_cap_request_at_submit(cluster):
    refused = cluster.command(["sbatch", "--gres=tpu:2", "-o", "/dev/null"], user=ALICE, input=SLEEP, check=False)
    assert refused.returncode != 0
    assert "Job violates accounting/QOS policy" in refused.stderr, refused.stderr


def test_a_user_cannot_bypass_her_cap_by_naming_another_qos(cluster):
    for qos in ("wide", "normal"):
        refused = cluster.command(
            ["sbatch", f"--qos={qos}", "--gres=tpu:2", "-o", "/dev/null"], user=ALICE, input=SLEEP, check=False
        )
        assert refused.returncode != 0, f"--qos={qos} accepted"
        assert "Invalid qos specification" in refused.stderr, refused.stderr


def test_tpu_minutes_budget_keeps_a_job_that_would_overrun_it_from_starting(cluster, cleanup):
    # bob's budget: 2 TPU-minutes. With AccountingStorageEnforce=...,safe a job runs only
    # if it can finish within what is left: 1 TPU for 1 minute does, 1 TPU for 5 does not.
    cluster.sacctmgr("modify", "user", BOB, "set", "GrpTRESMins=gres/tpu=2")
    try:
        wait_until(
            lambda: ",gres/tpu=2(" in controller_view(cluster, "assoc", BOB), 60, "bob's budget at the controller"
        )
        over = cluster.sbatch(["--gres=tpu:1", "--time=5", "-o", "/dev/null"], SLEEP, user=BOB)
        cleanup.append(over)
        within = cluster.sbatch(["--gres=tpu:1", "--time=1", "-o", "/dev/null"], SLEEP, user=BOB)
        cleanup.append(within)
        wait_until(lambda: cluster.job_state(within) == "RUNNING", 60, "bob's job within budget to run")
        wait_until(
            lambda: job_field(cluster, over, "Reason") == "AssocGrpGRESMinutes",
            60,
            "the over-budget job pending with AssocGrpGRESMinutes",
        )
        assert cluster.job_state(over) == "PENDING"
    finally:
        cluster.sacctmgr("modify", "user", BOB, "set", "GrpTRESMins=gres/tpu=-1")
