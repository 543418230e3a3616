"""The demo's Slurm books: the job user's association, one QOS cap shown holding a job, TPU-hours from sreport.

The demo cluster runs its own MariaDB + slurmdbd (LocalCluster(accounting=True)).
Here: the job user gets an association (enforcement refuses jobs without one) and
may use QOS ``onetpu`` (at most one TPU per user; not her default, so the
experiment's TPU jobs still run side by side); each node's accounting collector
runs once so that the epilogs spool the jobs' figures. At the end: two jobs under
``--qos=onetpu`` show the cap (the second pends with ``QOSMaxGRESPerUser``; both are
then cancelled), the collectors put each job's inference figures into its
AdminComment, and sreport gives the TPU-hours per user; each job's energy on its accelerators,
with how it was obtained, comes from its AdminComment as ``slurm-tpu report`` reads it.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Sequence

from slurm_tpu.ops.accounting import JOULES_PER_KWH, JobRow, summarize_sacct
from slurm_tpu.slurm.parse import parse_key_values

from ..localcluster.cluster import LocalCluster
from .errors import DemoError
from .layout import NODES, Layout

ACCOUNT = "demo"
QOS = "onetpu"
CAP = "MaxTRESPerUser=gres/tpu=1"
HOLD = "#!/bin/sh\nexec sleep 300\n"
WINDOW_S = 2.0  # the collectors' window (slurm_tpu/ops/accounting.py): each runs here, one at a time


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise DemoError(f"{what} within {timeout:g} s")


def collect(cluster: LocalCluster, node: str):
    """What one run of the node's ``slurm-tpu accounting-collect`` does, in this (root) process: the demo
    stands in for each node's collector service without starting a Python per node."""
    from slurm_tpu.ops.accounting import collect as collect_spool
    from slurm_tpu.slurm.commands import Slurm

    # A short window: a written item is confirmed (and its entry removed) seconds later, not WINDOW_S.
    return collect_spool(cluster.accounting_spool(node), Slurm(cluster.slurm, cluster.env()), window=WINDOW_S)


def prepare(cluster: LocalCluster, user: str, others: Sequence[str] = ()) -> None:
    """The users' associations, ``user``'s QOS, and every node's spool (a collector's first run makes
    it). ``others``: users who submit too (the shard step's second user), with no QOS of their own."""
    cluster.add_accounting_users([user, *others], account=ACCOUNT)
    if not cluster.sacctmgr("-n", "-P", "show", "qos", QOS, "format=name").stdout.strip():
        cluster.sacctmgr("add", "qos", QOS, CAP)
    cluster.sacctmgr("modify", "user", user, "set", f"qos+={QOS}", check=False)  # 1: already allowed
    _wait(
        lambda: (
            cluster.command(["sbatch", "--test-only", f"--qos={QOS}", "--wrap=true"], user=user, check=False).returncode
            == 0
        ),
        60,
        f"slurmctld did not let {user} use QOS {QOS}",
    )
    for node in NODES:
        refused = collect(cluster, node.name).refused
        if refused:
            raise DemoError(f"the accounting spool of {node.name}: {next(iter(refused.values()))}")


def _job(cluster: LocalCluster, job: int) -> dict[str, str]:
    return parse_key_values(cluster.command(["scontrol", "-o", "show", "job", str(job)], check=False).stdout)


def show_limit(cluster: LocalCluster, user: str, out_dir: str) -> list[str]:
    """Two TPU jobs under the capped QOS: the first runs, the second pends with QOSMaxGRESPerUser."""
    args = ["--qos", QOS, "--gres=tpu:1", "-o", os.path.join(out_dir, "qos-cap-%j.out"), "-J", "qos-cap"]
    first = cluster.sbatch(args, HOLD, user=user)
    second = cluster.sbatch(args, HOLD, user=user)
    try:
        _wait(lambda: _job(cluster, first).get("JobState") == "RUNNING", 60, f"job {first} did not start")
        _wait(
            lambda: _job(cluster, second).get("Reason") == "QOSMaxGRESPerUser",
            60,
            f"job {second} was not held by QOS {QOS}",
        )
        node = _job(cluster, first).get("NodeList", "?")
    finally:
        cluster.command(["scancel", str(first), str(second)], check=False)
    cluster.wait_for_jobs([first, second], timeout=120)
    return [
        f"limit: QOS {QOS} ({CAP}) on 2 TPU jobs of {user}:",
        f"  {first} RUNNING on {node}, {second} PENDING (QOSMaxGRESPerUser); both cancelled",
    ]


def apply_usage(cluster: LocalCluster, timeout: float = 60) -> None:
    """Run every node's collector until no entry waits (jobs' ends reach slurmdbd asynchronously)."""

    def drained() -> bool:
        results = [collect(cluster, node.name) for node in NODES]
        return all(not result.waiting and not result.applied for result in results)  # every spool empty

    _wait(drained, timeout, "the jobs' figures did not all reach their AdminComment")


