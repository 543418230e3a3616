"""Plain data: what an accelerator is, and a node's inventory of them (no I/O here)."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any, Callable


class Bus(str, enum.Enum):
    """How the accelerator is attached; part of its identity."""

    USB = "usb"
    PCI = "pci"
    PLATFORM = "platform"


@dataclass(frozen=True)
class Details:
    """Hardware facts that differ per accelerator family (typed subclasses live in
    ``slurm_tpu.families``), through which every family answers the same health questions."""

    @property
    def temperature_c(self) -> float | None:
        """The device's temperature in degrees Celsius, if it reports one."""
        return None

    @property
    def trip_points_c(self) -> tuple[float, ...]:
        """Thermal trip points in degrees Celsius, lowest first (() when unknown)."""
        return ()

    def notes(self) -> list[str]:
        """Short human notes for ``slurm-tpu detect`` (slow link, temperature, memory...)."""
        return []

    def to_json(self) -> dict[str, Any]:
        """The ``details`` object of ``slurm-tpu detect --json``."""
        return {}


@dataclass(frozen=True)
class Accelerator:
    """One accelerator on a node.

    ``identity`` is the one stable name used everywhere (slurm_tpu/identity.py): a USB
    device's topology path survives firmware-load re-enumeration; a devnum or a libedgetpu
    index would change under your feet.
    """

    identity: str
    kind: str  # the family's (``edgetpu``, ``gpu``, ``hailo``...; see slurm_tpu.families)
    bus: Bus
    bus_address: str
    vendor_id: str
    product_id: str
    vendor: str
    model: str
    sys_path: str
    device_nodes: tuple[str, ...] = ()
    usable: bool = True
    reason: str = ""
    driver: str = ""
    numa_node: int | None = None
    local_cpus: str | None = None
    details: Details = Details()  # USB speed, temperature, memory, UUID..., typed by the family

    @property
    def vendor_product(self) -> str:
        """``vvvv:pppp`` in lower-case hex, as lsusb/lspci print it."""
        return f"{self.vendor_id}:{self.product_id}"

    @property
    def primary_node(self) -> str | None:
        """The device node a runtime opens (first of ``device_nodes``)."""
        return self.device_nodes[0] if self.device_nodes else None

    @classmethod
    def from_json(cls, data: dict[str, Any], details: Callable[[dict[str, Any]], Details]) -> Accelerator:
        """Inverse of :meth:`to_json` (KeyError/ValueError on bad input); ``details`` builds the typed
        details from the whole item (``slurm_tpu.families.inventory_from_json`` chooses it by kind)."""
        values = {k: v for k, v in data.items() if k in _FIELDS}
        values["kind"] = str(values["kind"])
        values["bus"] = Bus(values["bus"])
        values["device_nodes"] = tuple(values.get("device_nodes") or ())
        values["details"] = details(data)
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (enums as their values)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["bus"] = self.bus.value
        data["device_nodes"] = list(self.device_nodes)
        data["details"] = self.details.to_json()
        data["vendor_product"] = self.vendor_product
        return data


@dataclass(frozen=True)
class Inventory:
    """All accelerators found on one node, in a deterministic order."""

    accelerators: tuple[Accelerator, ...] = ()
    # The node's online CPU list (sysfs cpu/online), to tell a device's local CPUs from "all of them".
    online_cpus: str | None = None
    # CPU id -> Slurm core index (SMT siblings share one); {} when topology is unknown.
    core_of_cpu: dict[int, int] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Accelerator]:
        return iter(self.accelerators)

    def __len__(self) -> int:
        return len(self.accelerators)

    def usable(self, kind: str | None = None) -> list[Accelerator]:
        """Usable accelerators, optionally of one kind."""
        return [a for a in self.accelerators if a.usable and (kind is None or a.kind == kind)]

    def by_identity(self, identity: str) -> Accelerator | None:
        """The accelerator with this identity, or None."""
        return next((a for a in self.accelerators if a.identity == identity), None)

    def to_json(self) -> dict[str, Any]:
        """The JSON document ``slurm-tpu detect --json`` prints."""
        return {
            "online_cpus": self.online_cpus,
            "core_of_cpu": {str(cpu): core for cpu, core in sorted(self.core_of_cpu.items())},
            "accelerators": [a.to_json() for a in self.accelerators],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], details: Callable[[dict[str, Any]], Details]) -> Inventory:
        """Inverse of :meth:`to_json` (raises KeyError/TypeError/ValueError on bad input);
        ``details`` as for :meth:`Accelerator.from_json`."""
        return cls(
            tuple(Accelerator.from_json(item, details) for item in data["accelerators"]),
            online_cpus=data.get("online_cpus"),
            core_of_cpu={int(cpu): int(core) for cpu, core in (data.get("core_of_cpu") or {}).items()},
        )


_FIELDS = frozenset(f.name for f in fields(Accelerator))
_SLUG_UNSAFE = re.compile(r"[^a-z0-9]+")


def slug(text: str) -> str:
    """Lower-case ``text`` with runs of other characters folded to ``_`` (for GRES types and node
    features, which Slurm splits on ``,:=`` and spaces)."""
    return _SLUG_UNSAFE.sub("_", text.lower()).strip("_")
