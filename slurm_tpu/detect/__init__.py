"""Detection: a udev/sysfs snapshot turned into an :class:`~slurm_tpu.hardware.Inventory`,
optionally enriched by NVML (nvidia-ml-py: memory, UUID, marketing name), which is never
required: without the package or the driver library the inventory stays as it is."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..cpulist import core_indices
from ..families import FAMILIES
from ..hardware import Accelerator, Inventory
from .snapshot import Snapshot, take_snapshot


def inventory_from_snapshot(snapshot: Snapshot) -> Inventory:
    """Classify a snapshot family by family, in registry order (pure, no I/O)."""
    found = tuple(accelerator for family in FAMILIES for accelerator in family.find(snapshot))
    return Inventory(found, online_cpus=snapshot.online_cpus, core_of_cpu=core_indices(snapshot.cpu_topology))


def detect_inventory(use_nvml: bool = True) -> Inventory:
    """Detect this node's accelerators through libudev (and NVML when present)."""
    inventory = inventory_from_snapshot(take_snapshot())
    return enrich_with_nvml(inventory) if use_nvml else inventory


def _nvml() -> Any | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - missing package, library or driver: all mean "no NVML"
        return None


def _nvml_sees(accelerator: Accelerator) -> bool:
    return accelerator.vendor == "NVIDIA" and accelerator.bus.value == "pci" and accelerator.usable


def _with_nvml(nvml: Any, accelerator: Accelerator) -> Accelerator:
    try:
        handle = nvml.nvmlDeviceGetHandleByPciBusId(accelerator.bus_address)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle).total
        name = nvml.nvmlDeviceGetName(handle)
        uuid = nvml.nvmlDeviceGetUUID(handle)
    except Exception:  # noqa: BLE001 - one GPU NVML cannot see keeps its sysfs facts
        return accelerator
    name = name.decode() if isinstance(name, bytes) else name
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    # An NVIDIA GPU's details are the GPU family's (NvidiaDetails), which Accelerator types as Details.
    details = dataclasses.replace(accelerator.details, memory_bytes=memory, uuid=uuid, nvml=True)  # type: ignore[call-arg]
    return dataclasses.replace(accelerator, model=name, details=details)


def enrich_with_nvml(inventory: Inventory) -> Inventory:
    """Add NVML facts to usable NVIDIA GPUs, when NVML can be initialised."""
    nvml = _nvml() if any(map(_nvml_sees, inventory)) else None
    if nvml is None:
        return inventory
    try:
        enriched = tuple(_with_nvml(nvml, a) if _nvml_sees(a) else a for a in inventory)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return dataclasses.replace(inventory, accelerators=enriched)


__all__ = ["detect_inventory", "enrich_with_nvml", "inventory_from_snapshot", "take_snapshot", "Snapshot"]
