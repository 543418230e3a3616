"""The demo's pure parts: Slurm's job records, the lease audit, the timeline, preflight rules."""

from __future__ import annotations

import json
import os
import time

import pytest

from harness.demo import preflight
from harness.demo.errors import DemoError
from harness.demo.records import Lease, parse_audit, parse_jobcomp, select
from harness.demo.timeline import build_lanes, check_run, max_overlap, nice_step, render
from slurm_tpu.slurm import installation

# Captured from the demo cluster's jobcomp/filetxt (Slurm 22.05.8): a plain job, an array task.
JOBCOMP = """\
JobId=8 UserId=tpudemo(999) GroupId=tpudemo(995) Name=classify-cpu JobState=COMPLETED Partition=debug TimeLimit=5 StartTime=2026-11-22T02:43:38 EndTime=2026-11-22T02:43:40 NodeList=node-gpu NodeCnt=1 ProcCnt=2 WorkDir=/tmp/slurm-tpu-demo/out ReservationName= Tres=cpu=2,mem=1000M,node=1,billing=2 Account= QOS= WcKey= Cluster=unknown SubmitTime=2026-11-22T02:43:38 EligibleTime=2026-11-22T02:43:38 DerivedExitCode=0:0 ExitCode=0:0
JobId=27 UserId=tpudemo(999) GroupId=tpudemo(995) Name=batch-tpu JobState=COMPLETED Partition=debug TimeLimit=30 StartTime=2026-11-22T02:48:09 EndTime=2026-11-22T02:48:10 NodeList=node-pcie NodeCnt=1 ProcCnt=1 WorkDir=/tmp/slurm-tpu-demo/out ReservationName= Tres=cpu=1,mem=1000M,node=1,billing=1 Account= QOS= WcKey= Cluster=unknown SubmitTime=2026-11-22T02:48:09 EligibleTime=2026-11-22T02:48:09 ArrayJobId=25 ArrayTaskId=2 DerivedExitCode=0:0 ExitCode=0:0
JobId=31 UserId=tpudemo(999) GroupId=tpudemo(995) Name=classify-gpu JobState=FAILED Partition=debug TimeLimit=5 StartTime=Unknown EndTime=2026-11-22T02:49:00 NodeList=node-gpu NodeCnt=1 ProcCnt=1 WorkDir=/tmp ArrayJobId=0 DerivedExitCode=0:0 ExitCode=2:0
not a job line
"""

AUDIT = (
    "\n".join(
        json.dumps(e)
        for e in [
            {"event": "acquire", "identity": "usb-1-1.3", "job_id": 1, "t": 100.0, "uid": 999},
            {
                "event": "acquire",
                "identity": "usb-1-1.3",
                "job_id": 9,
                "t": 100.5,
                "uid": 999,
            },  # another job, same device
            {"event": "release", "identity": "usb-1-1.3", "job_id": 1, "t": 101.5, "uid": 999},
            {"event": "reclaim", "identity": "usb-1-1.3", "job_id": 9, "t": 102.0},
            {"event": "acquire", "identity": "usb-1-1.3", "job_id": 2, "t": 103.0, "uid": 999},
        ]
    )
    + "\nnot json\n"
)


def test_jobcomp_lines_become_records_with_array_ids_and_local_times():
    records = parse_jobcomp(JOBCOMP)
    assert [r.job_id for r in records] == [8, 27, 31]
    plain, task, failed = records
    assert (plain.user, plain.name, plain.node, plain.state, plain.exit_code) == (
        "tpudemo",
        "classify-cpu",
        "node-gpu",
        "COMPLETED",
        "0:0",
    )
    assert plain.end - plain.start == 2
    assert plain.start == time.mktime(time.strptime("2026-11-22T02:43:38", "%Y-%m-%dT%H:%M:%S"))
    assert (task.array_job_id, task.array_task_id, task.submitted_as) == (25, 2, 25)
    assert (failed.start, failed.array_job_id, failed.exit_code) == (None, None, "2:0")
    assert [r.job_id for r in select(records, [25, 31])] == [27, 31]


