"""The scale benchmark's run, small (bench/bench_scale.py runs it at 32 nodes x 10,000 jobs).

Five `slurmd -N` nodes with mixed simulated Edge TPUs (a USB stick; a PCIe card; a stick
and a card; two sticks and two cards; none), 150 short jobs from four real users (arrays
and single jobs, `--gres=tpu:1` and `:2`), one job cancelled while its prolog holds its
lease, one slurmd restarted under a running job, one USB stick unplugged and re-plugged
under the job that holds it (harness/localcluster/scale.py). Then: no two jobs held a
device at once (the jobs' own open/close stamps, and the audit log's pairing), no lease
left, no node drained, and every job accounted for by squeue and its own record.
"""

from __future__ import annotations

import json

import pytest

from helpers import USERS, require_root_and

pytestmark = pytest.mark.slurm

SMALL = ("usb1", "pcie1", "mixed2", "mixed4", "none")
JOBS = 150
# Two more users beside the suite's own, named for this test alone: a name another test uses
# (stpu_carol: tests/ops) could be removed under that test when this one ends.
MORE_USERS = ("stpu_scale_t3", "stpu_scale_t4")


@pytest.fixture(scope="module")
def report(users):
    require_root_and(("slurmctld", "slurmd", "munged", "umockdev-run", "useradd", "runuser"), "Slurm daemons")
    from harness.localcluster.scale import run_scale
    from harness.localcluster.users import real_users

    with real_users(MORE_USERS):
        found = run_scale(
            len(SMALL), JOBS, [*USERS, *MORE_USERS], ratio_jobs=20, cancels=1, restarts=1, hotplugs=1, pattern=SMALL
        )
    print(json.dumps({k: v for k, v in found.items() if k not in ("sdiag", "checks")}, indent=1))
    return found


def test_no_device_had_two_holders_and_nothing_is_left(report):
    checks = report["checks"]
    assert report["overlaps"] == 0, checks["overlap_details"]
    assert checks["audit_conflicts"] == [], checks["audit_conflicts"]
    assert report["leases_left"] == 0, checks["leases_left_details"]
    assert report["drained"] == 0, checks["drained_details"]
    assert checks["hook_failures"] == []
    # At least the two the events pinned (the restart's PCIe card, the hotplug's stick) were used
    # and checked; which others Slurm picked is its business.
    assert checks["devices_used"] >= 2


def test_every_job_is_accounted_for(report):
    checks = report["checks"]
    assert checks["unaccounted"] == [] and checks["records_missing"] == []
    assert checks["denied_opens"] == [] and checks["wrong_devices"] == []
    # 150 + 3 event jobs in the full run; warm-up and the two 20-job slices besides.
    assert report["jobs"] == JOBS + 3
    assert checks["cancelled_by_run"] == 1
    assert checks["completed"] == report["jobs_all_phases"] - 1


def test_the_events_happened_as_planned(report):
    events = {e["kind"]: e for e in report["full_run"]["events"]}
    assert set(events) == {"cancel", "restart", "hotplug"}
    # Cancelled while its prolog ran, holding its lease (released by the epilog: no lease left).
    assert events["cancel"]["leases_held_in_prolog"]
    assert events["restart"]["slurmd_start_after"] != events["restart"]["slurmd_start_before"]
    assert events["hotplug"]["node_after"] != events["hotplug"]["node_before"]
    assert report["checks"]["events_unverified"] == []


def test_the_report_has_the_benchmark_figures(report):
    for key in ("nodes", "jobs", "overlaps", "leases_left", "drained", "jobs_per_s_hooks", "jobs_per_s_true", "ratio"):
        assert key in report
    assert report["jobs_per_s_hooks"] > 0 and report["jobs_per_s_true"] > 0
    slices = report["sdiag"]
    # The /bin/true hooks ask the controller nothing; the prolog's allocation query (without our gres
    # plugin) is what the hooks add.
    assert slices["slice-true"]["REQUEST_JOB_INFO_SINGLE"] == 0
    assert isinstance(report["rpcs_per_job_from_hooks"], dict)
    assert report["ok"] is True


def test_the_hooks_cost_the_controller_one_job_query_per_job_and_nothing_else(report):
    """The prolog's allocation query is ``scontrol --local show job -d`` from the agent's resident
    scontrol: no REQUEST_FED_INFO before it (slurm_load_job's federation lookup, skipped by --local,
    which every path of the query uses) and no REQUEST_NODE_INFO per job (a new scontrol's start).
    With our gres/tpu plugin loaded (report["gres_plugin"], when one is built for this Slurm), the
    prolog reads every job's Edge TPUs from SLURM_JOB_TPUS and makes no query at all (every job of
    the run asks for a TPU). Counted by slurmctld itself (sdiag, by type)."""
    slices = report["sdiag"]
    hooks, true = slices["slice-hooks"], slices["slice-true"]
    by_type, jobs = hooks["by_type"], hooks["jobs"]
    assert by_type.get("REQUEST_FED_INFO", 0) <= true["by_type"].get("REQUEST_FED_INFO", 0) + 1, by_type
    node_info = by_type.get("REQUEST_NODE_INFO", 0) - true["by_type"].get("REQUEST_NODE_INFO", 0)
    if report["gres_plugin"]:
        assert hooks["REQUEST_JOB_INFO_SINGLE"] == 0, by_type
        assert node_info <= 1, by_type
        return
    # One per job; a second, narrowed query for an array task that shares its node (a few), or the
    # worker's own scontrol when the resident one stalled (a loaded machine).
    extra_queries = hooks["REQUEST_JOB_INFO_SINGLE"] - jobs
    assert 0 <= extra_queries <= 0.5 * jobs, by_type
    # A fresh scontrol (the worker's own, or the resident one restarted after a stall) may load the
    # node table once: at most two per extra query, never one per job as before the agent.
    assert node_info <= 2 * extra_queries + 1, by_type
