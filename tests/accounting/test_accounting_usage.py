"""A job's inference figures in Slurm's own job record (AdminComment), and `slurm-tpu report` from sacct.

runner (job user) -> usage box -> epilog (root) spools the job's totals in the
node's accounting spool -> `slurm-tpu accounting-collect` (root) -> `sacctmgr modify job
... set AdminComment=` -> `sacct -o AdminComment`, and the entry is removed once a
later run finds the item still there (a window later: WINDOW seconds here). The figures cannot be forged
by the job's user: the spool is root's, Slurm refuses her own `sacctmgr modify
job` of AdminComment, and an implausible usage record of hers is refused. The
report's TPU-seconds equal sreport's after a forced rollup.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys

import pytest

from helpers import TESTS, double_root, repo_hooks, runner_job_workspace, wait_until

# A job that reported no busy time: its stick's idle power over the job, estimated.
IDLE_ONLY = r"slurm-tpu/n1:devices=1,inferences=0,inference_seconds=0,energy_j=[0-9.]+,energy_method=estimated"

pytestmark = pytest.mark.slurm
USER = "stpu_carol"
IDENTITY = "usb-2-1.3"  # the one stick of n4_one_tpu
WINDOW = "1"  # the collector's --window: an item written is confirmed a second later


@pytest.fixture(scope="module")
def setup(accounting_factory):
    from harness.localcluster import NodeSpec

    with runner_job_workspace("slurm-tpu-accounting-", USER, image_count=3) as (_, models, double):
        cluster = accounting_factory(
            [NodeSpec("n1", str(TESTS / "isolation" / "hardware" / "n4_one_tpu.umockdev"))], hooks=repo_hooks()
        )
        cluster.add_accounting_users([USER])
        out_dir = os.path.join(cluster.base, "out")
        os.makedirs(out_dir, exist_ok=True)
        os.chmod(out_dir, 0o1777)  # the job's user writes its stderr here
        collect(cluster)  # the first run makes the spool: from now on the epilog spools
        yield cluster, models, double


def collect(cluster) -> subprocess.CompletedProcess:
    """`slurm-tpu accounting-collect` as root on the node."""
    env = cluster.env({"SLURM_TPU_CONFIG": cluster.node_config("n1")})
    return subprocess.run(
        [*cluster.slurm_tpu, "accounting-collect", "--window", WINDOW],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def admin_comment(cluster, job: int) -> str:
    out = cluster.command(["sacct", "-n", "-P", "-X", "-j", str(job), "-o", "AdminComment"]).stdout
    return out.strip().splitlines()[-1] if out.strip() else ""


def collected(cluster, job: int) -> str:
    """The job's AdminComment once a collector run has confirmed its entry and removed it (collecting
    again until then: slurmctld sends the job's end to slurmdbd asynchronously, and an item is
    confirmed by a run at least WINDOW after its write)."""

    def confirmed() -> str:
        result = collect(cluster)
        assert result.returncode == 0, result.stderr
        return f"job {job}: done, AdminComment=" in result.stdout and admin_comment(cluster, job)

    return wait_until(confirmed, 90, f"job {job}'s AdminComment, confirmed")


def run_job(cluster, script: str) -> int:
    err = os.path.join(cluster.base, "out", "job.err")
    job = cluster.sbatch(["--gres=tpu:1", "-o", "/dev/null", "-e", err], script, user=USER)
    assert cluster.wait_for_jobs([job], timeout=120)[job] == "COMPLETED", open(err).read()
    return job


def spool_dir(cluster) -> str:
    return cluster.accounting_spool("n1")


def test_a_jobs_inferences_reach_its_admin_comment(setup):
    cluster, models, double = setup
    job = run_job(
        cluster,
        f"""#!/bin/sh
