"""Our gres/tpu plugin (slurm_plugin/) on a real cluster: the Prolog and Epilog learn the job's Edge TPUs.

A recording Prolog/Epilog (no slurm-tpu hooks) writes the environment slurmd gave it;
the indices in SLURM_JOB_TPUS must be the job's IDX numbers as ``scontrol show job -d``
prints them, for one TPU, two, a request naming both types (two GRES records: both
kept), and nothing for a job without a TPU. The job's own environment is left alone.
Runs on the Slurm of the session (SLURM_TPU_TEST_SLURM=/opt/slurm-25.11 for 25.11);
skipped with one reason when no plugin is built for that release
(scripts/build-gres-plugin.sh).
"""

from __future__ import annotations

import os

import pytest
from support import HARDWARE, finish_cluster, make_cluster, out, require_root_and_slurm

pytestmark = pytest.mark.slurm

RECORDER = """#!/bin/sh
# SLURM_JOB_ID is slurmd's (a number); the files are root's, in the test's own directory. While the
# prolog runs, Slurm still lists the job's per-node GRES detail (gone once the job completed).
[ {kind} = prolog ] && "{scontrol}" --local show job -d "$SLURM_JOB_ID" > "{out}/{kind}-$SLURM_JOB_ID.detail"
env > "{out}/{kind}-$SLURM_JOB_ID.env"
"""


def plugin_problem(cluster) -> str | None:
    """Why the cluster's Slurm has no gres/tpu plugin built for it, else None."""
    from slurm_tpu.slurm import gres_plugin
    from slurm_tpu.slurm.installation import version_of

    if cluster.gres_plugin_dir:
        return None
    version = version_of(cluster.slurm.program("slurmd"))
    return (
        f"no gres/tpu plugin built for Slurm {version} in {gres_plugin.root()} "
        "(scripts/build-gres-plugin.sh; setup builds it)"
    )


@pytest.fixture(scope="module")
def cluster(users, tmp_path_factory):
    require_root_and_slurm()
    from harness.localcluster.cluster import Hooks, LocalCluster, NodeSpec

    probe = LocalCluster(base="/nonexistent", nodes=[])
    problem = plugin_problem(probe)
    if problem:
        pytest.skip(problem)
    scripts = tmp_path_factory.mktemp("recorders")
    record = str(tmp_path_factory.mktemp("records"))
    os.chmod(record, 0o755)
    hooks = {}
    for kind in ("prolog", "epilog"):
        path = scripts / kind
        path.write_text(RECORDER.format(out=record, kind=kind, scontrol=probe.slurm.program("scontrol")))
        path.chmod(0o755)
        hooks[kind] = str(path)
    started = make_cluster([NodeSpec("n1", os.path.join(HARDWARE, "n1_two_tpus.umockdev"))], hooks=Hooks(**hooks))
    started.records = record
    try:
        yield started
    finally:
        finish_cluster(started)


def environment_of(path: str) -> dict[str, str]:
    with open(path, encoding="utf-8") as handle:
        return dict(line.split("=", 1) for line in handle.read().splitlines() if "=" in line)


def run_job(
    cluster, name: str, gres: str | None, extra: tuple[str, ...] = ()
) -> tuple[int, dict[str, str], dict[str, str], dict[str, str]]:
    """(job id, the prolog's environment, the epilog's, the job's own) for a job asking ``gres``."""
    job_env = out(cluster, f"{name}.out")
    args = ["-w", "n1", "-o", job_env, *extra] + ([f"--gres={gres}"] if gres else [])
    job = cluster.sbatch(args, "#!/bin/sh\nenv\n", user="stpu_alice")
    assert cluster.wait_for_jobs([job], 120)[job] == "COMPLETED"
    prolog = environment_of(os.path.join(cluster.records, f"prolog-{job}.env"))
    epilog_file = os.path.join(cluster.records, f"epilog-{job}.env")
    cluster._wait(lambda: os.path.exists(epilog_file), 60, f"job {job}'s epilog did not run")
    return job, prolog, environment_of(epilog_file), environment_of(job_env)


def slurm_indices(cluster, job: int) -> list[int]:
    """The job's tpu IDX numbers on n1, in the order ``scontrol show job -d`` lists them."""
    from slurm_tpu.slurm.jobdetail import parse_scontrol_job_detail

    with open(os.path.join(cluster.records, f"prolog-{job}.detail"), encoding="utf-8") as handle:
        detail = handle.read()
    allocs = parse_scontrol_job_detail(detail, "n1", job) or []
    return [i for alloc in allocs if alloc.name == "tpu" for i in alloc.indices]


def test_the_cluster_loads_the_plugin(cluster):
    with open(cluster.slurm_conf, encoding="utf-8") as handle:
        [line] = [line for line in handle if line.startswith("PluginDir=")]
    assert line.strip().endswith(":" + cluster.gres_plugin_dir)


@pytest.mark.parametrize(
    ("name", "gres", "count"),
    [("one", "tpu:1", 1), ("two", "tpu:2", 2), ("typed", "tpu:edgetpu_usb:1,tpu:edgetpu_pci:1", 2)],
)
def test_the_prolog_and_epilog_get_the_jobs_tpu_indices(cluster, name, gres, count):
    job, prolog, epilog, own = run_job(cluster, name, gres)
    expected = slurm_indices(cluster, job)
    assert len(expected) == count
    # The same index space and order as scontrol's IDX; every GRES record of the job, appended.
    assert prolog.get("SLURM_JOB_TPUS") == ",".join(map(str, expected)), prolog
    assert epilog.get("SLURM_JOB_TPUS") == prolog["SLURM_JOB_TPUS"]
    # The job's own environment is not the plugin's business.
    assert not any(key.startswith("SLURM_JOB_TPUS") or key.endswith("TPUS") for key in own), own


def test_a_job_without_a_tpu_gets_no_variable(cluster):
    _, prolog, epilog, _ = run_job(cluster, "none", None)
    assert "SLURM_JOB_TPUS" not in prolog and "SLURM_JOB_TPUS" not in epilog


def test_a_user_cannot_put_the_variable_in_the_prolog(cluster):
    """The hooks trust SLURM_JOB_TPUS because slurmd builds the Prolog's environment itself: a user's
    own (sbatch --export) reaches the job, never the Prolog or Epilog. Index 7 is no device of n1."""
    forged = ("--export=ALL,SLURM_JOB_TPUS=7",)
    _, prolog, epilog, own = run_job(cluster, "forged-none", None, forged)
    assert own.get("SLURM_JOB_TPUS") == "7"  # the export did reach the job
    assert "SLURM_JOB_TPUS" not in prolog and "SLURM_JOB_TPUS" not in epilog
    job, prolog, epilog, own = run_job(cluster, "forged-one", "tpu:1", forged)
    assert own.get("SLURM_JOB_TPUS") == "7"
    assert prolog["SLURM_JOB_TPUS"] == epilog["SLURM_JOB_TPUS"] == ",".join(map(str, slurm_indices(cluster, job)))
