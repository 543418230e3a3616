"""Slurm's own accounting in the test clusters: a private MariaDB + slurmdbd per cluster (accounting_db.py).

Each module starts one cluster with ``accounting=True`` (MariaDB starts once per module,
about 3 s) and gives the tests' users an association in account ``stpu``.
"""

from __future__ import annotations

import shutil

import pytest

from helpers import USERS


def require_accounting() -> None:
    """Skip unless MariaDB's server and a slurmdbd are installed (scripts/setup.sh installs them)."""
    from slurm_tpu.slurm import installation

    install = installation.find(use_daemons=False)
    missing = [
        p
        for p in ("mariadbd", "mariadb-install-db", "mariadb")
        if not shutil.which(p) and not shutil.which(p, path="/usr/sbin")
    ]
    try:
        install.program("slurmdbd")
    except Exception:  # noqa: BLE001 - whatever the lookup raises, slurmdbd is missing
        missing.append(f"slurmdbd in {install.sbin_dir}")
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (scripts/setup.sh installs them)")


@pytest.fixture(scope="module")
def accounting_factory(cluster_factory, users):
    """``make(nodes, **kwargs)``: a started cluster with accounting whose test users have associations."""
    require_accounting()

    def make(nodes, **kwargs):
        cluster = cluster_factory(nodes, accounting=True, **kwargs)
        cluster.add_accounting_users(list(USERS))
        return cluster

    return make


def controller_view(cluster, flags: str, name: str) -> str:
    """The controller's record (``scontrol -o show assoc_mgr``) of user ``name`` (flags=assoc) or QOS ``name``
    (flags=qos), '' if it has none: what it enforces now. sacctmgr's changes reach the controller
    asynchronously from slurmdbd, so tests wait on this, never on sacctmgr's exit."""
    out = cluster.command(["scontrol", "-o", "show", "assoc_mgr", f"flags={flags}"], check=False).stdout
    mark = f"UserName={name}(" if flags == "assoc" else f"QOS={name}("
    return next((line for line in out.splitlines() if mark in line), "")


def job_field(cluster, job_id: int, name: str) -> str:
    """One field of ``scontrol show job`` (Reason, JobState, QOS...)."""
    from slurm_tpu.slurm.parse import parse_key_values

    out = cluster.command(["scontrol", "-o", "show", "job", str(job_id)], check=False).stdout
    return parse_key_values(out).get(name, "")


class ManualClock:
    """The accounting collector's clock (slurm_tpu/ops/accounting.py ``Clock``), moved only by the test:
    a window the test sets is spent, or not, because the test says so, never by how fast the machine is."""

    def __init__(self) -> None:
        from slurm_tpu.ops.accounting import Clock

        self.t = 1000.0
        self.clock = type("Manual", (Clock,), {"now": lambda _: self.t, "wall": lambda _: self.t})()
        self.clock.boot = "test-boot"

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def manual_clock() -> ManualClock:
    return ManualClock()
