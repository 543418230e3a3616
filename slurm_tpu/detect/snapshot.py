"""Take a snapshot of the udev/sysfs facts detection needs.

Detection's only pyudev user (the watcher, ops/watch.py, imports pyudev too, for
its udev event monitor; nothing else does). It copies the few attributes the
classifiers read into plain :class:`SysDevice` records, so everything after the
snapshot is pure and testable on literal data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..errors import DetectionError
from ..model import Accelerator

# Vendors whose PCI devices we look at: Coral (Global Unichip), NVIDIA, AMD, Intel.
PCI_VENDORS = {"0x1ac1", "0x10de", "0x1002", "0x8086"}
# Coral USB ids, before and after firmware load.
USB_IDS = {("1a6e", "089a"), ("18d1", "9302")}
# Jetson/Tegra integrated GPUs, by device-tree compatible string.
TEGRA_GPU_COMPATIBLE = ("nvidia,gm20b", "nvidia,gp10b", "nvidia,gv11b", "nvidia,ga10b", "nvidia,gb10b")

_ATTRIBUTES = {
    "usb": ("idVendor", "idProduct", "speed", "busnum", "devnum", "manufacturer", "product"),
    "pci": ("vendor", "device", "class", "numa_node", "local_cpulist", "mem_info_vram_total",
            "unique_id", "product_name"),
    "apex": ("temp", "trip_point0_temp", "trip_point1_temp", "trip_point2_temp", "unique_id",
             "device_owner"),
    "platform": (),
    "drm": (),
}


@dataclass(frozen=True)
class SysDevice:
    """The facts about one udev device that the classifiers use."""

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
    nvidia_proc: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    dev_entries: frozenset[str] = frozenset()
    online_cpus: str | None = None
    # CPU id -> (physical package id, core id), from sysfs topology; {} if unreadable.
    cpu_topology: Mapping[int, tuple[int, int]] = field(default_factory=dict)

    def of_subsystem(self, subsystem: str) -> list[SysDevice]:
        """Devices of one subsystem, sorted by sysfs path."""
        return sorted((d for d in self.devices.values() if d.subsystem == subsystem),
                      key=lambda d: d.sys_path)

    def children(self, parent: SysDevice, subsystem: str) -> list[SysDevice]:
        """Devices of ``subsystem`` below ``parent`` in the sysfs tree."""
        prefix = parent.sys_path + "/"
        return [d for d in self.of_subsystem(subsystem) if d.sys_path.startswith(prefix)]

    def node_exists(self, path: str) -> bool:
        """Whether a /dev path was seen when the snapshot was taken."""
        return path in self.dev_entries


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).strip()


def _load_pyudev() -> Any:
    try:
        import pyudev

        return pyudev.Context()
    except ImportError as exc:
        if "pyudev" in str(exc) and "udev" not in str(exc).replace("pyudev", ""):
            raise DetectionError("the pyudev Python package is missing: pip install pyudev") from exc
        raise DetectionError(
            "libudev (libudev.so.1) could not be found: install the libudev1 package"
        ) from exc
    except OSError as exc:
        raise DetectionError(
            f"libudev (libudev.so.1) could not be loaded ({exc}): reinstall the libudev1 package"
        ) from exc


def _affinity(device: Any) -> tuple[int | None, str | None]:
    """NUMA node and local CPU list of the nearest PCI ancestor (or itself)."""
    node = device
    while node is not None:
        if node.subsystem == "pci":
            available = set(node.attributes.available_attributes)
            numa = _text(node.attributes.get("numa_node")) if "numa_node" in available else ""
            cpus = _text(node.attributes.get("local_cpulist")) if "local_cpulist" in available else ""
            numa_node = int(numa) if numa.lstrip("-").isdigit() and int(numa) >= 0 else None
            return numa_node, cpus or None
        node = node.parent
    return None, None


def _record(device: Any) -> SysDevice:
    available = set(device.attributes.available_attributes)  # a generator in pyudev
    attributes = {}
    for name in _ATTRIBUTES.get(device.subsystem, ()):
        if name in available:
            try:
                attributes[name] = _text(device.attributes.get(name))
            except OSError:
                continue  # unreadable attribute (permissions, driver hiccup): leave it out
    numa_node, local_cpus = _affinity(device)
    return SysDevice(
        sys_path=device.sys_path,
        sys_name=device.sys_name,
        subsystem=device.subsystem or "",
        devtype=device.device_type or "",
        driver=device.driver or "",
        device_node=device.device_node or "",
        properties={k: _text(v) for k, v in device.properties.items()},
        attributes=attributes,
        numa_node=numa_node,
        local_cpus=local_cpus,
    )


def _wanted(device: Any) -> bool:
    subsystem = device.subsystem
    if subsystem == "usb":
        if device.device_type != "usb_device":
            return False
        attrs = device.attributes
        return (_text(attrs.get("idVendor")), _text(attrs.get("idProduct"))) in USB_IDS
    if subsystem == "pci":
        return _text(device.attributes.get("vendor")) in PCI_VENDORS
    if subsystem == "platform":
        compatible = [v for k, v in device.properties.items() if k.startswith("OF_COMPATIBLE_")]
        return any(_text(c) in TEGRA_GPU_COMPATIBLE for c in compatible)
    return subsystem in ("apex", "drm")


def _read_nvidia_proc(root: str = "/proc/driver/nvidia/gpus") -> dict[str, dict[str, str]]:
    """Parse the NVIDIA driver's per-GPU ``information`` files, keyed by bus id."""
    result: dict[str, dict[str, str]] = {}
    try:
        bus_ids = os.listdir(root)
    except OSError:
        return result
    for bus_id in bus_ids:
        try:
            with open(os.path.join(root, bus_id, "information"), encoding="utf-8") as handle:
                text = handle.read()
        except OSError:
            continue
        fields = {}
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        result[bus_id.lower()] = fields
    return result


