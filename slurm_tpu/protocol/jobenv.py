"""The job environment contract between the root prolog (writer), the task-prolog and the runner.

The prolog writes ``<state_dir>/jobs/<job>.env`` (protocol/envfile.py); the task-prolog
prints it before every task. Every variable is named by a family (``JobVariable`` in
slurm_tpu/families/), in registry order, then :data:`USAGE_DIR` (the job's usage box,
protocol/usage.py; unset when there is none); docs/user-guide.md ("What the job sees")
says what each holds. Entries follow allocation order; identities and paths never contain
commas (``slurm_tpu.identity``). :data:`EDGETPU_PATHS` gives libedgetpu's ``type:path``
of each device, never a ``usb:N`` index (indices shift whenever another stick
re-enumerates); :data:`EDGETPU_VISIBLE` (the same paths, for the node's patched
libedgetpu) is never unset: unset means every device to the library.
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
# The job's devices as CDI names (``slurm-tpu.dev/edgetpu=usb-2-1.3,...``), for ``podman run --device``:
# the spec ``slurm-tpu cdi`` writes names each leased device so (slurm_tpu/render/cdi.py).
CDI_DEVICES = "SLURM_TPU_CDI_DEVICES"
CDI_VENDOR = "slurm-tpu.dev"


def cdi_kind(kind: str) -> str:
    """The CDI ``kind`` (``vendor/class``) of a family's devices: ``slurm-tpu.dev/edgetpu``."""
    return f"{CDI_VENDOR}/{kind}"


def cdi_name(kind: str, identity: str) -> str:
    """A device's fully qualified CDI name: ``slurm-tpu.dev/edgetpu=usb-2-1.3``."""
    return f"{cdi_kind(kind)}={identity}"


class EdgeTpuHandle(Record):
    """One allocated Edge TPU as libedgetpu addresses it."""

    __hash__ = Record.value_hash  # never changed once made

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
