"""Shared test helpers: running the real CLI, optionally inside a umockdev testbed.

Import with ``from helpers import ...`` (never import from a conftest: several exist).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
HARDWARE = TESTS / "hardware"
REPO = TESTS.parent
USERS = ("stpu_alice", "stpu_bob")  # real unix users of the cluster tests (the ``users`` fixture)


def slurm_tpu_argv() -> list[str]:
    """The CLI, run by the same Python as the tests."""
    return [sys.executable, "-m", "slurm_tpu.cli"]


def run_cli(
    args: list[str],
    hardware: str | None = None,
    env: dict | None = None,
    timeout: float = 60,
    extra: bool = True,
    prefix: list[str] | None = None,
) -> subprocess.CompletedProcess:
    """Run ``slurm-tpu ARGS`` (inside ``hardware``'s umockdev testbed if given).

    ``extra=False`` leaves out the node's ``.extra/`` files (/proc, driver nodes);
    ``prefix`` is put before everything (e.g. an ``unshare`` wrapper).
    """
    argv = slurm_tpu_argv() + list(args)
    if hardware is not None:
        # A name from tests/hardware/, or a path to a .umockdev file.
        device = Path(hardware) if str(hardware).endswith(".umockdev") else HARDWARE / f"{hardware}.umockdev"
        extra_dir = device.with_suffix(".extra") if extra else HARDWARE / "no-such-extra"
        argv = [
            "umockdev-run",
            "--device",
            str(device),
            "--",
            sys.executable,
            "-m",
            "harness.localcluster.testbed",
            str(extra_dir),
            "--",
            *argv,
        ]
    argv = list(prefix or []) + argv
    full_env = dict(os.environ)
    full_env.pop("SLURM_TPU_CONFIG", None)
    full_env.update(env or {})
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO)


def detect_json(hardware: str, env: dict | None = None, extra: bool = True) -> dict:
    """``slurm-tpu detect --json`` on a described node, parsed."""
    result = run_cli(["detect", "--json"], hardware, env, extra=extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def require_root_and(programs: tuple[str, ...], why: str) -> None:
    """Skip the test unless we are root and every program is installed."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip(f"needs root ({why})")
    missing = [p for p in programs if not (shutil.which(p) or os.path.exists(f"/usr/sbin/{p}"))]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (scripts/setup.sh installs them)")


TEST_SLURM_ENV = "SLURM_TPU_TEST_SLURM"


def use_test_slurm() -> None:
    """Make this process and its children use the Slurm under $SLURM_TPU_TEST_SLURM (a prefix), if set."""
    prefix = os.environ.get(TEST_SLURM_ENV)
    if not prefix:
        return
    from slurm_tpu.slurm import installation

    install = installation.from_prefix(prefix)
    if not os.access(os.path.join(install.sbin_dir, "slurmd"), os.X_OK):
        raise SystemExit(
            f"{TEST_SLURM_ENV}={prefix}: no {install.sbin_dir}/slurmd; build it first (scripts/build-slurm.sh)"
        )
    os.environ.update(installation.environment(install))
    os.environ["PATH"] = ":".join([*install.dirs, os.environ.get("PATH", "/usr/bin:/bin")])


def require_slurm() -> None:
    """Skip unless we are root and Debian's Slurm, munge and umockdev are installed."""
    require_root_and(("slurmctld", "slurmd", "munged", "umockdev-run"), "Slurm daemons")


def first_job_id() -> int:
    """A FirstJobId for a test cluster, above the fake ids tests use (<= 999999) and unlike
    any other cluster's on this machine (see LocalCluster.first_job_id)."""
    import random

    return random.randrange(1_000_000, 60_000_000, 1000)


def merge_umockdev(*files: str | Path) -> str:
    """One umockdev description of several files' devices (a device named twice, such as
    the root hub above two sticks, is kept once: the first file's block)."""
    blocks: dict[str, str] = {}
    for file in files:
        for block in Path(file).read_text().split("\n\n"):
            block = block.strip()
            if block:
                blocks.setdefault(block.splitlines()[0], block)
    return "\n\n".join(blocks.values()) + "\n"


REAL_LIBEDGETPU = REPO / "build" / "libedgetpu" / "libedgetpu.so.1"


def real_libedgetpu() -> str:
    """The real libedgetpu.so.1 that scripts/setup.sh built, else skip the test saying why."""
    import pytest

    if not REAL_LIBEDGETPU.exists():
        pytest.skip(
            f"the real libedgetpu is not built ({REAL_LIBEDGETPU.relative_to(REPO)} is missing): "
            "run scripts/setup.sh with the source bundle in ../shared/libedgetpu"
        )
    return str(REAL_LIBEDGETPU)


def repo_hooks():
    """The checkout's Prolog, Epilog and TaskProlog (their native entries where built), for a LocalCluster."""
    from harness.localcluster.cluster import project_hooks

    return project_hooks()


def double_root(cluster) -> str:
    """EDGETPU_DOUBLE_ROOT for a local cluster's jobs: where the libedgetpu double finds /sys and
    /dev, each node's simulated ones (``%n``: the job's $SLURMD_NODENAME), to open the devices
    the hooks hand over."""
    return os.path.join(cluster.path("nodes"), "%n")


@contextlib.contextmanager
def runner_job_workspace(prefix: str, user: str, image_count: int):
    """A directory jobs can read with generated models and the test-double libedgetpu, and a job user.

    Yields (directory, models, double library). The user is created if missing and
    removed again only if this made it; the directory is removed at the end.
    """
    from harness.modelgen import write_models

    sys.path.insert(0, str(TESTS))
    from edgetpu_double.build import build_double

    shared = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(shared, 0o755)
    models = write_models(shared / "models", image_count=image_count)
    (shared / "double").mkdir()
    double = build_double(shared / "double")
    made = subprocess.run(["id", "-u", user], capture_output=True).returncode != 0
    if made:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", "--user-group", user], check=True)
    try:
        yield shared, models, double
    finally:
        if made:
            subprocess.run(["userdel", user], capture_output=True)
        shutil.rmtree(shared, ignore_errors=True)


def wait_until(predicate, timeout: float = 60, what: str = "condition"):
    """``predicate()``'s first true value, asked every 0.2 s; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def walk_files(root) -> dict[str, tuple[os.stat_result, str | None]]:
    """path -> (its lstat, the sha256 of a regular file's bytes, else None) for everything under ``root``."""
    import hashlib

    listing: dict[str, tuple[os.stat_result, str | None]] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            digest = None
            if stat.S_ISREG(info.st_mode):
                with open(path, "rb") as handle:
                    digest = hashlib.sha256(handle.read()).hexdigest()
            listing[path] = (info, digest)
    return listing


def exposition(families) -> tuple[str, dict]:
    """Metric families (prometheus_client's) as a scrape gets them: the exposition text, and its
    families by name as prometheus_client's own parser reads that text back."""
    from prometheus_client.core import CollectorRegistry
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    class Fixed:
        def collect(self):
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    text = generate_latest(registry).decode()
    return text, {f.name: f for f in text_string_to_metric_families(text)}
