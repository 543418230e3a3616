"""``slurm-tpu detect --check-runtime`` with the REAL libedgetpu on umockdev-described nodes."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from libedgetpu_support import in_testbed, library_version, slurm_tpu, stick_behind_a_hub_without_descriptors

from helpers import HARDWARE, REPO

N1 = REPO / "tests" / "isolation" / "hardware" / "n1_two_tpus.umockdev"


def check(description, library: str, *extra: str, env: dict[str, str] | None = None):
    return in_testbed(description, slurm_tpu("detect", "--check-runtime", "--libedgetpu", library, *extra), env)


def test_agreement(library):
    done = check(N1, library)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    version = library_version(library)
    assert version.startswith("BuildLabel(") and version.endswith("RuntimeVersion(14)")  # the bundle's runtime
    assert lines[0] == f"libedgetpu: {library} ({version})"
    assert lines[1:] == [
        "ok: usb-2-1.3: libedgetpu lists it at usb:/sys/bus/usb/devices/2-1.3",
        "ok: pci-0000:03:00.0: libedgetpu lists it at pci:/dev/apex_0",
        "libedgetpu and slurm-tpu agree",
    ]


def test_card_without_driver(library):
    done = check(HARDWARE / "pcie_no_driver.umockdev", library)
    assert done.returncode == 1
    assert (
        "PROBLEM: pci-0000:03:00.0: not usable: PCI device 0000:03:00.0 has no driver bound: install "
        "gasket-dkms and load the apex module (modprobe apex)"
    ) in done.stdout.splitlines()


def test_stick_libusb_places_elsewhere(library, tmp_path):
    done = check(stick_behind_a_hub_without_descriptors(tmp_path), library, "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["agrees"] is False and report["listed"] == ["usb:/sys/bus/usb/devices/2-3"]
    [ours, theirs] = report["findings"]
    assert (ours["identity"], ours["path"], ours["ok"]) == ("usb-2-1.3", "usb:/sys/bus/usb/devices/2-1.3", False)
    assert "libedgetpu does not list it: libusb cannot enumerate it" in ours["message"]
    assert (theirs["identity"], theirs["path"], theirs["ok"]) == (None, "usb:/sys/bus/usb/devices/2-3", False)
    assert "placed a stick behind a hub it could not read" in theirs["message"]


def test_job_user_who_cannot_open_the_job_device(library):
    """Run as a non-root user inside a 'job' given usb-2-1.3 whose node is not theirs."""
    if not shutil.which("runuser"):
        pytest.skip("runuser is not installed")
    script = (
        f'chmod 000 "$UMOCKDEV_DIR/dev/bus/usb/002/005" && exec {sys.executable} -m slurm_tpu.cli '
        f"detect --check-runtime --libedgetpu {library}"
    )
    job = {
        "SLURM_TPU_DEVICES": "usb-2-1.3",
        "SLURM_TPU_EDGETPU_PATHS": "usb:/sys/bus/usb/devices/2-1.3",
        "EDGETPU_VISIBLE_DEVICES": "/sys/bus/usb/devices/2-1.3",
    }
    # The testbed is nobody's: the node is made unopenable for them inside it.
    done = in_testbed(N1, ["sh", "-c", script], env=job, user="nobody")
    assert done.returncode == 1, done.stderr
    # The job's EDGETPU_VISIBLE_DEVICES does not hide the node's other Edge TPU from the check.
    assert "ok: pci-0000:03:00.0: libedgetpu lists it at pci:/dev/apex_0" in done.stdout.splitlines()
    assert (
        "PROBLEM: usb-2-1.3: this job's user cannot open /dev/bus/usb/002/005 (owner uid 65534, mode "
        "0000): the node's slurm-tpu prolog did not hand it over"
    ) in done.stdout


def test_library_that_cannot_load(tmp_path):
    missing = str(tmp_path / "libedgetpu.so.1")
    done = in_testbed(HARDWARE / "empty_node.umockdev", slurm_tpu("detect", "--check-runtime", "--libedgetpu", missing))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"slurm-tpu: error: cannot load the Edge TPU runtime {missing} (No such file or directory): install "
        "libedgetpu1-std from Coral's apt repository, or point --libedgetpu / SLURM_TPU_LIBEDGETPU at it"
    ]
