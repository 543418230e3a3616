"""Which device(s) this process should run on: pure resolution from flags and environment.

Sources, first match wins:
1. ``--device`` values: an identity (``usb-2-1.3``), ``usb:PATH``, ``pci:PATH``, ``cpu`` or ``gpu``;
2. the task-prolog's ``SLURM_TPU_BROKER`` (a job holding TPU shares: the node's broker runs its
   models, :mod:`.broker_client`);
3. the task-prolog's ``SLURM_TPU_DEVICES`` / ``SLURM_TPU_EDGETPU_PATHS`` (see jobenv);
4. Slurm's ``CUDA_VISIBLE_DEVICES`` (a GPU job);
5. the CPU, unless the job was given only devices of a family no TFLite backend
   can use (its variables are set): then one line says what runs them instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..protocol.broker_wire import ENDPOINT_ENV
from ..protocol.jobenv import DEVICES, EdgeTpuHandle, libedgetpu_path, parse_environment
from .errors import UsageError

CPU, GPU, EDGETPU = "cpu", "gpu", "edgetpu"
BROKER = "broker"  # the job's TPU shares, through the node's broker (its endpoint is the device's path)


@dataclass(frozen=True)
class Device:
    """One device to open: its kind, stable identity, and for Edge TPUs libedgetpu's (type, path)."""

    kind: str
    identity: str
    edgetpu_type: str | None = None
    path: str | None = None

    @property
    def label(self) -> str:
        if self.kind == BROKER:
            return "edgetpu shard"
        return self.identity if self.kind != EDGETPU else f"edgetpu {self.identity}"

    @classmethod
    def from_handle(cls, handle: EdgeTpuHandle) -> Device:
        return cls(EDGETPU, handle.identity, handle.device_type, handle.path)


def _identity_for_path(device_type: str, path: str, handles: Iterable[EdgeTpuHandle]) -> str:
    for h in handles:
        if (h.device_type, h.path) == (device_type, path):
            return h.identity
    if device_type == "usb" and path.startswith("/sys/bus/usb/devices/"):
        return "usb-" + path.rsplit("/", 1)[-1]
    return f"{device_type}:{path}"


def _parse_one(value: str, handles: list[EdgeTpuHandle]) -> Device:
    value = value.strip()
    if value in (CPU, GPU):
        return Device(value, value)
    kind, sep, rest = value.partition(":")
    if sep and kind in ("usb", "pci"):
        if not rest.startswith("/"):
            raise UsageError(
                f"--device {value}: give an absolute path (usb:/sys/bus/usb/devices/2-1.3 "
                "or pci:/dev/apex_0), not an index: indices shift between processes"
            )
        return Device(EDGETPU, _identity_for_path(kind, rest, handles), kind, rest)
    for h in handles:
        if h.identity == value:
            return Device.from_handle(h)
    try:
        device_type, path = libedgetpu_path(value, None)
    except ValueError:
        raise UsageError(
            f"--device {value}: not cpu, gpu, usb:PATH, pci:PATH or an Edge TPU identity "
            f"this job was given ({DEVICES} names: {', '.join(h.identity for h in handles) or 'none'})"
        ) from None
    return Device(EDGETPU, value, device_type, path)


def resolve_devices(requested: Iterable[str] | None, environ: Mapping[str, str]) -> list[Device]:
    """The devices to open, in order (the allocation order for Edge TPUs)."""
    try:
        handles = parse_environment(environ)
    except ValueError as exc:
        raise UsageError(f"{exc}; or override with --device") from None
    values = [v for item in (requested or ()) for v in item.split(",") if v.strip()]
    if values:
        devices = [_parse_one(v, handles) for v in values]
        identities = [d.identity for d in devices]
        for identity in identities:
            if identities.count(identity) > 1:
                raise UsageError(f"--device names {identity} twice: a device can be opened once")
        kinds = {d.kind for d in devices}
        if len(kinds) > 1 and kinds != {EDGETPU}:
            raise UsageError(
                "--device mixes kinds (" + ", ".join(sorted(kinds)) + "): run one kind of device per invocation"
            )
        return devices
    endpoint = environ.get(ENDPOINT_ENV, "").strip()
    if endpoint:
        return [Device(BROKER, BROKER, None, endpoint)]
    if handles:
        return [Device.from_handle(h) for h in handles]
    visible = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    # Slurm sets "NoDevFiles" or an empty string when a GPU GRES has no device files.
    if any(visible.split(",")) and visible not in ("-1", "NoDevFiles"):
        return [Device(GPU, GPU)]
    from ..families import FAMILIES

    for family in FAMILIES:
        refusal = family.runner_refusal(environ)
        if refusal:
            raise UsageError(refusal)
    return [Device(CPU, CPU)]
