#!/usr/bin/env python3
"""Scale: 32+ ``slurmd -N`` nodes with mixed simulated Edge TPUs, 10,000 short jobs from 4 real users, nothing lost.

One real local cluster (harness/localcluster/scalenodes.py: USB sticks, PCIe cards,
nodes with 1, 2 and 4 Edge TPUs and some with none). The full run submits ``--jobs``
short jobs (arrays and single jobs, ``--gres=tpu:1`` and ``:2``, the users in turn;
at most a backlog waiting at once) with the project's hooks, while it cancels jobs in
the middle of their prolog, restarts a slurmd under a running job and unplugs and
re-plugs a USB stick a job holds (harness/localcluster/scale.py says how each is
made deterministic). Every job records which device nodes it opened and when
(harness/localcluster/jobprobe.py). Before it, the same slice of ``--ratio-jobs`` jobs
runs with ``/bin/true`` hooks and with the project's hooks on the same cluster:
``ratio`` = jobs_per_s_hooks / jobs_per_s_true.

    sudo .venv/bin/python bench/bench_scale.py [--nodes 32] [--jobs 10000] [--ratio-jobs 1000]

Prints one JSON document: nodes, jobs, overlaps, leases_left, drained, jobs_per_s_hooks,
jobs_per_s_true, ratio, the controller's RPC counts per phase (``sdiag``, reset at each
phase's start: the prolog's Slurm query shows as REQUEST_JOB_INFO_SINGLE from root),
and every check's details. Exit status 1 when an invariant does not hold.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from harness.localcluster.scale import run_scale  # noqa: E402
from harness.localcluster.users import real_users  # noqa: E402

# The bench's own users (made and removed by it if missing): never the test suite's, which a
# test session running beside it may remove when it ends.
USERS = ("stpu_scale1", "stpu_scale2", "stpu_scale3", "stpu_scale4")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs of the full run (with the hooks and events)")
    parser.add_argument(
        "--ratio-jobs", type=int, default=1000, help="jobs of each of the /bin/true and hooks slices (0: no ratio)"
    )
    parser.add_argument("--cancels", type=int, default=3, help="jobs cancelled in the middle of their prolog")
    parser.add_argument("--restarts", type=int, default=1, help="slurmd restarts under a running job")
    parser.add_argument("--hotplugs", type=int, default=2, help="USB sticks unplugged and re-plugged under a job")
    parser.add_argument("--hold", type=float, default=0.02, help="seconds each job holds its devices open")
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--keep", action="store_true", help="keep the cluster directory (its path is reported)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_scale: must run as root (it starts Slurm daemons and makes users)", file=sys.stderr)
        return 2
    started = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - started:7.1f} s] {message}", file=sys.stderr, flush=True)

    with real_users(USERS):
        report = run_scale(
            args.nodes,
            args.jobs,
            list(USERS),
            ratio_jobs=args.ratio_jobs,
            cancels=args.cancels,
            restarts=args.restarts,
            hotplugs=args.hotplugs,
            hold_s=args.hold,
            seed=args.seed,
            keep=args.keep,
            log=log,
        )
    report["wall_seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
