"""Fixtures for the isolation tests: real unix users and a real local Slurm cluster."""

from __future__ import annotations

import os
import subprocess

import pytest

from support import HARDWARE, USERS, finish_cluster, make_cluster, require_root_and_slurm


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


@pytest.fixture(scope="module")
def one_node_two_tpus():
    """A cluster of one node, n1 with a USB stick and a PCIe card, and the project's hooks (per module)."""
    require_root_and_slurm()
    from slurm_tpu.localcluster.cluster import NodeSpec

    started = make_cluster([NodeSpec("n1", os.path.join(HARDWARE, "n1_two_tpus.umockdev"))])
    yield started
    finish_cluster(started)
