"""The REAL libedgetpu on a simulated Raspberry Pi 4 (tests/hardware/pi4_coral_usb*.umockdev).

Two Coral sticks on the VL805 controller: one on a blue USB 3 port (root port ``2-1`` of the
SuperSpeed bus), one on a black USB 2 port (``1-1.3``, behind the VL805's internal USB 2 hub
``1-1``). libusb builds a stick's port path from its chain of hubs, so the library names each at
its true path only when every hub's descriptors are right; and with ``EDGETPU_VISIBLE_DEVICES``
(our patch) it lists exactly the job's stick.

The arm64 CI leg runs this file under qemu-user, where ptrace (strace) does not work and LiteRT
is slow to import: so these tests only list (``edgetpu_list_devices()`` through ctypes, which opens
no device), a few processes in all. Without the built library they skip, saying why. (Not named
test_raspberry_pi.py: pytest's default import mode cannot collect two test modules of one basename,
and tests/detect has that one.)
"""

from __future__ import annotations

from pathlib import Path

from libedgetpu_support import run_probe

from helpers import HARDWARE

PI4 = HARDWARE / "pi4_coral_usb.umockdev"
PI4_UNFLASHED = HARDWARE / "pi4_coral_usb_unflashed.umockdev"
USB3, USB2 = "/sys/bus/usb/devices/2-1", "/sys/bus/usb/devices/1-1.3"
VARIABLE = "EDGETPU_VISIBLE_DEVICES"


def listed(library: str, description: Path, visible: str | None = None) -> list[str]:
    """``edgetpu_list_devices()`` in a testbed, as "type:path", with EDGETPU_VISIBLE_DEVICES if given."""
    env = {VARIABLE: visible} if visible is not None else None
    return run_probe("visible_probe.py", description, [library, "list"], env)["listed"]


def test_lists_both_sticks_at_their_true_port_paths_as_detect_exports_them(library):
    """Our detection, the paths the task prolog would export, and the library's own list agree."""
    seen = run_probe("probe.py", PI4, [library])
    assert seen["exported"] == {"usb-1-1.3": f"usb:{USB2}", "usb-2-1": f"usb:{USB3}"}
    assert sorted(seen["listed"]) == [f"usb:{USB2}", f"usb:{USB3}"]  # not 1-3: the hub 1-1 was read
    assert seen["visible"] == list(seen["exported"].values())


def test_sticks_awaiting_their_firmware_are_listed_at_the_same_paths(library):
    """Right after boot both sticks are 1a6e:089a: the library lists them where it will list them
    once flashed (the path is the stick's identity; its devnum changes)."""
    assert sorted(listed(library, PI4_UNFLASHED)) == [f"usb:{USB2}", f"usb:{USB3}"]


def test_edgetpu_visible_devices_narrows_the_list_to_the_jobs_stick(library):
    assert listed(library, PI4, USB2) == [f"usb:{USB2}"]  # the slow one: still only it
    assert listed(library, PI4, USB3) == [f"usb:{USB3}"]
    assert listed(library, PI4, f"{USB3},{USB2}") == [f"usb:{USB3}", f"usb:{USB2}"]  # the variable's order
    assert listed(library, PI4, "") == []  # a job without an Edge TPU on this node