export SLURM_TPU_LIBEDGETPU={double} EDGETPU_DOUBLE_DEVICES=usb:/sys/bus/usb/devices/2-1.3
export EDGETPU_DOUBLE_ROOT={double_root(cluster)}
exec {sys.executable} -m slurm_tpu.cli infer {models["classifier"]} {models["images"]}/img_00001.png -c 12
""",
    )
    comment = collected(cluster, job)
    assert comment.startswith("slurm-tpu/n1:devices=1,inferences=12,inference_seconds="), comment
    # Root's energy figure on the stick: the power model with the runner's (bounded) busy time.
    assert re.search(r",energy_j=[0-9.]+,energy_method=self-reported$", comment), comment
    assert not os.path.exists(os.path.join(spool_dir(cluster), str(job)))  # removed once Slurm took it
    # Only root reads or writes the spool; the user cannot plant an entry there.
    info = os.stat(spool_dir(cluster))
    assert info.st_uid == 0 and info.st_mode & 0o777 == 0o700
    plant = cluster.command(["sh", "-c", f"echo inferences=999 > {spool_dir(cluster)}/{job}"], user=USER, check=False)
    assert plant.returncode != 0
    # Slurm refuses the user's own change of her job's AdminComment; the figures stay.
    forged = cluster.command(
        [
            "sacctmgr",
            "-i",
            "modify",
            "job",
            "where",
            f"jobid={job}",
            "set",
            "AdminComment=slurm-tpu/n1:devices=1,inferences=999999,inference_seconds=1",
        ],
        user=USER,
        check=False,
    )
    assert forged.returncode != 0
    assert "privilege" in forged.stderr or "denied" in forged.stderr, forged.stderr
    assert admin_comment(cluster, job) == comment


def test_a_forged_usage_record_of_the_job_is_refused(setup):
    cluster, _, _ = setup
    # The job writes its own usage record with an implausible count: the epilog refuses it,
    # so the job's record says it made no inferences.
    job = run_job(
        cluster,
        f"""#!/bin/sh
printf '{{"version": 1, "inferences": 1e400, "seconds": 1, "energy_j": null}}' > "$SLURM_TPU_USAGE_DIR/{IDENTITY}.json"
""",
    )
    assert re.fullmatch(IDLE_ONLY, collected(cluster, job))


def test_each_array_task_gets_its_own_figures(setup):
    """An array task's own id is not what Slurm's tools select it by: ``-j <array id>`` means every task,
    and the last task carries the array's id, so its figures must not land on its siblings' records."""
    cluster, models, double = setup
    # Task 1 (the one that keeps the array's id) waits until task 0's figures are in its record.
    gate = os.path.join(cluster.base, "out", "task-0-collected")
    script = f"""#!/bin/sh
export SLURM_TPU_LIBEDGETPU={double} EDGETPU_DOUBLE_DEVICES=usb:/sys/bus/usb/devices/2-1.3
export EDGETPU_DOUBLE_ROOT={double_root(cluster)}
if [ "$SLURM_ARRAY_TASK_ID" = 1 ]; then
    while [ ! -e {gate} ]; do sleep 0.2; done
fi
exec {sys.executable} -m slurm_tpu.cli infer {models["classifier"]} {models["images"]}/img_00001.png \
    -c $((3 + 4 * SLURM_ARRAY_TASK_ID))
