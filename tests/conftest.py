"""Test-suite root: shared fixtures; makes tests/helpers.py importable as ``helpers``.

``cluster_factory`` starts real local Slurm clusters (munge, slurmctld, slurmd -N).
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import first_job_id, require_slurm  # noqa: E402  (after the sys.path insert)


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
