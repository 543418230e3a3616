"""LocalCluster.stop() leaves no process of the cluster behind, whatever its jobs were doing.

slurmstepd runs in a session of its own (parent init) and slurmd's SIGTERM leaves
steps running, so stopping the daemons alone left a running job's slurmstepd and
processes behind (harness/localcluster/leftovers.py).
"""

from __future__ import annotations

import os

import pytest

from harness.localcluster import leftovers
from harness.localcluster.cluster import NodeSpec
from helpers import wait_until

pytestmark = pytest.mark.slurm

# A job that runs on, with a daemon of its own (double fork, own session) as Slurm's tracking misses.
RUNS_ON = """#!/bin/sh
/usr/bin/python3 -I -c '
import os, sys, time
if os.fork(): sys.exit(0)
os.setsid()
if os.fork(): sys.exit(0)
open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
' {pidfile}
sleep 600
"""


def test_stop_ends_a_running_jobs_slurmstepd_and_processes(cluster_factory, users):
    cluster = cluster_factory([NodeSpec("n1")])
    os.makedirs(cluster.path("out"), mode=0o1777)
    os.chmod(cluster.path("out"), 0o1777)
    pidfile = cluster.path("out", "daemon.pid")
    job = cluster.sbatch(
        ["-w", "n1", "-o", "/dev/null", "-e", "/dev/null"], RUNS_ON.format(pidfile=pidfile), user="stpu_alice"
    )
    wait_until(
        lambda: os.path.exists(pidfile) or cluster.job_state(job) not in ("PENDING", "RUNNING"),
        180,
        f"job {job}'s daemon to start",
    )
    daemon = int(open(pidfile).read())

    running = leftovers.processes_of([cluster.base])
    steps = [pid for pid, (_, what) in running.items() if f"slurmstepd: [{job}." in what]
    assert steps and daemon in running, running  # what stop() must end, found by what names the cluster
    cluster.stop()
    assert leftovers.processes_of([cluster.base]) == {}
    for pid in [*steps, daemon]:  # killed, and reaped by init (their parent)
        wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 30, f"pid {pid} to be gone")