"""
    array = cluster.sbatch(["--array=0-1", "--gres=tpu:1", "-o", "/dev/null"], script, user=USER)

    def task(index: int) -> dict[str, str]:
        from slurm_tpu.slurm.parse import parse_key_values

        return parse_key_values(cluster.command(["scontrol", "-o", "show", "job", f"{array}_{index}"]).stdout)

    def comment(index: int) -> str:
        return cluster.command(
            ["sacct", "-n", "-P", "-X", "-j", f"{array}_{index}", "-o", "AdminComment"]
        ).stdout.strip()

    # One TPU: the tasks run one after the other; each is collected as soon as it is done.
    for index in (0, 1):
        wait_until(
            lambda: task(index).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"), 120, f"task {index} to finish"
        )
        assert task(index)["JobState"] == "COMPLETED"
        wait_until(lambda: collect(cluster).returncode == 0 and comment(index), 90, f"task {index}'s AdminComment")
        open(gate, "w").close()
    assert comment(0).startswith("slurm-tpu/n1:devices=1,inferences=3,"), comment(0)
    assert comment(1).startswith("slurm-tpu/n1:devices=1,inferences=7,"), comment(1)


def test_an_entry_waits_while_slurmdbd_is_down_and_is_applied_when_it_is_back(setup):
    cluster, _, _ = setup
    cluster.stop_slurmdbd()
    try:
        job = run_job(cluster, "#!/bin/sh\ntrue\n")  # the controller queues its record meanwhile
        entry = os.path.join(spool_dir(cluster), str(job))
        assert os.path.exists(entry)  # the epilog spooled it, slurmdbd or not
        result = collect(cluster)
        assert result.returncode == 0 and f"job {job}: waits (" in result.stdout, result.stdout + result.stderr
        assert os.path.exists(entry)  # kept for the next run
    finally:
        cluster.start_slurmdbd()
    assert re.fullmatch(IDLE_ONLY, collected(cluster, job))
    assert not os.path.exists(entry)


def test_report_reads_sacct_and_equals_sreport(setup):
    cluster, _, _ = setup
    job = run_job(cluster, "#!/bin/sh\nsleep 2\n")
    collected(cluster, job)
    # sreport counts per hour, from the hourly usage tables (rolled up hourly: forced here),
    # and 22.05's ends a period that reaches past now at the current hour's start unless it
    # is one hour long. So: the hour the last job started in; the report is asked for the
    # same period (both count only what lies within it).
    started = cluster.command(["sacct", "-n", "-P", "-X", "-j", str(job), "-o", "Start"]).stdout.strip()
    hour = datetime.datetime.fromisoformat(started).replace(minute=0, second=0)
    start, end = hour.isoformat(), (hour + datetime.timedelta(hours=1)).isoformat()

    def sreport_used() -> dict[str, int]:
        cluster.sacctmgr("rollup", start, end)
        out = cluster.command(
            [
                "sreport",
                "-n",
                "-P",
                "-t",
                "seconds",
                "-T",
                "gres/tpu",
                "cluster",
                "UserUtilizationByAccount",
                f"start={start}",
                f"end={end}",
            ]
        ).stdout
        return {fields[1]: int(fields[-1]) for fields in (line.split("|") for line in out.splitlines() if line)}

    # The window's listing reaches slurmdbd's job table by its own path: wait until it has
    # this job (seen lagging behind `sacct -j` and the AdminComment on a busy machine).
    wait_until(
        lambda: (
            str(job)
            in cluster.command(
                ["sacct", "-n", "-P", "-X", f"--user={USER}", "-S", start, "-E", end, "-o", "JobIDRaw"]
            ).stdout.split()
        ),
        60,
        f"job {job} in sacct's listing of the period",
    )
    env = cluster.env({"SLURM_TPU_CONFIG": cluster.node_config("n1")})
    report = subprocess.run(
        [*cluster.slurm_tpu, "report", "--json", "--since", start, "--until", end],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    # What the report read, shown by pytest when an assertion below fails.
    print(
        cluster.command(
            [
                "sacct",
                "-a",
                "-n",
                "-P",
                "-X",
                "-S",
                start,
                "-E",
                end,
                "-o",
                "JobID,User,State,Start,End,Elapsed,AllocTRES,AdminComment",
            ]
        ).stdout
    )
    print(report.stdout)
    row = json.loads(report.stdout)[USER]
    assert row["source"] == "sacct"
    expected = row["tres_seconds"]["gres/tpu"]
    assert expected > 0
    # sreport answers from the rolled-up tables, which reach only as far as the last rollup
    # (the forced one or slurmdbd's own, which may have run mid-job): asked again until its
    # figure for her is sacct's; a report that disagreed with sacct would never get there.
    seen: list[dict[str, int]] = []

    def sreport_agrees() -> bool:
        seen.append(sreport_used())
        return seen[-1].get(USER) == expected

    try:
        wait_until(sreport_agrees, 60, "sreport's usage")
    except AssertionError:
        jobs = cluster.command(
            [
                "sacct",
                "-n",
                "-P",
                "-X",
                f"--user={USER}",
                "-S",
                start,
                "-E",
                end,
                "-o",
                "JobID,State,Start,End,Elapsed,AllocTRES",
            ]
        ).stdout
        raise AssertionError(
            f"report: {expected} TPU-seconds for {USER}; sreport said {seen[-3:]}; sacct:\n{jobs}"
        ) from None
    # Her inferences: the sum of her jobs' AdminComments (the first test's job made 12).
    comments = cluster.command(["sacct", "-n", "-P", "-X", f"--user={USER}", "-S", start, "-o", "AdminComment"]).stdout
    from slurm_tpu.protocol.job_record import parse_admin_comment

    assert row["inferences"] == sum(
        int(figures["inferences"]) for line in comments.splitlines() for figures in parse_admin_comment(line).values()
    )
    assert row["jobs"] == len(comments.splitlines())
