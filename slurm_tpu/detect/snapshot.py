"""Take a snapshot of the udev/sysfs facts detection needs (detection's only pyudev use; the
watcher's udev monitor is the other): the few attributes the families read are copied into
plain :class:`SysDevice` records, so everything after the snapshot is pure."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..errors import DetectionError
from ..families import FAMILIES, subsystems
from ..families.base import Candidate
from ..families.sysfs import Snapshot, SysDevice

# subsystem -> the sysfs attributes some family reads from its devices.
_ATTRIBUTES = {s: tuple(dict.fromkeys(a for f in FAMILIES for a in f.attributes.get(s, ()))) for s in subsystems()}


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
        raise DetectionError("libudev (libudev.so.1) could not be found: install the libudev1 package") from exc
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


class _PyudevCandidate(Candidate):
    """A pyudev device as the families' ``wanted`` sees it (attributes read on demand)."""

    def __init__(self, device: Any):
        self._device = device
        self.subsystem = device.subsystem or ""
        self.devtype = device.device_type or ""

    def attribute(self, name: str) -> str:
        try:
            return _text(self._device.attributes.get(name))
        except OSError:
            return ""

    def properties(self) -> Mapping[str, str]:
        return {k: _text(v) for k, v in self._device.properties.items()}


def _wanted(device: Any) -> bool:
    candidate = _PyudevCandidate(device)
    return any(candidate.subsystem in f.attributes and f.wanted(candidate) for f in FAMILIES)


CPU_ROOT = "/sys/devices/system/cpu"


def _read(path: str) -> str:
    with open(path, encoding="ascii") as handle:
        return handle.read().strip()


def _online_cpus() -> str | None:
    try:
        return _read(f"{CPU_ROOT}/online") or None
    except OSError:
        return None


def _cpu_topology() -> dict[int, tuple[int, int]]:
    topology: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir(CPU_ROOT)
    except OSError:
        return topology
    for name in names:
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        try:
            package, core = (int(_read(f"{CPU_ROOT}/{name}/topology/{n}")) for n in ("physical_package_id", "core_id"))
        except (OSError, ValueError):
            continue  # offline CPUs have no topology
        topology[int(name[3:])] = (package, core)
    return topology


def take_snapshot() -> Snapshot:
    """Enumerate the udev devices some family wants into a :class:`Snapshot`."""
    context = _load_pyudev()
    devices: dict[str, SysDevice] = {}
    for subsystem in subsystems():
        try:
            for device in context.list_devices(subsystem=subsystem):
                if _wanted(device):
                    devices[device.sys_path] = _record(device)
        except OSError as exc:
            raise DetectionError(f"cannot enumerate {subsystem} devices through udev: {exc}") from exc
    return Snapshot(
        devices=devices,
        driver_info={bus: facts for family in FAMILIES for bus, facts in family.driver_info().items()},
        dev_entries=frozenset(node for family in FAMILIES for node in family.unannounced_nodes()),
        online_cpus=_online_cpus(),
        cpu_topology=_cpu_topology(),
    )
