"""Fixtures for the broker tests: generated models, the libedgetpu double, a broker process, job cgroups."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from broker_support import BrokerProcess, JobCgroups, temp_base

from edgetpu_double.build import build_double
from harness.modelgen import write_models


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    out = temp_base() / "models"
    paths = write_models(out, image_count=6)
    os.chmod(out, 0o755)
    yield paths
    shutil.rmtree(out.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def double(tmp_path_factory) -> Path:
    if os.geteuid() != 0:
        pytest.skip("the broker runs as root")
    try:
        built = build_double(temp_base())
    except RuntimeError as exc:
        pytest.skip(str(exc))
    return built


@pytest.fixture(scope="session")
def cgroups():
    groups = JobCgroups()
    if groups.base is None:
        pytest.skip("no writable cgroup hierarchy to put the test's clients in a job_<J> cgroup")
    yield groups
    groups.cleanup()


@pytest.fixture
def broker(double):
    base = temp_base()
    process = BrokerProcess(base, double).start()
    yield process
    process.kill()
    shutil.rmtree(base, ignore_errors=True)
