"""Recognise Coral Edge TPUs (USB Accelerator, PCIe/M.2) in a snapshot."""

from __future__ import annotations

from ..model import Accelerator, Bus, Kind
from .snapshot import Snapshot, SysDevice, accelerator_from

USB_BOOTLOADER = ("1a6e", "089a")  # Global Unichip: waiting for its firmware
USB_RUNTIME = ("18d1", "9302")  # Google: firmware loaded
PCI_ID = ("0x1ac1", "0x089a")
# Below SuperSpeed (5000 Mbit/s) the same model runs about 3x slower.
USB3_MBPS = 5000


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text not in (None, "") else None
    except ValueError:
        return None


def usb_edgetpu(device: SysDevice) -> Accelerator | None:
    """An Accelerator for a Coral USB stick in either mode, else None."""
    ids = (device.attributes.get("idVendor", ""), device.attributes.get("idProduct", ""))
    if ids not in (USB_BOOTLOADER, USB_RUNTIME):
        return None
    speed = _int(device.attributes.get("speed"))
    firmware_loaded = ids == USB_RUNTIME
    details = {
        "usb_speed_mbps": speed,
        "slow_link": speed is not None and speed < USB3_MBPS,
        "firmware_loaded": firmware_loaded,
        "busnum": _int(device.attributes.get("busnum")),
        "devnum": _int(device.attributes.get("devnum")),
    }
    usable, reason = True, ""
    if not device.device_node:
        usable, reason = False, f"USB device {device.sys_name} has no device node under /dev/bus/usb"
    return accelerator_from(
        device,
        identity=f"usb-{device.sys_name}",
        kind=Kind.EDGETPU,
        bus=Bus.USB,
        vendor_id=ids[0],
        product_id=ids[1],
        vendor="Google" if firmware_loaded else "Global Unichip",
        model="Coral USB Accelerator",
        device_nodes=(device.device_node,) if device.device_node else (),
        usable=usable,
        reason=reason,
        details=details,
    )


def _millidegrees(text: str | None) -> float | None:
    value = _int(text)
    return value / 1000.0 if value is not None else None


def pci_edgetpu(device: SysDevice, snapshot: Snapshot) -> Accelerator | None:
    """An Accelerator for a Coral PCIe/M.2 card, usable only with gasket+apex loaded."""
    if (device.attributes.get("vendor"), device.attributes.get("device")) != PCI_ID:
        return None
    apex = snapshot.children(device, "apex")
    details: dict[str, object] = {}
    usable, reason, nodes = True, "", ()
    if not device.driver:
        usable = False
        reason = (f"PCI device {device.sys_name} has no driver bound: install gasket-dkms "
                  "and load the apex module (modprobe apex)")
    elif not apex:
        usable = False
        reason = f"driver {device.driver} is bound to {device.sys_name} but created no apex device"
    else:
        class_device = apex[0]
        attrs = class_device.attributes
        details = {
            "apex": class_device.sys_name,
            "temperature_c": _millidegrees(attrs.get("temp")),
            "trip_points_c": [t for t in (_millidegrees(attrs.get(f"trip_point{i}_temp"))
                                          for i in range(3)) if t is not None],
            "unique_id": attrs.get("unique_id") or None,
        }
        if class_device.device_node:
            nodes = (class_device.device_node,)
        else:
            usable, reason = False, f"apex device {class_device.sys_name} has no /dev node"
    return accelerator_from(
        device,
        identity=f"pci-{device.sys_name}",
        kind=Kind.EDGETPU,
        bus=Bus.PCI,
        vendor_id=PCI_ID[0][2:],
        product_id=PCI_ID[1][2:],
        vendor="Global Unichip",
        model="Coral PCIe Accelerator",
        device_nodes=nodes,
        usable=usable,
        reason=reason,
        details=details,
    )


def find_edgetpus(snapshot: Snapshot) -> list[Accelerator]:
    """All Edge TPUs: USB sticks by topology path, then PCIe cards by address."""
    found = [a for a in map(usb_edgetpu, snapshot.of_subsystem("usb")) if a]
    found += [a for a in (pci_edgetpu(d, snapshot) for d in snapshot.of_subsystem("pci")) if a]
    return found
