"""Stress: 300 short TPU jobs from two users on one two-TPU node.

The audit log must show, per device, strictly alternating acquire/release (no
overlapping leases) and every lease released; the node ends idle and undrained.
"""

from __future__ import annotations

import os
import time

import pytest
from support import audit, inventory, leases, no_overlaps, one_node_two_tpus, owner, wait_until

pytestmark = pytest.mark.slurm

JOBS_PER_USER = 150


@pytest.fixture(scope="module")
def cluster():
    yield from one_node_two_tpus()


@pytest.fixture(scope="module")
def stress_run(cluster, users) -> list[str]:
    """Run the 300 jobs once per module; their final states. Each test that looks at
    the run asks for it, so any of them can run alone (`pytest -k report`)."""
    script = '#!/bin/sh\ntest -n "$SLURM_TPU_DEVICES"\n'  # fails the job if the env is missing
    for user in ("stpu_alice", "stpu_bob"):
        cluster.sbatch(
            [f"--array=0-{JOBS_PER_USER - 1}", "-w", "n1", "--gres=tpu:1", "-o", "/dev/null", "-e", "/dev/null"],
            script,
            user=user,
        )
    final = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
    deadline = time.monotonic() + 480
    while time.monotonic() < deadline:
        out = cluster.command(["squeue", "-h", "-r", "-t", "all", "-o", "%i %T"]).stdout.split("\n")
        states = [line.split()[1] for line in out if line.strip()]
        if len(states) >= 2 * JOBS_PER_USER and all(s in final for s in states):
            break
        time.sleep(1)
    # A job is over for Slurm once its epilog ran; a USB stick's lease ends only when the
    # stick is back from its revocation (udev), moments later: wait for that event.
    wait_until(lambda: leases(cluster, "n1") == [], 60, "the last leases to end")
    return states


def test_300_jobs_from_two_users_never_share_a_device(cluster, users, stress_run):
    states = stress_run
    assert states.count("COMPLETED") == 2 * JOBS_PER_USER, {s: states.count(s) for s in set(states)}
    records = audit(cluster, "n1")
    per_device = no_overlaps(records)
    assert sum(per_device.values()) == 2 * JOBS_PER_USER
    assert set(per_device) == {"usb-2-1.3", "pci-0000:03:00.0"}
    uids = {r["uid"] for r in records if r["event"] == "acquire"}
    assert uids == {users["stpu_alice"], users["stpu_bob"]}
    assert not [r for r in records if r["event"] in ("reclaim", "rollback", "survivor")]
    assert leases(cluster, "n1") == []
    for nodes in inventory(cluster, "n1").values():
        assert owner(nodes[0]) == (0, 0, 0o600)
    # Idle and not drained; 25.11's backfill may leave its PLANNED flag for a moment (IDLE+PLANNED).
    assert cluster.node_states()["n1"] in ("IDLE", "IDLE+PLANNED")


def test_report_totals_match_the_audit_log(cluster, users, stress_run):
    """slurm-tpu report on the stress run agrees with sums taken straight from the audit log."""
    import json
    import subprocess

    records = audit(cluster, "n1")
    started: dict[tuple[str, int], dict] = {}
    expected: dict[str, dict] = {}
    for event in records:
        key = (event.get("identity"), event.get("job_id"))
        if event["event"] == "acquire":
            started[key] = event
        elif event["event"] in ("revoke", "release") and key in started:  # a USB lease ends at its revocation
            acquire = started.pop(key)
            name = next(n for n, uid in users.items() if uid == acquire["uid"])
            totals = expected.setdefault(name, {"jobs": set(), "seconds": 0.0})
            totals["jobs"].add(acquire["job_id"])
            totals["seconds"] += event["t"] - acquire["t"]
    assert not started
    audit_log = os.path.join(cluster.node_dir("n1"), "state", "audit.log")
    result = subprocess.run(
        [*cluster.slurm_tpu, "report", "--by", "user", "--json", "--audit", audit_log],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"stpu_alice", "stpu_bob"}
    for name, totals in expected.items():
        assert report[name]["jobs"] == len(totals["jobs"]) == JOBS_PER_USER
        assert report[name]["leases"] == JOBS_PER_USER
        assert report[name]["lease_seconds"] == pytest.approx(totals["seconds"], abs=0.01)
    by_device = json.loads(
        subprocess.run(
            [*cluster.slurm_tpu, "report", "--by", "device", "--json", "--audit", audit_log],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
    assert sum(d["leases"] for d in by_device.values()) == 2 * JOBS_PER_USER
