"""The job environment contract between the root prolog (writer), the task-prolog and the runner.

The prolog writes ``<state_dir>/jobs/<job>.env`` (protocol/envfile.py); the task-prolog
prints it before every task. Every variable is named by a family (``JobVariable`` in
slurm_tpu/families/), in registry order, then :data:`USAGE_DIR`. For the devices leased
to the job on this node, in allocation order:

``SLURM_TPU_DEVICES`` (Edge TPUs)
    Identities, comma-separated: ``usb-2-1.3,pci-0000:03:00.0``.
``SLURM_TPU_EDGETPU_PATHS`` (Edge TPUs)
    libedgetpu's ``edgetpu_create_delegate(type, path, ...)`` for each, as ``type:path``
    (``usb:/sys/bus/usb/devices/2-1.3,pci:/dev/apex_0``), never a ``usb:N`` index (indices
    shift whenever another stick re-enumerates). Both exported (empty) without an Edge TPU.
``EDGETPU_VISIBLE_DEVICES`` (Edge TPUs)
    The same paths without the type: the node's libedgetpu (scripts/libedgetpu-visible-devices.patch)
    then opens only these, so unmodified Coral code uses the job's own Edge TPUs. Unset means
    every device to the library, so it is never unset (empty without an Edge TPU here).
``SLURM_TPU_GPUS`` (GPUs)
    Identities of leased GPUs (only with ``families.gpu.isolate``); unset otherwise.
Further families declare their own (``SLURM_TPU_<FAMILY>_...``) in their module.
``SLURM_TPU_USAGE_DIR``
    The job's usage box (protocol/usage.py); unset when there is none.

Identities and paths never contain commas (see ``slurm_tpu.identity``).
"""

from __future__ import annotations

from . import Record

TYPE_CHECKING = False  # annotations only: importing typing costs the hooks milliseconds per job
if TYPE_CHECKING:
    from collections.abc import Mapping

DEVICES = "SLURM_TPU_DEVICES"
EDGETPU_PATHS = "SLURM_TPU_EDGETPU_PATHS"
EDGETPU_VISIBLE = "EDGETPU_VISIBLE_DEVICES"
GPUS = "SLURM_TPU_GPUS"
USAGE_DIR = "SLURM_TPU_USAGE_DIR"


class EdgeTpuHandle(Record):
    """One allocated Edge TPU as libedgetpu addresses it."""

    __slots__ = ("identity", "device_type", "path")

    def __init__(self, identity: str, device_type: str, path: str):
        self.identity, self.device_type, self.path = identity, device_type, path  # device_type: "usb" or "pci"


def libedgetpu_path(identity: str, device_node: str | None) -> tuple[str, str]:
    """(type, path) libedgetpu expects for an identity (PCIe needs its /dev/apex_N)."""
    bus, _, address = identity.partition("-")
    if bus == "usb":
        return "usb", f"/sys/bus/usb/devices/{address}"
    if bus == "pci" and device_node:
        return "pci", device_node
    raise ValueError(f"{identity}: no libedgetpu path (PCIe Edge TPUs need their /dev/apex_N node)")


def parse_environment(environ: Mapping[str, str]) -> list[EdgeTpuHandle]:
    """The job's Edge TPUs from its environment ([] when none); ValueError when the two variables disagree."""
    identities = [i for i in environ.get(DEVICES, "").split(",") if i]
    paths = [p for p in environ.get(EDGETPU_PATHS, "").split(",") if p]
    if len(identities) != len(paths):
        raise ValueError(
            f"{DEVICES} names {len(identities)} device(s) but {EDGETPU_PATHS} "
            f"names {len(paths)}: the task-prolog output is inconsistent"
        )
    handles = []
    for identity, entry in zip(identities, paths):
        device_type, sep, path = entry.partition(":")
        if not sep or device_type not in ("usb", "pci") or not path:
            raise ValueError(f"{EDGETPU_PATHS} entry '{entry}' is not usb:PATH or pci:PATH")
        handles.append(EdgeTpuHandle(identity, device_type, path))
    return handles
