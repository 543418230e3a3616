"""The plain records of a udev/sysfs snapshot, as the families read them (``slurm_tpu.detect.snapshot``
fills them through pyudev; everything that reads them is pure and testable on literal data)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..hardware import Accelerator, Bus, Details


@dataclass(frozen=True)
class SysDevice:
    """The facts about one udev device that the families use."""

    sys_path: str
    sys_name: str
    subsystem: str
    devtype: str = ""
    driver: str = ""
    device_node: str = ""
    properties: Mapping[str, str] = field(default_factory=dict)
    attributes: Mapping[str, str] = field(default_factory=dict)
    numa_node: int | None = None
    local_cpus: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything detection looked at, keyed by sysfs path."""

    devices: Mapping[str, SysDevice]
    # bus address -> facts a driver publishes outside sysfs (Family.driver_info).
    driver_info: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    dev_entries: frozenset[str] = frozenset()  # /dev nodes no udev device announces (Family.unannounced_nodes)
    online_cpus: str | None = None
    # CPU id -> (physical package id, core id), from sysfs topology; {} if unreadable.
    cpu_topology: Mapping[int, tuple[int, int]] = field(default_factory=dict)

    def of_subsystem(self, subsystem: str) -> list[SysDevice]:
        """Devices of one subsystem, sorted by sysfs path."""
        return sorted((d for d in self.devices.values() if d.subsystem == subsystem), key=lambda d: d.sys_path)

    def children(self, parent: SysDevice, subsystem: str) -> list[SysDevice]:
        """Devices of ``subsystem`` below ``parent`` in the sysfs tree."""
        prefix = parent.sys_path + "/"
        return [d for d in self.of_subsystem(subsystem) if d.sys_path.startswith(prefix)]

    def node_exists(self, path: str) -> bool:
        """Whether a /dev path was seen when the snapshot was taken."""
        return path in self.dev_entries


def accelerator_from(device: SysDevice, reason: str = "", **fields: Any) -> Accelerator:
    """An Accelerator whose sysfs path, bus address, driver and CPU affinity come from ``device``,
    usable unless there is a ``reason``; ``fields`` gives the rest (identity, kind, bus, model...)."""
    fields.setdefault("bus_address", device.sys_name)
    return Accelerator(
        sys_path=device.sys_path,
        driver=device.driver,
        numa_node=device.numa_node,
        local_cpus=device.local_cpus,
        usable=not reason,
        reason=reason,
        **fields,
    )


def pci_accelerator(
    device: SysDevice,
    kind: str,
    vendor: str,
    model: str,
    nodes: tuple[str, ...],
    reason: str,
    details: Details,
) -> Accelerator:
    """The Accelerator of a PCI device: identity ``pci-<address>``, ids from its sysfs attributes."""
    return accelerator_from(
        device,
        identity=f"pci-{device.sys_name}",
        kind=kind,
        bus=Bus.PCI,
        vendor_id=device.attributes.get("vendor", "")[2:],
        product_id=device.attributes.get("device", "")[2:],
        vendor=vendor,
        model=model,
        device_nodes=nodes,
        reason=reason,
        details=details,
    )


def int_or_none(text: str | None) -> int | None:
    """A sysfs number, or None when absent, empty or not a number."""
    try:
        return int(text) if text not in (None, "") else None
    except ValueError:
        return None


def millidegrees(text: str | None) -> float | None:
    """A sysfs temperature in millidegrees as degrees Celsius (None when unknown)."""
    value = int_or_none(text)
    return value / 1000.0 if value is not None else None
