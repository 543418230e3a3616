"""The NVML double (tests/nvml_double) for the energy tests: built once per module, and each test's own GPUs."""

from __future__ import annotations

import pytest

import nvml_double


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> str:
    """The double's libnvidia-ml.so.1 (the module is skipped where it cannot be built)."""
    return nvml_double.build_or_skip(tmp_path_factory)


@pytest.fixture
def gpus(tmp_path, monkeypatch):
    """An empty state directory the double reads (each test's own GPUs)."""
    state = tmp_path / "gpus"
    state.mkdir()
    monkeypatch.setenv(nvml_double.STATE_VARIABLE, str(state))
    return state
