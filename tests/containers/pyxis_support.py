"""Helpers for the Pyxis/enroot tests (imported as ``from pyxis_support import ...``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from harness.localcluster.containers import DOUBLE_HOOK, DOUBLE_MOUNT, DOUBLE_ROOT
from helpers import REPO, first_job_id, require_root_and

HARDWARE = REPO / "tests" / "isolation" / "hardware"
PROBE = REPO / "tests" / "containers" / "pyxis_probe.py"


def require_pyxis(slurm_prefix: str | None) -> None:
    """Skip (one line) unless Pyxis and enroot are built for this Slurm and an image can be had."""
    require_root_and(("slurmctld", "slurmd", "munged", "umockdev-run", "useradd", "runuser"), "Slurm daemons")
    from harness.localcluster import containers
    from slurm_tpu.slurm import installation

    install = installation.from_prefix(slurm_prefix) if slurm_prefix else installation.find(use_daemons=False)
    why = containers.missing(installation.version_of(install.program("slurmd")))
    if why:
        pytest.skip(why)


def image() -> str:
    """The suite's offline image as enroot unpacks it (harness/localcluster/containers.py), or a skip."""
    from harness.localcluster.containers import enroot_image

    try:
        return enroot_image()
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:  # no mmdebstrap, no mirror
        pytest.skip(f"no container image: {exc}")


def double_library(out: str) -> str:
    """The libedgetpu double (tests/edgetpu_double), built into ``out``: the nodes' libedgetpu here."""
    from edgetpu_double.build import build_double

    return str(build_double(Path(out)))


def start_cluster(nodes, slurm_prefix: str | None = None, **kwargs):
    """A LocalCluster with Pyxis, the project's hooks and the double as each node's libedgetpu."""
    from harness.localcluster.cluster import LocalCluster, project_hooks

    base = tempfile.mkdtemp(prefix="slurm-tpu-pyxis-", dir="/tmp")
    os.chmod(base, 0o755)
    for sub in ("out", "lib"):
        os.makedirs(os.path.join(base, sub))
    os.chmod(os.path.join(base, "out"), 0o1777)
    library = double_library(os.path.join(base, "lib"))
    cluster = LocalCluster(
        base=base,
        nodes=nodes,
        hooks=project_hooks(),
        first_job_id=first_job_id(),
        slurm_prefix=slurm_prefix,
        containers=True,
        container_libedgetpu=library,
        container_mounts=(DOUBLE_MOUNT,),
        container_hook=DOUBLE_HOOK,
        **kwargs,
    )
    try:
        cluster.configure()
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def finish(cluster) -> None:
    cluster.stop()
    if not os.environ.get("SLURM_TPU_KEEP_CLUSTER"):
        shutil.rmtree(cluster.base, ignore_errors=True)


def srun_probe(
    cluster,
    user: str,
    tag: str,
    args: list[str],
    image_path: str,
    devices: str,
    env: tuple[str, ...] = (),
    timeout: float = 180,
    prefix: tuple[str, ...] = (),
) -> tuple:
    """``srun ARGS --container-image=IMAGE python3 pyxis_probe.py`` as ``user``, with the double's
    node listing ``devices`` (EDGETPU_DOUBLE_DEVICES) and ``env`` (NAME=value) exported besides:
    ``prefix``: what the command line puts before python3 (``env NAME=value``: the user's own
    last word, after every hook and the TaskProlog). Returns (completed, [each task's JSON])."""
    out = cluster.path("out")
    # The double's settings go on the container's command line (after the hooks and the TaskProlog;
    # a list with commas would not survive srun's --export).
    double = (
        "env",
        f"EDGETPU_DOUBLE_ROOT={DOUBLE_ROOT}",
        f"EDGETPU_DOUBLE_DEVICES={devices}",
        f"EDGETPU_DOUBLE_LOG={out}/{tag}.double.log",
    )
    argv = [
        "srun",
        *args,
        f"--container-image={image_path}",
        *([] if any(a.startswith("--container-mounts") for a in args) else [f"--container-mounts={out}:{out}"]),
        *([f"--export=ALL,{','.join(env)}"] if env else []),
        *double,
        *prefix,
        "python3",
        str(PROBE),
    ]
    done = cluster.command(argv, user=user, check=False, timeout=timeout)
    results = []
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            results.append(json.loads(line))
    return done, results
