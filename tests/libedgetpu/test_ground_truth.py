"""Ground truth for our identities and paths: the REAL libedgetpu under umockdev.

For each described node, the (type, path) pairs that the real ``edgetpu_list_devices()``
returns are exactly the paths our detection exports in ``SLURM_TPU_EDGETPU_PATHS`` (see
probe.py): USB sticks in both modes, one after re-enumeration, behind hubs and on a root
port, PCIe cards with and without their driver. And the library's own index order
changes when another stick changes mode, which is why the runner never passes ``usb:N``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from libedgetpu_support import run_probe, stick_behind_a_hub_without_descriptors

from helpers import HARDWARE, REPO, merge_umockdev

ISOLATION_HARDWARE = REPO / "tests" / "isolation" / "hardware"
DEMO_HARDWARE = REPO / "demo" / "hardware"


def probe(description: Path, library: str) -> dict:
    """Our inventory, the exported paths and the library's list on one described node."""
    return run_probe("probe.py", description, [library])


def two_sticks(tmp_path: Path, *files: str) -> Path:
    path = tmp_path / ("+".join(files) + ".umockdev")
    path.write_text(merge_umockdev(*(HARDWARE / f"{f}.umockdev" for f in files)))
    return path


NODES = {
    # name: (description, the exported paths we expect, written out)
    "stick awaiting firmware, behind a hub": (
        HARDWARE / "usb_stick_before.umockdev",
        {"usb-2-1.3": "usb:/sys/bus/usb/devices/2-1.3"},
    ),
    "same stick re-enumerated with firmware": (
        HARDWARE / "usb_stick_after.umockdev",
        {"usb-2-1.3": "usb:/sys/bus/usb/devices/2-1.3"},
    ),
    "stick on a root port": (HARDWARE / "usb_second_stick.umockdev", {"usb-2-2": "usb:/sys/bus/usb/devices/2-2"}),
    "4 PCIe cards and 2 sticks (USB 2 hub, root port)": (
        HARDWARE / "big_node.umockdev",
        {
            "usb-2-1": "usb:/sys/bus/usb/devices/2-1",
            "usb-1-1.4": "usb:/sys/bus/usb/devices/1-1.4",
            "pci-0000:03:00.0": "pci:/dev/apex_0",
            "pci-0000:04:00.0": "pci:/dev/apex_1",
            "pci-0000:05:00.0": "pci:/dev/apex_3",
            "pci-0000:06:00.0": "pci:/dev/apex_2",
        },
    ),
    "PCIe card without its driver": (HARDWARE / "pcie_no_driver.umockdev", {}),
    "no accelerator, a keyboard": (HARDWARE / "empty_node.umockdev", {}),
    "cluster node: PCIe card and a stick": (
        ISOLATION_HARDWARE / "n1_two_tpus.umockdev",
        {"usb-2-1.3": "usb:/sys/bus/usb/devices/2-1.3", "pci-0000:03:00.0": "pci:/dev/apex_0"},
    ),
    "demo: Raspberry Pi stick behind its on-board hub": (
        DEMO_HARDWARE / "node-usb.umockdev",
        {"usb-1-1.3": "usb:/sys/bus/usb/devices/1-1.3"},
    ),
    "demo: 2 PCIe cards": (
        DEMO_HARDWARE / "node-pcie.umockdev",
        {"pci-0000:01:00.0": "pci:/dev/apex_0", "pci-0000:02:00.0": "pci:/dev/apex_1"},
    ),
}


@pytest.mark.parametrize("name", NODES)
def test_libedgetpu_lists_exactly_the_paths_we_export(library, name):
    description, expected = NODES[name]
    seen = probe(description, library)
    assert seen["exported"] == expected  # our detection, as the task-prolog exports it
    assert sorted(seen["listed"]) == sorted(expected.values())  # the real library agrees
    # With the job's EDGETPU_VISIBLE_DEVICES, it lists exactly those, in the exported order.
    assert seen["visible"] == list(seen["exported"].values())


def test_a_pcie_card_without_driver_is_neither_listed_nor_exported(library):
    seen = probe(HARDWARE / "pcie_no_driver.umockdev", library)
    [card] = seen["inventory"]["accelerators"]
    assert card["usable"] is False and "no driver" in card["reason"]
    assert seen["listed"] == [] and seen["exported"] == {}


def test_libedgetpu_order_usb_awaiting_firmware_first(library):
    """PCIe first (readdir order of /sys/class/apex), then USB 1a6e:089a, then 18d1:9302."""
    listed = probe(HARDWARE / "big_node.umockdev", library)["listed"]
    assert [entry.split(":")[0] for entry in listed] == ["pci"] * 4 + ["usb"] * 2
    assert listed[4:] == ["usb:/sys/bus/usb/devices/1-1.4", "usb:/sys/bus/usb/devices/2-1"]  # 089a before 9302


def test_index_shifts_when_another_stick_changes_mode(library, tmp_path):
    """Two sticks with firmware: ours (2-2) is usb:0. The other one (2-1.3) is reset, e.g.
    by libedgetpu closing it at the end of another job, and comes back awaiting its
    firmware: it is listed first, so ours is now usb:1 and usb:0 is the other job's
    stick. The path we export for ours does not move."""
    ours, other = "usb:/sys/bus/usb/devices/2-2", "usb:/sys/bus/usb/devices/2-1.3"
    before = probe(two_sticks(tmp_path, "usb_stick_after", "usb_second_stick"), library)
    after = probe(two_sticks(tmp_path, "usb_stick_before", "usb_second_stick"), library)
    assert before["listed"] == [ours, other]
    assert after["listed"] == [other, ours]
    assert before["exported"]["usb-2-2"] == after["exported"]["usb-2-2"] == ours


def test_without_hub_descriptors_libusb_shortens_the_path(library, tmp_path):
    """Why every hub above a stick carries descriptors: without them libusb cannot link the
    stick to its hub, and the real library reports 2-1.3 as 2-3 (a path that names
    nothing in sysfs). `slurm-tpu detect --check-runtime` reports exactly this disagreement."""
    seen = probe(stick_behind_a_hub_without_descriptors(tmp_path), library)
    assert seen["exported"] == {"usb-2-1.3": "usb:/sys/bus/usb/devices/2-1.3"}
    assert seen["listed"] == ["usb:/sys/bus/usb/devices/2-3"]
