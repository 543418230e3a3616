"""Fixtures for the isolation tests: real unix users and a real local Slurm cluster."""

from __future__ import annotations

import subprocess

import pytest

from support import USERS, require_root_and_slurm


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
