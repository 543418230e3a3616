"""Test-suite root: shared fixtures; makes tests/helpers.py importable as ``helpers``.

``cluster_factory`` starts real local Slurm clusters (munge, slurmctld, slurmd -N);
``users`` makes the tests' real unix users.
``SLURM_TPU_TEST_SLURM=/opt/slurm-25.11`` (a Slurm install prefix) runs every
cluster test against that Slurm instead of Debian's: the clusters' daemons and
clients and every slurm-tpu command the tests run take their Slurm from it
(through ``SLURM_TPU_SLURM_BIN``/``SBIN``); the hooks find it as they would on
a real node, from the slurmd that runs them.

At the end of the run, no process of any cluster the run started (in this
process or in a command it ran, such as the demo) may be left: the run fails
naming them (``pytest_sessionfinish``; harness/localcluster/leftovers.py).
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import USERS, first_job_id, require_slurm, use_test_slurm

use_test_slurm()

# Every LocalCluster configured during the run, by this process or its children, appends its base here.
_REGISTRY_FD, CLUSTER_REGISTRY = tempfile.mkstemp(prefix="slurm-tpu-clusters-", suffix=".txt", dir="/tmp")
os.close(_REGISTRY_FD)
os.environ["SLURM_TPU_CLUSTER_REGISTRY"] = CLUSTER_REGISTRY


def pytest_sessionfinish(session, exitstatus):
    """Fail the run when a process of a cluster it started outlived the cluster's stop(); then end them."""
    import time

    from harness.localcluster import leftovers

    bases = leftovers.recorded(CLUSTER_REGISTRY)
    left = leftovers.processes_of(bases)
    deadline = time.monotonic() + 10  # one being reaped right now is not a leftover
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = leftovers.processes_of(bases)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"{len(left)} process(es) of test clusters outlived their cluster's stop():"]
        lines += [f"  {what}  [cluster {base}, made by {bases[base] or '?'}]" for base, what in left.values()]
        if reporter is not None:
            reporter.write_sep("=", "leftover cluster processes", red=True)
            reporter.write_line("\n".join(lines))
        else:
            print("\n".join(lines), file=sys.stderr)
        leftovers.end_processes_of({base for base, _ in left.values()})
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    try:
        os.unlink(CLUSTER_REGISTRY)
    except OSError:
        pass


def pytest_report_header(config):
    from slurm_tpu.slurm import installation

    install = installation.find(use_daemons=False)
    version = (
        installation.version_of(install.program("slurmd"))
        if os.path.exists(f"{install.sbin_dir}/slurmd")
        else "not installed"
    )
    return f"slurm: {version} from {', '.join(install.dirs)} ({install.found_by})"


@pytest.fixture(scope="module")
def cluster_factory():
    """Build, start and (always) stop LocalClusters for one test module.

    The base directory is world-traversable (0755, not pytest's 0700 tmp dirs):
    munged runs as ``munge`` and jobs run as the tests' unix users.
    """
    require_slurm()
    from harness.localcluster import LocalCluster

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
    from harness.localcluster.users import real_users

    with real_users(USERS) as uids:
        yield uids