def test_audit_pairs_each_acquire_with_its_own_release_and_keeps_open_leases():
    leases = parse_audit(AUDIT, "node-usb")
    assert leases == [
        Lease("node-usb", "usb-1-1.3", 1, 100.0, 101.5),
        Lease("node-usb", "usb-1-1.3", 9, 100.5, 102.0),
        Lease("node-usb", "usb-1-1.3", 2, 103.0, None),
    ]


def test_max_overlap_is_half_open():
    assert max_overlap([]) == 0
    assert max_overlap([(0, 1), (1, 2), (2, 3)]) == 1  # back to back: never two at once
    assert max_overlap([(0, 2), (1, 3), (1.5, 1.6)]) == 3
    assert max_overlap(iter([(0, 2), (1, 3)])) == 2  # a generator is read once


def _job(job_id, node, start, end, name="classify-tpu"):
    from harness.demo.records import JobRecord

    return JobRecord(job_id, name, "tpudemo", "COMPLETED", node, start, end, "0:0")


DEVICES = {
    "node-usb": ["usb-1-1.3"],
    "node-pcie": ["pci-0000:01:00.0", "pci-0000:02:00.0"],
    "node-gpu": [],
    "node-plain": [],
}


def test_checks_hold_for_a_serial_usb_node_and_a_paired_pcie_node():
    tpu = [_job(1, "node-usb", 0, 1), _job(2, "node-usb", 1, 2), _job(3, "node-pcie", 0, 2), _job(4, "node-pcie", 0, 2)]
    leases = [
        Lease("node-usb", "usb-1-1.3", 1, 0.1, 0.9),
        Lease("node-usb", "usb-1-1.3", 2, 1.0, 1.9),
        Lease("node-pcie", "pci-0000:01:00.0", 3, 0.1, 1.9),
        Lease("node-pcie", "pci-0000:02:00.0", 4, 0.1, 1.9),
    ]
    plain = [_job(10 + i, node, 0, 1, "classify-cpu") for i, node in enumerate(DEVICES)]
    checks = check_run(tpu, plain, leases, DEVICES)
    assert all(c.ok for c in checks), checks
    assert "node-pcie 2/2" in checks[2].text and "node-usb 1/1" in checks[2].text


def test_checks_catch_a_shared_device_a_tpu_job_off_tpu_nodes_and_a_plain_job_with_a_tpu():
    tpu = [_job(1, "node-usb", 0, 2), _job(2, "node-usb", 0, 2), _job(3, "node-gpu", 0, 1)]
    leases = [
        Lease("node-usb", "usb-1-1.3", 1, 0.0, 2.0),
        Lease("node-usb", "usb-1-1.3", 2, 1.0, 2.0),
        Lease("node-pcie", "pci-0000:01:00.0", 10, 0.0, 1.0),
    ]
    plain = [_job(10, "node-pcie", 0, 1, "classify-cpu")]
    ok = {c.text.split(" (")[0]: c.ok for c in check_run(tpu, plain, leases, DEVICES)}
    assert ok == {
        "TPU jobs ran only on TPU nodes": False,
        "each TPU job held exactly one Edge TPU of its node": False,
        "never more TPU jobs at once than the node has TPUs": False,
        "no Edge TPU was ever held by two jobs at once": False,
        "plain jobs held no Edge TPU": False,
    }


def test_chart_draws_device_lanes_and_packs_cpu_jobs_into_as_few_lanes_as_overlap_needs():
    jobs = [
        _job(1, "node-usb", 0, 1),
        _job(5, "node-gpu", 0, 2, "x"),
        _job(6, "node-gpu", 1, 2, "x"),
        _job(7, "node-gpu", 2, 3, "x"),
    ]
    leases = [Lease("node-usb", "usb-1-1.3", 1, 0.0, 1.0)]
    lanes = build_lanes(
        jobs, leases, {"node-usb": ["usb-1-1.3"], "node-gpu": []}, {1: "A", 5: "a", 6: "b", 7: "c"}, step=0.5
    )
    assert [(lane.node, lane.label, [b.symbol for b in lane.bars]) for lane in lanes] == [
        ("node-usb", "usb-1-1.3", ["A"]),
        ("node-gpu", "cpu", ["a", "c"]),
        ("node-gpu", "cpu", ["b"]),
    ]
    chart = render(lanes, 0.0, 0.5, 7)
    assert chart[1:] == ["node-usb  usb-1-1.3  AA.....", "node-gpu  cpu        aaaacc.", "          cpu        ..bb..."]
    assert chart[0].split() == ["|0s"]
    assert nice_step(4, 56) == 0.25 and nice_step(40, 56) == 1 and nice_step(200, 56) == 5


