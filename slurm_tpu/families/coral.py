"""Coral Edge TPUs: the USB Accelerator (both USB ids) and PCIe/M.2 cards (gasket + apex): their ids,
GRES defaults, udev rules and job variables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..hardware import Accelerator, Bus, Details
from ..protocol import jobenv
from .base import GASKET_WRITERS, USB_PORT, Candidate, Family, FamilyConfig, JobVariable, UdevRule
from .sysfs import Snapshot, SysDevice, accelerator_from, int_or_none, millidegrees, pci_accelerator

KIND = "edgetpu"
USB_BOOTLOADER = ("1a6e", "089a")  # Global Unichip: waiting for its firmware
USB_RUNTIME = ("18d1", "9302")  # Google: firmware loaded
USB_IDS = (USB_BOOTLOADER, USB_RUNTIME)
PCI_ID = ("0x1ac1", "0x089a")
USB3_MBPS = 5000  # below SuperSpeed the same model runs about 3x slower


def usb_product_prefix(ids: tuple[str, str]) -> str:
    """The udev PRODUCT property's prefix for a USB id (``1a6e/89a/``: hex without leading zeros)."""
    return f"{int(ids[0], 16):x}/{int(ids[1], 16):x}/"


@dataclass(frozen=True)
class UsbDetails(Details):
    """A Coral USB Accelerator: its link and whether its firmware is loaded."""

    usb_speed_mbps: int | None = None
    slow_link: bool = False
    firmware_loaded: bool = False
    busnum: int | None = None
    devnum: int | None = None

    def notes(self) -> list[str]:
        notes = []
        if self.slow_link:
            notes.append(f"USB {self.usb_speed_mbps} Mbit/s link: about 3x slower than USB 3")
        if not self.firmware_loaded:
            notes.append("firmware not loaded yet")
        return notes


@dataclass(frozen=True)
class ApexDetails(Details):
    """A Coral PCIe card with its apex class device: temperature, trip points, serial."""

    apex: str = ""
    temperature_c: float | None = None
    trip_points_c: tuple[float, ...] = ()
    unique_id: str | None = None

    def notes(self) -> list[str]:
        return [f"{self.temperature_c:.1f} C"] if self.temperature_c is not None else []

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "trip_points_c": list(self.trip_points_c)}


def usb_edgetpu(device: SysDevice) -> Accelerator | None:
    """An Accelerator for a Coral USB stick in either mode, else None."""
    ids = device.attributes.get("idVendor", ""), device.attributes.get("idProduct", "")
    if ids not in USB_IDS:
        return None
    speed = int_or_none(device.attributes.get("speed"))
    firmware_loaded = ids == USB_RUNTIME
    details = UsbDetails(
        usb_speed_mbps=speed,
        slow_link=speed is not None and speed < USB3_MBPS,
        firmware_loaded=firmware_loaded,
        busnum=int_or_none(device.attributes.get("busnum")),
        devnum=int_or_none(device.attributes.get("devnum")),
    )
    reason = "" if device.device_node else f"USB device {device.sys_name} has no device node under /dev/bus/usb"
    return accelerator_from(
        device,
        identity=f"usb-{device.sys_name}",
        kind=KIND,
        bus=Bus.USB,
        vendor_id=ids[0],
        product_id=ids[1],
        vendor="Google" if firmware_loaded else "Global Unichip",
        model="Coral USB Accelerator",
        device_nodes=(device.device_node,) if device.device_node else (),
        reason=reason,
        details=details,
    )


def pci_edgetpu(device: SysDevice, snapshot: Snapshot) -> Accelerator | None:
    """An Accelerator for a Coral PCIe/M.2 card, usable only with gasket+apex loaded."""
    if (device.attributes.get("vendor"), device.attributes.get("device")) != PCI_ID:
        return None
    apex = snapshot.children(device, "apex")
    details: Details = Details()
    nodes: tuple[str, ...] = ()
    reason = ""
    if not device.driver:
        reason = (
            f"PCI device {device.sys_name} has no driver bound: install gasket-dkms "
            "and load the apex module (modprobe apex)"
        )
    elif not apex:
        reason = f"driver {device.driver} is bound to {device.sys_name} but created no apex device"
    else:
        class_device = apex[0]
        attrs = class_device.attributes
        trips = (millidegrees(attrs.get(f"trip_point{i}_temp")) for i in range(3))
        details = ApexDetails(
            apex=class_device.sys_name,
            temperature_c=millidegrees(attrs.get("temp")),
            trip_points_c=tuple(t for t in trips if t is not None),
            unique_id=attrs.get("unique_id") or None,
        )
        if class_device.device_node:
            nodes = (class_device.device_node,)
        else:
            reason = f"apex device {class_device.sys_name} has no /dev node"
    return pci_accelerator(device, KIND, "Global Unichip", "Coral PCIe Accelerator", nodes, reason, details)


