"""The job environment contract between the task-prolog and the runner.

The task-prolog exports, for the Edge TPUs leased to the job on this node, in
allocation order:

``SLURM_TPU_DEVICES``
    Identities, comma-separated: ``usb-2-1.3,pci-0000:03:00.0``.
``SLURM_TPU_EDGETPU_PATHS``
    What libedgetpu's ``edgetpu_create_delegate(type, path, ...)`` takes for each,
    as ``type:path``: ``usb:/sys/bus/usb/devices/2-1.3,pci:/dev/apex_0``. The runner
    opens exactly these paths, never a ``usb:N`` index (indices shift whenever
    another stick re-enumerates).
``SLURM_TPU_GPUS``
    Identities of leased GPUs (only when ``devices.isolate_gpus`` is on). GPU jobs
    otherwise rely on Slurm's own ``CUDA_VISIBLE_DEVICES``.

Identities and paths never contain commas (see ``locks.slots.check_identity``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

DEVICES = "SLURM_TPU_DEVICES"
EDGETPU_PATHS = "SLURM_TPU_EDGETPU_PATHS"
GPUS = "SLURM_TPU_GPUS"


@dataclass(frozen=True)
class EdgeTpuHandle:
    """One allocated Edge TPU as libedgetpu addresses it."""

    identity: str
    device_type: str  # "usb" or "pci"
    path: str  # /sys/bus/usb/devices/<topology> or /dev/apex_N


def libedgetpu_path(identity: str, device_node: str | None) -> tuple[str, str]:
    """(type, path) libedgetpu expects for an identity (PCIe needs its /dev/apex_N)."""
    bus, _, address = identity.partition("-")
    if bus == "usb":
        return "usb", f"/sys/bus/usb/devices/{address}"
    if bus == "pci" and device_node:
        return "pci", device_node
    raise ValueError(f"{identity}: no libedgetpu path (PCIe Edge TPUs need their /dev/apex_N node)")


def format_environment(tpus: Sequence[EdgeTpuHandle], gpus: Sequence[str] = ()) -> dict[str, str]:
    """The variables to export for a task."""
    env = {
        DEVICES: ",".join(t.identity for t in tpus),
        EDGETPU_PATHS: ",".join(f"{t.device_type}:{t.path}" for t in tpus),
    }
    if gpus:
        env[GPUS] = ",".join(gpus)
    return env


def parse_environment(environ: Mapping[str, str]) -> list[EdgeTpuHandle]:
    """The job's Edge TPUs from its environment ([] when none were allocated).

    Raises ValueError with a one-line reason when the two variables disagree.
    """
    identities = [i for i in environ.get(DEVICES, "").split(",") if i]
    paths = [p for p in environ.get(EDGETPU_PATHS, "").split(",") if p]
    if len(identities) != len(paths):
        raise ValueError(f"{DEVICES} names {len(identities)} device(s) but {EDGETPU_PATHS} "
                         f"names {len(paths)}: the task-prolog output is inconsistent")
    handles = []
    for identity, entry in zip(identities, paths):
        device_type, sep, path = entry.partition(":")
        if not sep or device_type not in ("usb", "pci") or not path:
            raise ValueError(f"{EDGETPU_PATHS} entry '{entry}' is not usb:PATH or pci:PATH")
        handles.append(EdgeTpuHandle(identity, device_type, path))
    return handles