def test_daemon_config_comes_from_dash_f_then_environment_then_default():
    assert installation.daemon_config(["slurmctld", "-D", "-f", "/x.conf"], {"SLURM_CONF": "/y"}) == "/x.conf"
    assert installation.daemon_config(["slurmd", "-f/z.conf"], {}) == "/z.conf"
    assert installation.daemon_config(["slurmd", "-N", "n1"], {"SLURM_CONF": "/y"}) == "/y"
    assert installation.daemon_config(["slurmd"], {}) == "/etc/slurm/slurm.conf"


def test_own_and_other_local_clusters_are_not_foreign_but_anything_else_is(tmp_path):
    own = tmp_path / "own.conf"
    local = tmp_path / "local.conf"
    local.write_text(preflight.LOCALCLUSTER_HEADER + "/tmp/slurm-tpu-test-x\nClusterName=stpu\n")
    system = tmp_path / "system.conf"
    system.write_text("ClusterName=site\n")
    daemons = [preflight.SlurmDaemon(10, "slurmctld", str(own)), preflight.SlurmDaemon(11, "slurmd", str(local))]
    assert preflight.foreign_slurm(str(own), daemons, {22, 80}) is None
    site = preflight.SlurmDaemon(12, "slurmd", str(system))
    assert preflight.foreign_slurm(str(own), daemons + [site], set()) == f"slurmd pid 12, config {system}"
    assert "port 6817" in preflight.foreign_slurm(str(own), daemons, {6817})


def test_listening_ports_reads_proc_net_tcp(tmp_path):
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text(
        "  sl  local_address rem_address   st\n"
        "   0: 0100007F:1AA1 00000000:0000 0A 00000000:00000000\n"  # 127.0.0.1:6817 LISTEN
        "   1: 0100007F:9C40 0100007F:1AA1 01 00000000:00000000\n"
    )  # an established connection
    assert preflight.listening_ports(str(tmp_path)) == {6817}


def test_base_directory_must_be_absent_empty_or_the_demos(tmp_path):
    preflight.check_base(str(tmp_path / "new"))
    preflight.check_base(str(tmp_path))  # empty
    (tmp_path / "gres.conf").write_text("")  # what the old detect-only demo.sh left there
    preflight.check_base(str(tmp_path))
    (tmp_path / "thesis.tex").write_text("")
    with pytest.raises(DemoError, match="was not made by the demo"):
        preflight.check_base(str(tmp_path))
    (tmp_path / ".slurm-tpu-demo").write_text("{}")
    preflight.check_base(str(tmp_path))
    os.symlink(tmp_path, tmp_path.parent / "link-to-base")
    with pytest.raises(DemoError, match="symlink"):
        preflight.check_base(str(tmp_path.parent / "link-to-base"))
    with pytest.raises(DemoError, match="absolute"):
        preflight.check_base("relative/dir")


def test_shard_jobs_within_one_second_still_count_as_running_together():
    """Slurm's records hold whole seconds: a warm shard job can start and end in the same one."""
    from harness.demo.report import _max_overlap

    jobs = [_job(72, "node-shard", 10, 10), _job(73, "node-shard", 10, 11), _job(74, "node-shard", 12, 12)]
    assert _max_overlap(jobs) == (2, [72, 73])
    assert _max_overlap([_job(75, "node-shard", 10, 11), _job(76, "node-shard", 12, 13)]) == (1, [75])
