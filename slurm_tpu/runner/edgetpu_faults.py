"""Why an allocated Edge TPU cannot be used, in one line naming it, the cause and the fix.

Two moments, both seen with the real libedgetpu (tests/libedgetpu):

- Before asking libedgetpu to open a device, the runner checks that the library lists
  it. Asked to open a USB path it cannot enumerate, the real library retries for about
  25 s; a device it does not list therefore fails at once, and sysfs says why
  (:func:`absent_message`): unplugged or moved, not a Coral at all, hidden from this
  process by ``EDGETPU_VISIBLE_DEVICES`` (which the node's patched libedgetpu obeys), or
  present but invisible to libusb or to the apex driver.
- When an open fails, the library's own reason (captured from its verbose log, see
  ``engines.libedgetpu_reason``) is quoted with what to do (:func:`open_failure_message`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..families.coral import USB_BOOTLOADER, USB_IDS, USB_RUNTIME
from .devices import Device

CHECK = "run 'slurm-tpu detect --check-runtime' on the node"


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _where(device: Device) -> str:
    return f"{device.edgetpu_type}:{device.path}"


def hidden_by_visible_devices(path: str, visible: str | None) -> str | None:
    """Why ``EDGETPU_VISIBLE_DEVICES`` keeps ``path`` out of libedgetpu's list, or None.

    ``visible`` is the variable's value in this process (None: unset, every device
    visible). The node's libedgetpu enumerates only the paths it names, so a job
    whose variable and ``SLURM_TPU_EDGETPU_PATHS`` disagree (the user changed one of
    them) must be told that, not sent to debug libusb.
    """
    if visible is None or path in [entry.strip() for entry in visible.split(",")]:
        return None
    shown = visible if visible.strip() else "empty"
    return (
        f"{path} is not in EDGETPU_VISIBLE_DEVICES ({shown}), so libedgetpu hides it from this "
        "process; the task prolog sets that variable to the job's Edge TPUs: do not change it, or "
        "name one of its devices"
    )


def absent_message(device: Device, listed: Sequence[tuple[str, str]], visible: str | None = None) -> str:
    """The device is not in libedgetpu's list: say why, from the process's
    ``EDGETPU_VISIBLE_DEVICES`` (``visible``) and what sysfs and /dev show."""
    path = device.path or ""
    name = f"Edge TPU {device.identity}"
    seen = ", ".join(f"{t}:{p}" for t, p in listed) or "none"
    hidden = hidden_by_visible_devices(path, visible)
    if device.edgetpu_type == "usb":
        if not os.path.exists(path):
            return (
                f"{name} is not present: nothing at {path} (the stick was unplugged or moved to another "
                "port): plug it back into that port, or ask the admin to rerun 'slurm-tpu detect'"
            )
        ids = (_read(f"{path}/idVendor"), _read(f"{path}/idProduct"))
        if ids not in USB_IDS:
            coral = " or ".join(":".join(pair) for pair in (USB_RUNTIME, USB_BOOTLOADER))
            return (
                f"{name}: {path} is a {ids[0] or '?'}:{ids[1] or '?'} USB device, not a Coral Edge TPU "
                f"({coral}): check --device or the node's inventory"
            )
        if hidden:
            return f"{name}: {hidden}"
        return (
            f"{name} is at {path} but libedgetpu does not list it (it lists: {seen}): libusb cannot "
            f"enumerate it; {CHECK}"
        )
    if not os.path.exists(path):
        return (
            f"{name} is not present: {path} does not exist (the apex driver is not loaded, or the card "
            f"is gone): {CHECK}"
        )
    if hidden:
        return f"{name}: {hidden}"
    return (
        f"{name}: {path} exists but libedgetpu does not list it (it lists: {seen}; it looks in "
        f"/sys/class/apex): {CHECK}"
    )


def open_failure_message(device: Device, reason: str | None) -> str:
    """libedgetpu listed the device but could not open it: its reason, and what to do."""
    said = f"libedgetpu says: {reason}" if reason else "libedgetpu gave no reason"
    head = f"libedgetpu cannot open Edge TPU {device.identity} at {_where(device)} ({said})"
    text = reason or ""
    if "Permission denied" in text or "Operation not permitted" in text:
        return (
            f"{head}: this job may not open {device.path}; the node's slurm-tpu prolog did not hand "
            f"it over (see its log), or another process holds it; {CHECK}"
        )
    if device.edgetpu_type == "usb":
        return (
            f"{head}: the stick does not answer; unplug it and plug it back in (a USB 3 port, or a "
            f"powered hub), look for USB errors in 'dmesg', then {CHECK}"
        )
    if "mmap" in text:
        return (
            f"{head}: the apex driver could not map the card; look for apex errors in 'dmesg', "
            f"reload the driver (modprobe -r apex; modprobe apex) or reboot the node, then {CHECK}"
        )
    return f"{head}: {CHECK}"
