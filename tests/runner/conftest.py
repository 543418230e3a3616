"""Fixtures for the runner tests: generated models, the libedgetpu double, a CLI runner."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from runner_support import USB_A, USB_B, device_root

from edgetpu_double.build import build_double
from harness.modelgen import write_models

# Device and job variables a developer's shell (or a CI job inside Slurm) may carry.
_SCRUB = ("SLURM_TPU_", "SLURM_ARRAY_", "CUDA_VISIBLE_DEVICES", "EDGETPU_DOUBLE_", "SLURM_JOB_ID")


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    return write_models(tmp_path_factory.mktemp("models"), image_count=18)


@pytest.fixture(scope="session")
def libedgetpu_double(tmp_path_factory) -> Path:
    try:
        return build_double(tmp_path_factory.mktemp("double"))
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.fixture
def clean_env(tmp_path, monkeypatch) -> dict[str, str]:
    """os.environ without device/job variables, with a private lock directory."""
    for key in list(os.environ):
        if key.startswith(_SCRUB):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_TPU_LOCK_DIR", str(tmp_path / "locks"))
    return dict(os.environ)


@pytest.fixture
def tpu_env(clean_env, libedgetpu_double, tmp_path) -> dict[str, str]:
    """A job that was given the USB Edge TPU at 2-1.4 (the double sees 2-1.3 and 2-1.4, and opens
    their nodes under a stand-in root: runner_support.device_root)."""
    env = dict(clean_env)
    env.update(
        {
            "SLURM_TPU_DEVICES": "usb-2-1.4",
            "SLURM_TPU_EDGETPU_PATHS": f"usb:{USB_B}",
            "SLURM_TPU_LIBEDGETPU": str(libedgetpu_double),
            "EDGETPU_DOUBLE_DEVICES": f"usb:{USB_A},usb:{USB_B}",
            "EDGETPU_DOUBLE_LOG": str(tmp_path / "double.log"),
            "EDGETPU_DOUBLE_ROOT": str(device_root(tmp_path / "root")),
        }
    )
    return env
