"""Detection: a udev/sysfs snapshot turned into an :class:`~slurm_tpu.hardware.Inventory`."""

from __future__ import annotations

from ..cpulist import core_indices
from ..families import FAMILIES
from ..hardware import Inventory
from .snapshot import Snapshot, take_snapshot


def inventory_from_snapshot(snapshot: Snapshot) -> Inventory:
    """Classify a snapshot family by family, in registry order (pure, no I/O)."""
    found = tuple(accelerator for family in FAMILIES for accelerator in family.find(snapshot))
    return Inventory(found, online_cpus=snapshot.online_cpus, core_of_cpu=core_indices(snapshot.cpu_topology))


def detect_inventory(use_nvml: bool = True) -> Inventory:
    """Detect this node's accelerators through libudev (and NVML when present)."""
    inventory = inventory_from_snapshot(take_snapshot())
    if use_nvml:
        from .nvml import enrich_with_nvml

        inventory = enrich_with_nvml(inventory)
    return inventory


__all__ = ["detect_inventory", "inventory_from_snapshot", "take_snapshot", "Snapshot"]
