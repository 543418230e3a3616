"""Recognise GPUs: NVIDIA discrete, AMD and Intel (DRM render nodes), Jetson/Tegra."""

from __future__ import annotations

from ..model import Accelerator, Bus, Kind
from .snapshot import TEGRA_GPU_COMPATIBLE, Snapshot, SysDevice, accelerator_from

NVIDIA, AMD, INTEL = "0x10de", "0x1002", "0x8086"
_VENDOR_NAMES = {NVIDIA: "NVIDIA", AMD: "AMD", INTEL: "Intel"}


def _is_display(device: SysDevice) -> bool:
    # PCI class 0x03xxxx: VGA, XGA or 3D controller.
    return device.attributes.get("class", "").lower().startswith("0x03")


def hwdb_model(name: str) -> str:
    """The marketing name in a PCI database name: ``Navi 21 [Radeon RX 6800/6800 XT]`` -> ``Radeon RX 6800``.

    hwdb names put the chip codename first and the product in brackets, with
    variants split by ``/``; the first variant makes a readable GRES type.
    """
    if "[" in name and "]" in name:
        inner = name[name.index("[") + 1:name.rindex("]")]
        return inner.split("/")[0].strip() or name
    return name


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _nvidia(devices: list[SysDevice], snapshot: Snapshot) -> list[Accelerator]:
    # Without the driver's procfs, minors follow probe order, which is PCI order.
    bound = [d for d in devices if d.driver == "nvidia"]
    found = []
    for device in devices:
        proc = snapshot.nvidia_proc.get(device.sys_name.lower(), {})
        model = proc.get("Model") or hwdb_model(device.properties.get("ID_MODEL_FROM_DATABASE", "")) \
            or f"NVIDIA GPU {device.attributes.get('device', '?')}"
        details: dict[str, object] = {"uuid": proc.get("GPU UUID") or None}
        nodes: tuple[str, ...] = ()
        usable, reason = True, ""
        if device.driver != "nvidia":
            usable = False
            reason = (f"GPU {device.sys_name} is bound to {device.driver}, not the NVIDIA driver"
                      if device.driver else f"GPU {device.sys_name} has no driver bound: load the nvidia module")
        else:
            minor = _int(proc.get("Device Minor"))
            details["minor_source"] = "procfs" if minor is not None else "pci-order"
            if minor is None:
                minor = bound.index(device)
            details["minor"] = minor
            node = f"/dev/nvidia{minor}"
            nodes = (node,)
            if not snapshot.node_exists(node):
                usable = False
                reason = f"device node {node} is missing: run nvidia-modprobe -c {minor} or load the driver"
        found.append(_gpu(device, "NVIDIA", model, nodes, usable, reason, details))
    return sorted(found, key=lambda a: (a.details.get("minor", 1 << 16), a.bus_address))


def _drm_gpu(device: SysDevice, snapshot: Snapshot) -> Accelerator:
    vendor = _VENDOR_NAMES[device.attributes["vendor"]]
    drm = snapshot.children(device, "drm")
    render = [d.device_node for d in drm if d.sys_name.startswith("renderD") and d.device_node]
    cards = [d.device_node for d in drm if d.sys_name.startswith("card") and d.device_node
             and "-" not in d.sys_name]  # card0-DP-1 and such are connectors
    model = device.attributes.get("product_name") \
        or hwdb_model(device.properties.get("ID_MODEL_FROM_DATABASE", "")) \
        or f"{vendor} GPU {device.attributes.get('device', '?')}"
    vram = _int(device.attributes.get("mem_info_vram_total"))
    details = {"memory_bytes": vram, "unique_id": device.attributes.get("unique_id") or None}
    usable, reason = True, ""
    if not device.driver:
        usable, reason = False, f"GPU {device.sys_name} has no driver bound"
    elif not render:
        usable, reason = False, f"GPU {device.sys_name} ({device.driver}) has no DRM render node"
    return _gpu(device, vendor, model, tuple(render + cards), usable, reason, details)


def _gpu(device: SysDevice, vendor: str, model: str, nodes: tuple[str, ...], usable: bool,
         reason: str, details: dict[str, object]) -> Accelerator:
    return accelerator_from(
        device,
        identity=f"pci-{device.sys_name}",
        kind=Kind.GPU,
        bus=Bus.PCI,
        vendor_id=device.attributes.get("vendor", "")[2:],
        product_id=device.attributes.get("device", "")[2:],
        vendor=vendor,
        model=model,
        device_nodes=nodes,
        usable=usable,
        reason=reason,
        details=details,
    )


def _tegra(device: SysDevice, snapshot: Snapshot) -> Accelerator:
    compatible = next(v for k, v in sorted(device.properties.items())
                      if k.startswith("OF_COMPATIBLE_") and v in TEGRA_GPU_COMPATIBLE)
    chip = compatible.split(",", 1)[1]
    drm = snapshot.children(device, "drm")
    nodes = [d.device_node for d in drm if d.sys_name.startswith("renderD") and d.device_node]
    nodes += sorted(p for p in ("/dev/nvhost-gpu", "/dev/nvgpu/igpu0/ctrl") if snapshot.node_exists(p))
    usable, reason = bool(nodes), ""
    if not device.driver:
        usable, reason = False, f"integrated GPU {device.sys_name} has no driver bound (nvgpu)"
    elif not nodes:
        reason = f"integrated GPU {device.sys_name} has no device node (/dev/nvhost-gpu or a render node)"
    return accelerator_from(
        device,
        identity=f"platform-{device.sys_name}",
        kind=Kind.GPU,
        bus=Bus.PLATFORM,
        vendor_id="10de",
        product_id="",
        vendor="NVIDIA",
        model=f"Tegra {chip}",
        device_nodes=tuple(nodes),
        usable=usable,
        reason=reason,
        details={"compatible": compatible, "integrated": True},
    )


def find_gpus(snapshot: Snapshot) -> list[Accelerator]:
    """All GPUs: NVIDIA by minor, then AMD/Intel and Tegra by address."""
    displays = [d for d in snapshot.of_subsystem("pci") if _is_display(d)]
    found = _nvidia([d for d in displays if d.attributes.get("vendor") == NVIDIA], snapshot)
    found += [_drm_gpu(d, snapshot) for d in displays if d.attributes.get("vendor") in (AMD, INTEL)]
    found += [_tegra(d, snapshot) for d in snapshot.of_subsystem("platform")]
    return found
