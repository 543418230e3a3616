"""Fixtures for the tests of the real libedgetpu: the library setup.sh built, a model."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import real_libedgetpu, require_root_and


@pytest.fixture(scope="session")
def library() -> str:
    """The real libedgetpu.so.1 (skips when it is not built, or without root/umockdev)."""
    require_root_and(("umockdev-run",), "umockdev testbeds")
    return real_libedgetpu()


@pytest.fixture(scope="session")
def classifier_model(tmp_path_factory) -> Path:
    from harness.modelgen import classifier

    path = tmp_path_factory.mktemp("models") / "classifier.tflite"
    path.write_bytes(classifier.build_classifier())
    return path
