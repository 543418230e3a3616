"""Test-suite root: shared fixtures; makes tests/helpers.py importable as ``helpers``.

``cluster_factory`` starts real local Slurm clusters (munge, slurmctld, slurmd -N);
``users`` makes the tests' real unix users.
``SLURM_TPU_TEST_SLURM=/opt/slurm-25.11`` (a Slurm install prefix) runs every
cluster test against that Slurm instead of Debian's: the clusters' daemons and
clients and every slurm-tpu command the tests run take their Slurm from it
(through ``SLURM_TPU_SLURM_BIN``/``SBIN``); the hooks find it as they would on
a real node, from the slurmd that runs them.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import USERS, first_job_id, require_slurm, use_test_slurm  # noqa: E402  (after the sys.path insert)

use_test_slurm()


def pytest_report_header(config):
    from slurm_tpu.slurm import installation

    install = installation.find(use_daemons=False)
    version = installation.version_of(install.program("slurmd")) if os.path.exists(
        f"{install.sbin_dir}/slurmd") else "not installed"
    return f"slurm: {version} from {', '.join(install.dirs)} ({install.found_by})"


@pytest.fixture(scope="module")
def cluster_factory():
    """Build, start and (always) stop LocalClusters for one test module.

    The base directory is world-traversable (0755, not pytest's 0700 tmp dirs):
    munged runs as ``munge`` and jobs run as the tests' unix users.
    """
    require_slurm()
    from slurm_tpu.localcluster import LocalCluster

    started = []

    def make(nodes, **kwargs):
        base = tempfile.mkdtemp(prefix="slurm-tpu-test-", dir="/tmp")
        os.chmod(base, 0o755)
        kwargs.setdefault("first_job_id", first_job_id())
        cluster = LocalCluster(base=base, nodes=nodes, **kwargs)
        started.append(cluster)
        cluster.configure()
        cluster.start()
        return cluster

    yield make
    for cluster in started:
        cluster.stop()
        if not os.environ.get("SLURM_TPU_KEEP_CLUSTER"):
            shutil.rmtree(cluster.base, ignore_errors=True)


@pytest.fixture(scope="session")
def users():
    """Two real unix users, created for the tests and removed afterwards: name -> uid."""
    from helpers import require_root_and

    require_root_and(("useradd", "userdel", "runuser"), "real unix users")
    made = []
    for name in USERS:
        if subprocess.run(["id", "-u", name], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", "--user-group", name], check=True)
            made.append(name)
    uids = {name: int(subprocess.run(["id", "-u", name], capture_output=True, text=True).stdout) for name in USERS}
    yield uids
    for name in made:
        subprocess.run(["userdel", name], capture_output=True)
