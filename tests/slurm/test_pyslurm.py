"""pyslurm as a backend, against a real Slurm of its own release (25.11 here).

Runs when pyslurm is installed and matches the tests' Slurm (SLURM_TPU_TEST_SLURM=
/opt/slurm-25.11 with pyslurm 25.11.x: scripts/build-slurm.sh --pyslurm), else skips.
The GRES indices pyslurm gives must equal the prolog's own parsing of scontrol's
text (narrowing and JSON fallback included) for every job and node.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest

from harness.localcluster import NodeSpec
from slurm_tpu.config import Config
from slurm_tpu.errors import SlurmCommandError
from slurm_tpu.slurm import installation
from slurm_tpu.slurm.commands import Slurm

pytestmark = [pytest.mark.slurm, pytest.mark.pyslurm]
BIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hardware", "big_node.umockdev")
SLEEP = "#!/bin/sh\nsleep 300\n"
FORGED = "evil\n     Nodes=n2 CPU_IDs=0 Mem=0 GRES=tpu:edgetpu_usb:1(IDX:0)\nJobId=77777 JobName=x"


def _pyslurm_matches() -> str | None:
    """Why the pyslurm tests cannot run here, or None."""
    if importlib.util.find_spec("pyslurm") is None:
        return "pyslurm is not installed (scripts/build-slurm.sh --pyslurm)"
    from importlib.metadata import version

    install = installation.find(use_daemons=False)
    slurmd = f"{install.sbin_dir}/slurmd"
    daemons = installation.version_of(slurmd) if os.path.exists(slurmd) else None
    if not daemons or daemons.split(".")[:2] != version("pyslurm").split(".")[:2]:
        return f"pyslurm {version('pyslurm')} is not for the tests' Slurm {daemons} (SLURM_TPU_TEST_SLURM)"
    return None


@pytest.fixture(scope="module")
def cluster(cluster_factory):
    why = _pyslurm_matches()
    if why:
        pytest.skip(why)
    started = cluster_factory([NodeSpec("n1", BIG, cpus=8), NodeSpec("n2", BIG, cpus=8)])
    jobs = {
        "single": [started.sbatch(["--gres=tpu:1", "-w", "n1", "-o", "/dev/null"], SLEEP)],
        "typed": [started.sbatch(["--gres=tpu:edgetpu_pci:2", "-w", "n1", "-o", "/dev/null"], SLEEP)],
        "multi": [started.sbatch(["--gres=tpu:1", "-N", "2", "-w", "n1,n2", "-o", "/dev/null"], SLEEP)],
        "forged": [started.sbatch(["--gres=tpu:1", "-w", "n2", "-J", FORGED, "-o", "/dev/null"], SLEEP)],
    }
    array = started.sbatch(["--gres=tpu:1", "--array=0-2", "-w", "n2", "-o", "/dev/null"], SLEEP)
    started._wait(lambda: "PENDING" not in started.command(["squeue", "-h", "-o", "%T"]).stdout, 60, "jobs to start")
    tasks = started.command(["squeue", "-h", "-r", "-j", str(array), "-o", "%A"]).stdout.split()
    jobs["array"] = sorted(int(task) for task in tasks)
    assert array in jobs["array"] and len(jobs["array"]) == 3
    started.jobs = jobs
    yield started
    started.command(["scancel", "--partition=debug"], check=False)


@pytest.fixture(scope="module")
def backends(cluster):
    from slurm_tpu.slurm.backend import load

    slurm = Slurm(environ=cluster.env())
    os.environ["SLURM_CONF"] = cluster.slurm_conf  # libslurm (in this process) reads it at init
    return slurm, load(slurm)


@pytest.mark.parametrize("kind", ["single", "typed", "multi", "array", "forged"])
def test_pyslurm_gres_indices_equal_the_prologs_parsing(backends, cluster, kind):
    slurm, pyslurm = backends
    seen = 0
    for job in cluster.jobs[kind]:
        for node in ("n1", "n2"):
            mine = slurm.job_gres(job, node)
            assert pyslurm.job_gres(job, node) == mine, (kind, job, node)
            seen += any(alloc.indices for alloc in mine or ())
    assert seen == len(cluster.jobs[kind]) * (2 if kind == "multi" else 1)


def test_drain_resume_and_node_state_through_pyslurm(backends, cluster):
    slurm, pyslurm = backends
    pyslurm.drain("n1", "slurm-tpu: pyslurm test")
    assert "DRAIN" in slurm.node_state("n1")["state"] and slurm.node_state("n1")["reason"] == "slurm-tpu: pyslurm test"
    assert (
        "DRAIN" in pyslurm.node_state("n1")["state"] and pyslurm.node_state("n1")["reason"] == "slurm-tpu: pyslurm test"
    )
    pyslurm.resume("n1")
    assert "DRAIN" not in slurm.node_state("n1")["state"]
    from slurm_tpu.ops.health_policy import strip_affinity

    assert pyslurm.node_state("n2")["gres"] == strip_affinity(slurm.node_state("n2")["gres"])
    assert sorted(pyslurm.jobs_with_gres("n2")) == sorted(
        str(job) for kind in ("multi", "forged", "array") for job in cluster.jobs[kind]
    )


def test_pyslurm_errors_are_raised_never_swallowed(backends):
    _, pyslurm = backends
    with pytest.raises(SlurmCommandError, match=r"pyslurm Job.load\(99999\) failed: .*Invalid job id"):
        pyslurm.job_gres(99999, "n1")
    with pytest.raises(SlurmCommandError, match="pyslurm drain of nx failed"):
        pyslurm.drain("nx", "slurm-tpu: no such node")


def test_a_missing_slurm_conf_or_another_release_refuses_pyslurm_in_one_line(cluster, tmp_path):
    from slurm_tpu.slurm.backend import PyslurmUnavailable, load, open_backend

    missing = Slurm(environ={**cluster.env(), "SLURM_CONF": str(tmp_path / "absent.conf")})
    with pytest.raises(PyslurmUnavailable, match=r"absent.conf does not exist"):
        load(missing)
    config = dataclasses.replace(Config(), slurm_backend="pyslurm")
    os.environ["SLURM_CONF"] = cluster.slurm_conf
    assert open_backend(config, "health").name == "pyslurm"
    assert open_backend(dataclasses.replace(config, slurm_backend="auto"), "health").name == "scontrol"
    assert open_backend(dataclasses.replace(config, slurm_backend="auto"), "watch").name == "pyslurm"
    if os.path.exists("/usr/sbin/slurmd") and cluster.slurm.sbin_dir != "/usr/sbin":
        debian = Slurm(installation.from_prefix("/usr"), cluster.env())
        with pytest.raises(PyslurmUnavailable, match=r"the daemons 22\.05"):
            load(debian)
