"""``python -m harness.demo [run|status|stop] [options]``: the local demo cluster.

    run     (default) start or reuse the demo cluster, run the seeds' experiment and a
            batch job, print the timeline; the cluster keeps running
    status  is the demo cluster running?
    stop    stop the demo cluster's daemons (--purge: also delete its directory and
            the job user)

Exit status: 0 when everything ran and every check held, 1 when a job failed or a
check did not hold (the cluster stays up for a look), 2 on an error (one line).
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import subprocess
import sys
import time
from typing import TYPE_CHECKING, NoReturn

from .errors import DemoError
from .layout import DEFAULT_BASE, DEFAULT_USER, Layout, second_user

if TYPE_CHECKING:
    from .experiment import Submitted
    from .records import JobRecord, Lease

PREFIX = "slurm-tpu demo"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + line
        print(f"{PREFIX}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m harness.demo",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("action", nargs="?", default="run", choices=("run", "status", "stop"))
    parser.add_argument(
        "--base",
        default=os.environ.get("SLURM_TPU_DEMO_BASE", DEFAULT_BASE),
        help=f"the demo's directory (default {DEFAULT_BASE}, env SLURM_TPU_DEMO_BASE)",
    )
    parser.add_argument(
        "--user", default=DEFAULT_USER, help=f"unprivileged user the jobs run as (default {DEFAULT_USER})"
    )
    parser.add_argument("--images", type=int, default=300, help="images for the batch job (default 300)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for the jobs (default 300)")
    parser.add_argument("--purge", action="store_true", help="stop: also delete the directory and the job user")
    parser.add_argument(
        "--slurm",
        metavar="PREFIX",
        default=os.environ.get("SLURM_TPU_DEMO_SLURM"),
        help="run the cluster on the Slurm installed under PREFIX, e.g. /opt/slurm-25.11 "
        "(scripts/build-slurm.sh); default: Debian's (env SLURM_TPU_DEMO_SLURM)",
    )
    return parser


def _say(line: str = "") -> None:
    print(line, flush=True)


def _preflight(layout: Layout, user: str, images: int, timeout: float) -> None:
    """Everything that can refuse, before anything is printed or changed."""
    from . import preflight, provision

    if not 20 <= images <= 5000:
        raise DemoError(f"--images {images}: give 20 to 5000")
    if timeout <= 0:
        raise DemoError(f"--timeout {timeout:g}: give a positive number of seconds")
    provision.check_user(user)
    provision.check_user(second_user(user))
    preflight.require_root()
    preflight.require_tools()
    preflight.check_base(layout.base)
    preflight.refuse_foreign_slurm(layout.slurm_conf)


def _provision(layout: Layout, user: str, images: int) -> dict[str, str]:
    """What the jobs need beside Slurm; returns the environment they are submitted with."""
    from . import lifecycle, provision

    provision.job_side_slurm_tpu(layout, user)
    provision.build_libedgetpu_double(layout)
    provision.make_models(layout, images)
    provision.make_shared_dirs(layout)
    devices = lifecycle.double_devices(layout)
    provision.write_env_file(layout, devices)
    return provision.job_environment(layout, devices, user)


def _collect(layout: Layout, submitted: Submitted) -> tuple[list[JobRecord], list[Lease]]:
    """This run's job records (jobcomp) and every node's leases (audit logs)."""
    from .layout import NODES
    from .records import parse_audit, parse_jobcomp, select

    with open(layout.jobcomp, encoding="utf-8") as handle:
        jobs = select(parse_jobcomp(handle.read()), submitted.all_ids)
    leases = []
    for node in NODES:
        try:
            with open(layout.audit_log(node.name), encoding="utf-8") as handle:
                leases += parse_audit(handle.read(), node.name)
        except FileNotFoundError:
            pass
    return jobs, leases


def run(layout: Layout, user: str, images: int, timeout: float) -> int:
    from . import accounting as books, experiment, lifecycle, provision, report
    from .records import parse_jobcomp

    _preflight(layout, user, images, timeout)
    _say(report.INTRO)
    _say()
    began = time.monotonic()
    provision.ensure_user(user)
    provision.ensure_user(second_user(user))
    cluster, reused = lifecycle.ensure_cluster(layout, _say)
    books.prepare(cluster, user, [second_user(user)])
    how = "reused the running cluster" if reused else "detected, configured and started"
    _say(f"[1/4] cluster in {layout.base}: {how} ({time.monotonic() - began:.1f} s)")
    for line in report.cluster_lines(layout):
        _say(line)
    _say(f"  per node: detect (umockdev) -> gres-conf, node-conf -> {layout.path('etc')}/{{gres,nodes}}.conf")
    env = _provision(layout, user, images)

    submitted = experiment.submit_experiment(layout, user, env, images)
    _say(
        f"[2/4] submitted as {user}, with the scripts in jobs/: {len(submitted.tpu)} x classify_tpu.sbatch "
        "(--gres=tpu:1),"
    )
    _say(
        f"      {len(submitted.plain)} x classify_cpu.sbatch (-c {experiment.PLAIN_CPUS}), "
        f"batch_array.sbatch --array=0-{submitted.array_tasks - 1} over {images} images"
    )
    seconds = experiment.wait_for(layout, env, submitted, timeout)
    jobs, leases = _collect(layout, submitted)
    failed = [j for j in jobs if j.state != "COMPLETED"]
    states = (
        f"all {len(jobs)} COMPLETED"
        if not failed
        else f"{len(failed)} of {len(jobs)} did not complete: "
        + ", ".join(f"{j.job_id} {j.state} ({j.exit_code})" for j in failed)
    )
    _say(f"      finished in {seconds:.1f} s: {states}")

    lines, checks = report.timeline_lines(layout, submitted, jobs, leases)
    _say("[3/4] timeline (seconds since the first job started)")
    for line in lines:
        _say("  " + line)
    for check in checks:
        _say(f"  {'ok  ' if check.ok else 'FAIL'}  {check.text}")
    _say("[4/4] batch jobs")
    for line in report.batch_lines(layout, submitted, jobs, leases):
        _say("  " + line)
    detection = experiment.submit_detection(layout, user, env)
    experiment.wait_for_job(env, detection, timeout)
    for line in report.detection_lines(layout, detection):
        _say("  " + line)
    for line in report.serve_lines(experiment.serve_and_query(layout, user, env)):
        _say("  " + line)
    coral, coral_ok = report.coral_lines(layout, *experiment.run_coral_examples(layout, user, env, timeout))
    for line in coral:
        _say("  " + line)
    contained, contained_ok = report.container_lines(layout, experiment.run_containers(layout, user, env, timeout))
    for line in contained:
        _say("  " + line)
    envs = {
        name: provision.job_environment(layout, env["EDGETPU_DOUBLE_DEVICES"], name)
        for name in (user, second_user(user))
    }
    shards = experiment.run_shards(layout, list(envs), envs, timeout)
    library = provision.real_libedgetpu(layout)
    coral_shards = experiment.run_coral_shards(layout, envs, library, timeout) if library else None
    coral_shard, coral_shard_ok = report.coral_shard_lines(layout, coral_shards)
    limit = books.show_limit(cluster, user, layout.out)
    with open(layout.jobcomp, encoding="utf-8") as handle:
        shard_records = parse_jobcomp(handle.read())
    # The figures wait until slurmdbd has every job's record (the collectors apply them): after the
    # limit's jobs, so that the books below find nothing left to wait for.
    figures = books.shard_figures(cluster, [j for j, _ in shards.jobs])
    shard, shard_ok = report.shard_lines(layout, shards, shard_records, figures)
    for line in [*shard, *coral_shard, *limit]:
        _say("  " + line)
    sample = submitted.tpu[0] if submitted.tpu else None
    for line in books.books_lines(cluster, layout, submitted.submitted_at, sample):
        _say(line)
    _say()
    for line in report.next_steps(layout, user):
        _say(line)
    broken = sum(not c.ok for c in checks) + (not coral_ok) + (not shard_ok) + (not coral_shard_ok) + (not contained_ok)
    if failed or broken:
        print(
            f"{PREFIX}: {len(failed)} job(s) failed and {broken} check(s) did not hold; "
            f"job output is in {layout.out}, daemon logs in {layout.path('log')}",
            file=sys.stderr,
        )
        return 1
    return 0


def status(layout: Layout) -> int:
    from .lifecycle import make_cluster

    pids = make_cluster(layout).running_pids() if os.path.isdir(layout.base) else {}
    if not pids:
        _say(f"the demo cluster in {layout.base} is not running (start it: ./demo.sh)")
        return 1
    _say(f"the demo cluster in {layout.base} is running: " + ", ".join(f"{n} ({p})" for n, p in sorted(pids.items())))
    _say(f"use it: . {layout.env_file}; sinfo; squeue")
    return 0


def stop(layout: Layout, purge: bool, user: str) -> int:
    from .lifecycle import stop_own_daemons
    from .preflight import check_base, require_root

    require_root()
    check_base(layout.base)
    if os.path.isdir(layout.base):
        stop_own_daemons(layout)
        _say(f"stopped the demo cluster in {layout.base}")
    else:
        _say(f"no demo cluster in {layout.base}")
    if purge:
        shutil.rmtree(layout.base, ignore_errors=True)
        removed = []
        for name in (user, second_user(user)):
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                continue
            if 0 < entry.pw_uid < 1000:  # a system account, as the demo makes them
                subprocess.run(["userdel", "--remove", name], capture_output=True)
                removed.append(name)
        _say(f"removed {layout.base}" + (f" and user(s) {', '.join(removed)}" if removed else ""))
    return 0


def use_slurm(prefix: str) -> None:
    """Make the demo (its cluster, its jobs, the hooks' commands) use the Slurm under ``prefix``."""
    from slurm_tpu.slurm import installation

    install = installation.from_prefix(prefix) if os.path.isabs(prefix) else None
    if install is None or not os.access(os.path.join(install.sbin_dir, "slurmd"), os.X_OK):
        raise DemoError(
            f"--slurm {prefix}: no sbin/slurmd under it; give a Slurm install prefix such as "
            "/opt/slurm-25.11 (build it with scripts/build-slurm.sh)"
        )
    os.environ.update(installation.environment(install))
    os.environ["PATH"] = ":".join([*install.dirs, os.environ.get("PATH", "/usr/bin:/bin")])


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    layout = Layout(args.base)
    try:
        if args.slurm:
            use_slurm(args.slurm)
        if args.action == "status":
            return status(layout)
        if args.action == "stop":
            return stop(layout, args.purge, args.user)
        return run(layout, args.user, args.images, args.timeout)
    except DemoError as exc:
        print(f"{PREFIX}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PREFIX}: interrupted; the cluster may be half-started: ./demo.sh stop", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
