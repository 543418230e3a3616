"""The offline container image (harness/containers/image.py): what is in it, and its cache.

The build needs root, mmdebstrap and the Debian mirror (a minute or so the first time); it is
then found in /var/cache/slurm-tpu/containers/<key>/ by the hash of its inputs.
"""

from __future__ import annotations

import json
import subprocess
import tarfile

import pytest

from harness.containers import image as builder
from helpers import require_root_and


@pytest.fixture(scope="module")
def built() -> builder.Image:
    require_root_and(("mmdebstrap", "mksquashfs"), "the offline image build")
    return builder.build()


def test_the_key_changes_with_every_input_and_only_with_them():
    values = builder.inputs()
    assert builder.key_of(values) == builder.key_of(json.loads(json.dumps(values)))
    for name, other in (("wheels", ["numpy==0"]), ("packages", ["python3"]), ("code", "0"), ("builder", -1)):
        assert builder.key_of({**values, name: other}) != builder.key_of(values), name


def test_user_code_is_coral_example_from_the_jobs_script():
    code = builder.user_code()
    assert 'ctypes.CDLL("libedgetpu.so.1")' in code
    assert "load_delegate" in code and "EOF" not in code


def test_image_holds_python_the_runtime_and_the_user_code_and_no_libedgetpu(built):
    with tarfile.open(built.rootfs) as tar:
        names = set(tar.getnames())
    assert "./usr/bin/python3" in names
    assert f"./{builder.CODE_IN_IMAGE}" in names
    for package in ("ai_edge_litert", "numpy", "PIL", "tflite", "flatbuffers"):
        assert f"./{builder.SITE}/{package}/__init__.py" in names, package
    # The job gets the node's libedgetpu (CDI / the enroot hook): the image brings none.
    assert not [n for n in names if "libedgetpu" in n]
    # No device node in either form: enroot unpacks the squashfs unprivileged.
    assert not [n for n in names if n.startswith("./dev/") and n != "./dev/"]
    listing = subprocess.run(["unsquashfs", "-l", built.squashfs], capture_output=True, text=True, check=True).stdout
    assert f"squashfs-root/{builder.CODE_IN_IMAGE}" in listing
    assert not [line for line in listing.splitlines() if line.startswith("squashfs-root/dev/")]


def test_a_second_build_is_the_cached_one(built):
    again = builder.build()
    assert again == built
    recorded = json.loads((builder.CACHE / built.key / "inputs.json").read_text())
    assert builder.key_of(recorded) == built.key
