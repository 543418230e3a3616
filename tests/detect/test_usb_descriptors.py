"""Every USB device in the umockdev hardware descriptions carries real USB descriptors,
and so does every hub above it, root hub included: what libusb (and so the real
libedgetpu) needs to enumerate it at the port path a real kernel would show."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import usb_descriptors
from helpers import REPO

FILES = sorted([*REPO.glob("tests/**/*.umockdev"), *REPO.glob("demo/hardware/*.umockdev")])
BUILDERS = {("18d1", "9302"): usb_descriptors.coral_runtime, ("1a6e", "089a"): usb_descriptors.coral_bootloader}


def usb_devices(path: Path) -> dict[str, dict[str, str]]:
    """sysfs path -> its A:/H: attributes, for each USB device block of a umockdev file."""
    found = {}
    for block in path.read_text().split("\n\n"):
        lines = block.strip().splitlines()
        if "E: DEVTYPE=usb_device" in lines:
            found[lines[0][3:]] = dict(line[3:].split("=", 1) for line in lines if line[:3] in ("A: ", "H: "))
    return found


def test_the_files_are_found():
    names = {f.name for f in FILES}
    assert {"big_node.umockdev", "n1_two_tpus.umockdev", "node-usb.umockdev"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_usb_devices_have_descriptors_up_to_the_root_hub(path):
    devices = usb_devices(path)
    for syspath, attrs in devices.items():
        name = os.path.basename(syspath)
        where = f"{path.name}: {name}"
        assert "descriptors" in attrs, f"{where} has no 'H: descriptors=' line"
        parsed = usb_descriptors.parse(bytes.fromhex(attrs["descriptors"]))
        assert (parsed.vendor, parsed.product) == (attrs["idVendor"], attrs["idProduct"]), where
        assert parsed.config_total_length == parsed.config_bytes, f"{where}: wTotalLength disagrees"
        speed = int(attrs["speed"])
        # SuperSpeed: bcdUSB 3.x and a 2^9-byte control endpoint; slower: USB 1.1/2.x.
        assert (parsed.bcd_usb >= 0x0300) == (speed >= usb_descriptors.SUPERSPEED), where
        assert parsed.max_packet0 == (9 if speed >= usb_descriptors.SUPERSPEED else 8 if speed <= 12 else 64)
        if name.startswith("usb"):  # a root hub: usbN on bus N, always devnum 1
            assert (attrs["busnum"], attrs["devnum"], parsed.device_class) == (name[3:], "1", 9), where
            continue
        assert name.split("-")[0] == attrs["busnum"], where
        parent = os.path.dirname(syspath)
        assert parent in devices, f"{where}: its parent {os.path.basename(parent)} is not described"
        assert devices[parent]["busnum"] == attrs["busnum"], where
    for syspath in devices:  # a device's parent is a hub
        parent = os.path.dirname(syspath)
        if parent in devices:
            assert usb_descriptors.parse(bytes.fromhex(devices[parent]["descriptors"])).device_class == 9
    numbers = [(a["busnum"], a["devnum"]) for a in devices.values()]
    assert len(numbers) == len(set(numbers)), f"{path.name}: two devices share a bus/devnum"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_coral_descriptors_are_the_ones_the_builder_makes(path):
    """The hex in the files is what tests/usb_descriptors.py builds (regenerate with
    ``python tests/usb_descriptors.py coral-runtime|coral-bootloader SPEED``)."""
    for syspath, attrs in usb_devices(path).items():
        builder = BUILDERS.get((attrs["idVendor"], attrs["idProduct"]))
        if builder is not None:
            assert attrs["descriptors"] == builder(int(attrs["speed"])).hex(), f"{path.name}: {syspath}"


def test_coral_runtime_interface_is_what_libedgetpu_drives():
    """Vendor-specific interface, bulk OUT 1, bulk IN 0x81/0x82, interrupt IN 0x83."""
    for speed in (5000, 480):
        runtime = usb_descriptors.parse(usb_descriptors.coral_runtime(speed))
        assert runtime.interface_classes == (0xFF,)
        assert runtime.endpoints == ((0x01, 2), (0x81, 2), (0x82, 2), (0x83, 3))
    boot = usb_descriptors.coral_bootloader(480)
    assert usb_descriptors.parse(boot).interface_classes == (0xFE,)  # DFU, as usb_dfu_commands.cc looks for