class EdgeTpuFamily(Family):
    """Coral Edge TPUs: leased, slot nodes, USB revocation by port power-cycle."""

    kind = KIND
    title = "Edge TPU"
    attributes = {
        "usb": ("idVendor", "idProduct", "speed", "busnum", "devnum", "manufacturer", "product"),
        "pci": ("vendor", "device"),
        "apex": ("temp", "trip_point0_temp", "trip_point1_temp", "trip_point2_temp", "unique_id", "device_owner"),
    }
    watched = ("usb", "apex", "pci")
    default_config = FamilyConfig("tpu", {"usb": "edgetpu_usb", "pci": "edgetpu_pci"}, ("tpu", "edgetpu"))
    slot = True
    revocation = {"usb": USB_PORT, "pci": GASKET_WRITERS}  # see slurm_tpu/access/revoke.py for why each
    udev_identities = (UdevRule("usb", "usb_device", "usb", 1), UdevRule("apex", "", "pci", 3))
    variables = (
        JobVariable(jobenv.DEVICES, lambda identity, node: identity, unset_when_empty=False),
        JobVariable(
            jobenv.EDGETPU_PATHS,
            lambda identity, node: ":".join(jobenv.libedgetpu_path(identity, node)),  # type:path
            unset_when_empty=False,
        ),
        # The node's libedgetpu reads it (our patch): unmodified Coral code sees only these.
        JobVariable(
            jobenv.EDGETPU_VISIBLE,
            lambda identity, node: jobenv.libedgetpu_path(identity, node)[1],
            unset_when_empty=False,
            never_unset=True,
        ),
    )
    runner = "edgetpu"
    # A shared Edge TPU is counted in one node-level GRES (no File=): the node's broker owns it, never a job.
    shard_gres = "tpu_shard"
    shard_per_file = False
    # Energy (no power tool exists for Coral): datasheet figures, 4 TOPS at 2 W; a USB accelerator's
    # idle draw within its 500-900 mA at 5 V budget. Not measured here: calibrate with families.edgetpu.watts.
    default_watts = {"usb": (0.5, 2.0), "pci": (0.3, 2.0)}
    extra_config_keys = {
        "types.usb": (str, "GRES type for USB Edge TPUs"),
        "types.pci": (str, "GRES type for PCIe/M.2 Edge TPUs"),
        "shard_gres_name": (str, "name of the counted GRES of shared Edge TPUs (not shard or mps: Slurm's, GPU-only)"),
    }

    def wanted(self, device: Candidate) -> bool:
        if device.subsystem == "usb":
            return (
                device.devtype == "usb_device"
                and (device.attribute("idVendor"), device.attribute("idProduct")) in USB_IDS
            )
        if device.subsystem == "pci":
            return (device.attribute("vendor"), device.attribute("device")) == PCI_ID
        return device.subsystem == "apex"

    def event_relevant(self, subsystem: str, properties: Mapping[str, str]) -> bool:
        if subsystem == "usb":  # a remove event has no sysfs attributes left: match PRODUCT
            return properties.get("DEVTYPE") == "usb_device" and properties.get("PRODUCT", "").startswith(
                tuple(usb_product_prefix(ids) for ids in USB_IDS)
            )
        return subsystem in self.watched

    def find(self, snapshot: Snapshot) -> list[Accelerator]:
        """USB sticks by topology path, then PCIe cards by address."""
        found = [a for a in map(usb_edgetpu, snapshot.of_subsystem("usb")) if a]
        found += [a for a in (pci_edgetpu(d, snapshot) for d in snapshot.of_subsystem("pci")) if a]
        return found

    def details_from_json(self, item: Mapping[str, Any]) -> Details:
        data = item.get("details") or {}
        if item.get("bus") == "usb":
            return UsbDetails.from_json(data)
        if "apex" in data:
            return ApexDetails.from_json({**data, "trip_points_c": tuple(data.get("trip_points_c") or ())})
        return Details()

    def parse_types(self, section: Mapping[str, Any], where: str) -> dict[str, str]:
        types = dict(self.default_config.types)
        for bus in types:
            types[bus] = section.get(f"types.{bus}", types[bus])
            if not types[bus]:
                raise ConfigError(
                    f"{where}: 'families.{self.kind}.types.{bus}' must not be empty",
                    key=f"families.{self.kind}.types.{bus}",
                )
        return types

    def gres_type(self, config: FamilyConfig, accelerator: Accelerator) -> str:
        """The configured type for the device's bus."""
        return config.types[accelerator.bus.value]

    def watts_key(self, config: FamilyConfig, accelerator: Accelerator) -> str:
        """The bus: a USB accelerator and a PCIe/M.2 card draw differently at idle."""
        return accelerator.bus.value

    def udev_rules(self, config: FamilyConfig, own: str, run: str) -> list[str]:
        usb = 'SUBSYSTEM=="usb", ENV{DEVTYPE}=="usb_device"'
        (boot_vendor, boot_product), (fw_vendor, fw_product) = USB_BOOTLOADER, USB_RUNTIME
        products = "|".join(usb_product_prefix(ids) + "*" for ids in USB_IDS)
        return [
            f"# Coral USB Accelerator before its firmware is loaded (Global Unichip {boot_vendor}:{boot_product})",
            f'ACTION=="add|change|bind", {usb}, ATTR{{idVendor}}=="{boot_vendor}", '
            f'ATTR{{idProduct}}=="{boot_product}", {own}, {run}',
            f"# ... and after (Google {fw_vendor}:{fw_product}): a new /dev/bus/usb node, the same topology path",
            f'ACTION=="add|change|bind", {usb}, ATTR{{idVendor}}=="{fw_vendor}", '
            f'ATTR{{idProduct}}=="{fw_product}", {own}, {run}',
            "# Removal: sysfs attributes are gone by then; match the PRODUCT property instead",
            f'ACTION=="remove", {usb}, ENV{{PRODUCT}}=="{products}", {run}',
            "",
            "# Coral PCIe / M.2 Accelerator (gasket + apex drivers, /dev/apex_N)",
            f'ACTION!="remove", SUBSYSTEM=="apex", {own}, {run}',
            f'ACTION=="remove", SUBSYSTEM=="apex", {run}',
        ]


FAMILY = EdgeTpuFamily()