def _hour(stamp: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(stamp).replace(minute=0, second=0)
    except ValueError:
        return None


def tpu_hours(cluster: LocalCluster, since: float, tres: str = "gres/tpu") -> dict[str, float]:
    """sreport's TRES-seconds (TPU-seconds for ``gres/tpu``, share-seconds for ``gres/tpu_shard``) per
    user since ``since`` (whole hours: sreport counts per hour).

    One sreport per hour: Debian's sreport (22.05) ends a period that reaches past
    now at the current hour's start unless it is exactly one hour long.
    """
    first = datetime.datetime.fromtimestamp(since).replace(minute=0, second=0, microsecond=0)
    last = datetime.datetime.now().replace(minute=0, second=0, microsecond=0)
    cluster.sacctmgr("rollup", first.isoformat(), (last + datetime.timedelta(hours=1)).isoformat())
    used: dict[str, float] = {}
    hour = first
    while hour <= last:
        out = cluster.command(
            [
                "sreport",
                "-n",
                "-P",
                "-t",
                "seconds",
                "-T",
                tres,
                "cluster",
                "UserUtilizationByAccount",
                f"start={hour.isoformat()}",
                f"end={(hour + datetime.timedelta(hours=1)).isoformat()}",
            ]
        ).stdout
        for line in out.splitlines():
            fields = line.split("|")
            if len(fields) >= 6 and fields[-1].isdigit():
                used[fields[1]] = used.get(fields[1], 0.0) + int(fields[-1])
        hour += datetime.timedelta(hours=1)
    return used


def books_lines(cluster: LocalCluster, layout: Layout, since: float, sample_job: int | None) -> list[str]:
    """TPU-hours per user from sreport, and one job's AdminComment."""
    apply_usage(cluster)
    used = _wait(lambda: tpu_hours(cluster, since) or None, 60, "sreport showed no TPU usage")
    lines = ["Slurm's books (slurmdbd + MariaDB): TPU-hours per user, from sreport -T gres/tpu"]
    for user, seconds in sorted(used.items()):
        lines.append(f"  {user}: {seconds / 3600:.4f} TPU-hours ({seconds:.0f} TPU-seconds)")
    shares = tpu_hours(cluster, since, "gres/tpu_shard")
    lines.append("  and share-hours of the shared TPU, from sreport -T gres/tpu_shard")
    for user, seconds in sorted(shares.items()):
        lines.append(f"  {user}: {seconds / 3600:.4f} share-hours ({seconds:.0f} share-seconds)")
    if sample_job is not None:
        out = cluster.command(["sacct", "-n", "-P", "-X", "-j", str(sample_job), "-o", "AdminComment"]).stdout
        lines += _wrapped(f"  job {sample_job} AdminComment: {out.strip() or '(none)'}", "    ")
    from slurm_tpu.ops.accounting import sacct_jobs
    from slurm_tpu.slurm.commands import Slurm

    lines += energy_lines(sacct_jobs(Slurm(cluster.slurm, cluster.env()), since, None))
    return lines


def energy_lines(rows: Sequence[JobRow], width: int = 100) -> list[str]:
    """Each accelerator job's energy (``slurm-tpu report --by job``'s figure: its AdminComment's, summed
    over its nodes), grouped by method so that a figure is never shown without it; jobs without a
    figure are listed as such. Wrapped to ``width`` columns."""
    import textwrap

    tres = list(dict.fromkeys(name for row in rows for name in row.tres if name.startswith("gres/")))
    jobs = summarize_sacct(rows, "job", tres, None, None, 0)
    if not jobs:
        return ["  energy per job: no jobs"]
    groups: dict[str, list[str]] = {}
    total = 0.0
    for job, totals in sorted(jobs.items(), key=lambda item: (len(item[0]), item[0])):
        energy = totals.energy
        if energy.joules is not None:
            total += energy.joules
            groups.setdefault(energy.method, []).append(f"{job} {_joules(energy.joules)}")
        else:  # unavailable (with the method saying so), or no figure at all (a job before energy)
            groups.setdefault(energy.method or "no figure", []).append(job)
    lines = [
        f"  energy per job on its accelerators: {total:.1f} J ({total / JOULES_PER_KWH:.6f} kWh) in all,",
        "  by how each figure was obtained (the jobs' AdminComments):",
    ]
    for method, shown in groups.items():
        lines += textwrap.wrap(
            ", ".join(shown), width, initial_indent=f"    {method}: ", subsequent_indent=" " * 6, break_on_hyphens=False
        )
    return lines


def _joules(value: float) -> str:
    """A job's figure: to 0.1 J, and below 1 J to two significant digits (a shard job's second on a
    quarter of an idle Edge TPU is a few hundredths of a joule, not nothing)."""
    return f"{value:.1f} J" if value >= 1 else f"{value:.2g} J"


def _wrapped(text: str, indent: str, width: int = 100) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken after its commas (an AdminComment item's
    figures; energy made the item longer than one line), the later lines indented."""
    lines = [""]
    for piece in text.split(","):
        part = piece if not lines[-1] else "," + piece
        if lines[-1] and len(lines[-1]) + len(part) >= width:  # room for the comma
            lines[-1] += ","
            lines.append(indent + piece)
        else:
            lines[-1] += part
    return lines


def shard_figures(cluster: LocalCluster, jobs: list[int]) -> dict[int, dict[str, float]]:
    """Each shard job's broker figures as its AdminComment holds them (job -> the node's figures), once
    every node's collector has applied its spool."""
    from slurm_tpu.protocol.job_record import parse_admin_comment

    apply_usage(cluster)
    ids = ",".join(str(job) for job in jobs)
    out = cluster.command(["sacct", "-n", "-P", "-X", "-j", ids, "-o", "JobID,AdminComment"]).stdout
    found: dict[int, dict[str, float]] = {}
    for line in out.splitlines():
        job, _, comment = line.partition("|")
        for figures in parse_admin_comment(comment).values():
            if job.isdigit() and "shards" in figures:
                found[int(job)] = figures
    return found
