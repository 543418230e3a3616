"""Plain data: what an accelerator is, and a node's inventory of them.

Nothing here performs I/O; detection builds these, renderers and hooks read them.
"""

from __future__ import annotations

import enum
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator


class Kind(str, enum.Enum):
    """What sort of accelerator a device is."""

    EDGETPU = "edgetpu"
    GPU = "gpu"


class Bus(str, enum.Enum):
    """How the accelerator is attached; part of its identity."""

    USB = "usb"
    PCI = "pci"
    PLATFORM = "platform"


@dataclass(frozen=True)
class Accelerator:
    """One accelerator on a node.

    ``identity`` is the one stable name used everywhere (ledger keys, slot nodes,
    environment variables, logs): ``usb-<topology path>`` for USB devices, which
    survives firmware-load re-enumeration, ``pci-<domain:bus:dev.fn>`` for PCIe
    devices and ``platform-<name>`` for SoC GPUs. Never a devnum or a libedgetpu
    index: those change under your feet.
    """

    identity: str
    kind: Kind
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
    # Hardware facts that differ per device family (USB speed, temperature,
    # unique_id, memory, UUID...). Values are plain JSON types.
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def vendor_product(self) -> str:
        """``vvvv:pppp`` in lower-case hex, as lsusb/lspci print it."""
        return f"{self.vendor_id}:{self.product_id}"

    @property
    def primary_node(self) -> str | None:
        """The device node a runtime opens (first of ``device_nodes``)."""
        return self.device_nodes[0] if self.device_nodes else None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Accelerator":
        """Inverse of :meth:`to_json` (raises KeyError/ValueError on bad input)."""
        fields = {k: v for k, v in data.items() if k != "vendor_product"}
        fields["kind"] = Kind(fields["kind"])
        fields["bus"] = Bus(fields["bus"])
        fields["device_nodes"] = tuple(fields.get("device_nodes") or ())
        fields["details"] = dict(fields.get("details") or {})
        return cls(**fields)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (enums as their values)."""
        data = asdict(self)
        data["kind"] = self.kind.value
        data["bus"] = self.bus.value
        data["device_nodes"] = list(self.device_nodes)
        data["vendor_product"] = self.vendor_product
        return data


@dataclass(frozen=True)
class Inventory:
    """All accelerators found on one node, in a deterministic order."""

    accelerators: tuple[Accelerator, ...] = ()
    # The node's online CPU list (sysfs cpu/online), to tell a device's local CPUs
    # apart from "all of them".
    online_cpus: str | None = None
    # CPU id -> Slurm core index (SMT siblings share one); {} when topology is unknown.
    core_of_cpu: dict[int, int] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Accelerator]:
        return iter(self.accelerators)

    def __len__(self) -> int:
        return len(self.accelerators)

    def usable(self, kind: Kind | None = None) -> list[Accelerator]:
        """Usable accelerators, optionally of one kind."""
        return [a for a in self.accelerators if a.usable and (kind is None or a.kind == kind)]

    def by_identity(self, identity: str) -> Accelerator | None:
        """The accelerator with this identity, or None."""
        for accelerator in self.accelerators:
            if accelerator.identity == identity:
                return accelerator
        return None

    def to_json(self) -> dict[str, Any]:
        """The JSON document ``slurm-tpu detect --json`` prints."""
        return {"online_cpus": self.online_cpus,
                "core_of_cpu": {str(cpu): core for cpu, core in sorted(self.core_of_cpu.items())},
                "accelerators": [a.to_json() for a in self.accelerators]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Inventory":
        """Inverse of :meth:`to_json` (raises KeyError/TypeError/ValueError on bad input)."""
        return cls(tuple(Accelerator.from_json(item) for item in data["accelerators"]),
                   online_cpus=data.get("online_cpus"),
                   core_of_cpu={int(cpu): int(core) for cpu, core in (data.get("core_of_cpu") or {}).items()})


_SLUG_UNSAFE = re.compile(r"[^a-z0-9]+")


def slug(text: str) -> str:
    """Lower-case ``text`` with runs of other characters folded to ``_``.

    Used for GRES types and node features, which Slurm splits on ``,:=`` and spaces.
    """
    return _SLUG_UNSAFE.sub("_", text.lower()).strip("_")