def _dev_entries() -> frozenset[str]:
    """The GPU device nodes directly under /dev that no udev device announces."""
    found = set()
    try:
        for name in os.listdir("/dev"):
            if name.startswith(("nvidia", "nvhost-gpu")):
                found.add("/dev/" + name)
    except OSError:
        pass
    if os.path.exists("/dev/nvgpu/igpu0/ctrl"):
        found.add("/dev/nvgpu/igpu0/ctrl")
    return frozenset(found)


def _online_cpus() -> str | None:
    try:
        with open("/sys/devices/system/cpu/online", encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def _cpu_topology() -> dict[int, tuple[int, int]]:
    topology: dict[int, tuple[int, int]] = {}
    root = "/sys/devices/system/cpu"
    try:
        names = os.listdir(root)
    except OSError:
        return topology
    for name in names:
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        try:
            with open(f"{root}/{name}/topology/physical_package_id", encoding="ascii") as handle:
                package = int(handle.read())
            with open(f"{root}/{name}/topology/core_id", encoding="ascii") as handle:
                core = int(handle.read())
        except (OSError, ValueError):
            continue  # offline CPUs have no topology
        topology[int(name[3:])] = (package, core)
    return topology


def take_snapshot(subsystems: Iterable[str] = ("usb", "pci", "apex", "drm", "platform")) -> Snapshot:
    """Enumerate udev devices of interest into a :class:`Snapshot`."""
    context = _load_pyudev()
    devices: dict[str, SysDevice] = {}
    for subsystem in subsystems:
        try:
            for device in context.list_devices(subsystem=subsystem):
                if _wanted(device):
                    devices[device.sys_path] = _record(device)
        except OSError as exc:
            raise DetectionError(f"cannot enumerate {subsystem} devices through udev: {exc}") from exc
    return Snapshot(devices=devices, nvidia_proc=_read_nvidia_proc(), dev_entries=_dev_entries(),
                    online_cpus=_online_cpus(), cpu_topology=_cpu_topology())


def accelerator_from(device: SysDevice, **fields: Any) -> Accelerator:
    """An Accelerator whose sysfs path, bus address, driver and CPU affinity come
    from ``device``; ``fields`` gives the rest (identity, kind, bus, model...)."""
    fields.setdefault("bus_address", device.sys_name)
    return Accelerator(sys_path=device.sys_path, driver=device.driver, numa_node=device.numa_node,
                       local_cpus=device.local_cpus, **fields)
