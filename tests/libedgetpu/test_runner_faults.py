"""The runner against the REAL libedgetpu's failure modes: one line naming the device, the
library's own reason and what to do, each reached at once: libedgetpu goes to open a USB stick
at most once (it would retry a USB path it cannot enumerate 25 times, 1 s apart), counted from
its sleeps under strace rather than timed, so a busy machine cannot fail these tests.

The job's environment is what the task-prolog exports; the hardware is a umockdev
testbed, so libedgetpu enumerates through real libusb/sysfs and fails through its real
error paths (a testbed device answers no USB request and maps no PCIe BAR).
"""

from __future__ import annotations

import numpy as np
import pytest
from libedgetpu_support import (
    in_testbed,
    run_probe_counting_attempts,
    slurm_tpu,
    stick_behind_a_hub_without_descriptors,
)

from helpers import HARDWARE, REPO

N1 = REPO / "tests" / "isolation" / "hardware" / "n1_two_tpus.umockdev"  # apex_0 + stick 2-1.3
USB_STICK = {"SLURM_TPU_DEVICES": "usb-2-1.3", "SLURM_TPU_EDGETPU_PATHS": "usb:/sys/bus/usb/devices/2-1.3"}
PCIE_CARD = {"SLURM_TPU_DEVICES": "pci-0000:03:00.0", "SLURM_TPU_EDGETPU_PATHS": "pci:/dev/apex_0"}


def open_on(description, job_env: dict[str, str], library: str, model, tmp_path) -> dict:
    """The probe's answer, with ``attempts``: how many times libedgetpu went to open a USB device."""
    env = dict(job_env, SLURM_TPU_LOCK_DIR=str(tmp_path / "locks"))
    seen, attempts = run_probe_counting_attempts(
        "open_probe.py", description, [library, str(model)], env, tmp_path / "trace"
    )
    return dict(seen, attempts=attempts)


def test_unplugged_stick_fails_at_once(library, classifier_model, tmp_path):
    """The job was given 2-1.3, but only a stick in 2-2 is there."""
    seen = open_on(HARDWARE / "usb_second_stick.umockdev", USB_STICK, library, classifier_model, tmp_path)
    assert seen["error"]["type"] == "DeviceError"
    assert seen["error"]["message"] == (
        "Edge TPU usb-2-1.3 is not present: nothing at /sys/bus/usb/devices/2-1.3 (the stick was unplugged or "
        "moved to another port): plug it back into that port, or ask the admin to rerun 'slurm-tpu detect'"
    )
    assert seen["attempts"] == 0  # refused before libedgetpu opens anything


def test_stick_that_does_not_answer(library, classifier_model, tmp_path):
    seen = open_on(N1, USB_STICK, library, classifier_model, tmp_path)
    message = seen["error"]["message"]
    assert message.startswith(
        "libedgetpu cannot open Edge TPU usb-2-1.3 at usb:/sys/bus/usb/devices/2-1.3 "
        "(libedgetpu says: Unknown: USB error -1 [GetDeviceDescriptor]): the stick does "
        "not answer; unplug it and plug it back in"
    )
    assert message.endswith("run 'slurm-tpu detect --check-runtime' on the node")
    assert seen["attempts"] == 1  # one open, whose descriptor read fails: no retry


def test_pcie_card_that_cannot_be_mapped(library, classifier_model, tmp_path):
    seen = open_on(N1, PCIE_CARD, library, classifier_model, tmp_path)
    assert seen["error"]["message"].startswith(
        "libedgetpu cannot open Edge TPU pci-0000:03:00.0 at pci:/dev/apex_0 (libedgetpu says: Internal: Could not "
        "mmap: No such device): the apex driver could not map the card; look for apex errors in 'dmesg'"
    )
    assert seen["attempts"] == 0  # a PCIe card: opened once, no USB retry


def test_pcie_card_whose_node_is_gone(library, classifier_model, tmp_path):
    """The driver was unloaded: no apex device, no /dev/apex_0."""
    seen = open_on(HARDWARE / "pcie_no_driver.umockdev", PCIE_CARD, library, classifier_model, tmp_path)
    assert seen["error"]["message"].startswith(
        "Edge TPU pci-0000:03:00.0 is not present: /dev/apex_0 does not exist (the apex driver is not loaded"
    )
    assert seen["attempts"] == 0  # refused before libedgetpu opens anything


def test_a_path_that_is_not_a_coral(library, classifier_model, tmp_path):
    env = {"SLURM_TPU_DEVICES": "usb-1-2", "SLURM_TPU_EDGETPU_PATHS": "usb:/sys/bus/usb/devices/1-2"}
    seen = open_on(HARDWARE / "big_node.umockdev", env, library, classifier_model, tmp_path)
    assert seen["error"]["message"].startswith(
        "Edge TPU usb-1-2: /sys/bus/usb/devices/1-2 is a 046d:c31c USB device, not a Coral Edge TPU"
    )
    assert seen["attempts"] == 0  # refused before libedgetpu opens anything


def test_a_stick_libusb_cannot_place(library, classifier_model, tmp_path):
    """In sysfs at 2-1.3, but its hub has no descriptors: libusb reports it as 2-3."""
    seen = open_on(stick_behind_a_hub_without_descriptors(tmp_path), USB_STICK, library, classifier_model, tmp_path)
    assert seen["error"]["message"] == (
        "Edge TPU usb-2-1.3 is at /sys/bus/usb/devices/2-1.3 but libedgetpu does not list it (it lists: "
        "usb:/sys/bus/usb/devices/2-3): libusb cannot enumerate it; run 'slurm-tpu detect --check-runtime' "
        "on the node"
    )
    assert seen["attempts"] == 0  # libedgetpu lists the node's sticks, opens none


@pytest.mark.parametrize(
    "description,job_env",
    [(N1, USB_STICK), (HARDWARE / "usb_second_stick.umockdev", USB_STICK)],
    ids=["does-not-answer", "unplugged"],
)
def test_infer_prints_one_line(library, classifier_model, tmp_path, description, job_env):
    """What the user sees: one line on stderr, exit status 2, nothing on stdout."""
    env = dict(job_env, SLURM_TPU_LOCK_DIR=str(tmp_path / "locks"), SLURM_TPU_LIBEDGETPU=library)
    image = tmp_path / "input.npy"
    np.save(image, np.zeros((1, 24, 24, 3), dtype=np.uint8))
    done = in_testbed(description, slurm_tpu("infer", str(classifier_model), str(image)), env)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("slurm-tpu: error: ") and "usb-2-1.3" in line


@pytest.mark.parametrize("visible,shown", [("/dev/apex_0", "/dev/apex_0"), ("", "empty")], ids=["other", "empty"])
def test_a_device_the_visible_devices_variable_hides_is_named_as_such(
    library, classifier_model, tmp_path, visible, shown
):
    """SLURM_TPU_EDGETPU_PATHS names the stick but the user changed EDGETPU_VISIBLE_DEVICES: the
    patched library does not list the stick, and the line blames the variable, not libusb."""
    env = dict(USB_STICK, EDGETPU_VISIBLE_DEVICES=visible)
    seen = open_on(N1, env, library, classifier_model, tmp_path)
    assert seen["error"]["message"] == (
        f"Edge TPU usb-2-1.3: /sys/bus/usb/devices/2-1.3 is not in EDGETPU_VISIBLE_DEVICES ({shown}), so "
        "libedgetpu hides it from this process; the task prolog sets that variable to the job's Edge TPUs: "
        "do not change it, or name one of its devices"
    )
    assert seen["attempts"] == 0  # libedgetpu lists the node's sticks, opens none
