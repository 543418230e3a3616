"""Fixtures for the isolation tests: real unix users and a real local Slurm cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARDWARE = os.path.join(REPO, "tests", "isolation", "hardware")
USERS = ("stpu_alice", "stpu_bob")
NEEDS = ("slurmctld", "slurmd", "munged", "umockdev-run", "useradd", "runuser")


def require_root_and_slurm() -> None:
    from helpers import require_root_and

    require_root_and(NEEDS, "Slurm daemons, useradd, chown")


@pytest.fixture(scope="session")
def users():
    """Two real unix users, created for the tests and removed afterwards: name -> uid."""
    require_root_and_slurm()
    made = []
    for name in USERS:
        if subprocess.run(["id", "-u", name], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", "--user-group", name], check=True)
            made.append(name)
    uids = {name: int(subprocess.run(["id", "-u", name], capture_output=True, text=True).stdout) for name in USERS}
    yield uids
    for name in made:
        subprocess.run(["userdel", name], capture_output=True)


def make_cluster(nodes, **kwargs):
    """Configure and start a LocalCluster with the project's hooks; caller stops it."""
    from slurm_tpu.localcluster.cluster import Hooks, LocalCluster

    base = tempfile.mkdtemp(prefix="slurm-tpu-iso-", dir="/tmp")
    os.chmod(base, 0o755)
    os.makedirs(os.path.join(base, "out"))
    os.chmod(os.path.join(base, "out"), 0o1777)
    hooks = kwargs.pop("hooks", None) or Hooks(prolog=os.path.join(REPO, "prolog", "slurm-tpu-prolog"),
                                               epilog=os.path.join(REPO, "epilog", "slurm-tpu-epilog"),
                                               task_prolog=os.path.join(REPO, "prolog", "slurm-tpu-task-prolog"))
    cluster = LocalCluster(base=base, nodes=nodes, hooks=hooks, **kwargs)
    try:
        cluster.configure()
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def finish_cluster(cluster) -> None:
    cluster.stop()
    if not os.environ.get("SLURM_TPU_KEEP_CLUSTER"):
        shutil.rmtree(cluster.base, ignore_errors=True)
