"""GPUs: NVIDIA discrete, AMD and Intel (DRM render nodes), Jetson/Tegra integrated.

Not leased unless the site says so (``families.gpu.isolate``: clusters without cgroup
device constraints); gres.conf names the nodes their drivers create and keep.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..hardware import Accelerator, Bus, Details, slug
from ..protocol import jobenv
from .base import Candidate, Family, FamilyConfig, JobVariable, UdevRule
from .sysfs import Snapshot, SysDevice, accelerator_from, int_or_none, pci_accelerator

KIND = "gpu"
NVIDIA, AMD, INTEL = "0x10de", "0x1002", "0x8086"
_VENDOR_NAMES = {NVIDIA: "NVIDIA", AMD: "AMD", INTEL: "Intel"}
TEGRA_NODES = ("/dev/nvhost-gpu", "/dev/nvgpu/igpu0/ctrl")  # Jetson's (nvgpu), made without a udev device
NVIDIA_PROC = "/proc/driver/nvidia/gpus"  # the driver's per-GPU facts (Model, GPU UUID, Device Minor) by bus id
# Jetson/Tegra integrated GPUs, by device-tree compatible string.
TEGRA_GPU_COMPATIBLE = ("nvidia,gm20b", "nvidia,gp10b", "nvidia,gv11b", "nvidia,ga10b", "nvidia,gb10b")


@dataclass(frozen=True)
class NvidiaDetails(Details):
    """A discrete NVIDIA GPU: UUID, its /dev/nvidiaN minor and where that came from, NVML facts."""

    uuid: str | None = None
    minor: int | None = None
    minor_source: str | None = None  # "procfs" or "pci-order"; None while no driver is bound
    memory_bytes: int | None = None
    nvml: bool = False

    def notes(self) -> list[str]:
        return [f"{self.memory_bytes / 2**30:.0f} GiB"] if self.memory_bytes else []

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"uuid": self.uuid}
        if self.minor is not None:
            data.update(minor_source=self.minor_source, minor=self.minor)
        if self.nvml:
            data.update(memory_bytes=self.memory_bytes, nvml=True)
        return data


@dataclass(frozen=True)
class DrmDetails(Details):
    """An AMD or Intel GPU: VRAM size and unique id where the driver reports them."""

    memory_bytes: int | None = None
    unique_id: str | None = None

    def notes(self) -> list[str]:
        return [f"{self.memory_bytes / 2**30:.0f} GiB"] if self.memory_bytes else []


@dataclass(frozen=True)
class TegraDetails(Details):
    """A Jetson's integrated GPU, by its device-tree compatible string."""

    compatible: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "integrated": True}


def _is_display(device: SysDevice) -> bool:  # PCI class 0x03xxxx: VGA, XGA or 3D controller
    return device.attributes.get("class", "").lower().startswith("0x03")


def _model(device: SysDevice, vendor: str, known: str | None) -> str:
    """The marketing name: ``known`` (the driver's), else the PCI database's (``Navi 21 [Radeon RX
    6800/6800 XT]`` gives ``Radeon RX 6800``), else ``<vendor> GPU <id>``."""
    name = device.properties.get("ID_MODEL_FROM_DATABASE", "")
    if "[" in name and "]" in name:
        name = name[name.index("[") + 1 : name.rindex("]")].split("/")[0].strip() or name
    return known or name or f"{vendor} GPU {device.attributes.get('device', '?')}"


def nvml_bus_id(address: str) -> str:
    """NVML's form of a PCI address (``nvmlDeviceGetHandleByPciBusId``'s, its 8-digit domain):
    ``0000:41:00.0`` -> ``00000000:41:00.0``."""
    domain, _, rest = address.lower().partition(":")
    try:
        return f"{int(domain, 16):08x}:{rest}" if rest.count(":") == 1 else address.lower()
    except ValueError:
        return address.lower()


def model_slug(model: str) -> str:
    """A GRES type from a marketing name: ``NVIDIA A100-SXM4-80GB`` -> ``a100_sxm4_80gb``."""
    return slug(model).removeprefix("nvidia_")  # never all of it: slug() strips a trailing '_'


def _nvidia(devices: list[SysDevice], snapshot: Snapshot) -> list[Accelerator]:
    bound = [d for d in devices if d.driver == "nvidia"]
    found = []
    for device in devices:
        proc = snapshot.driver_info.get(device.sys_name.lower(), {})
        model = _model(device, "NVIDIA", proc.get("Model"))
        uuid = proc.get("GPU UUID") or None
        details = NvidiaDetails(uuid=uuid)
        nodes: tuple[str, ...] = ()
        reason = ""
        if device.driver != "nvidia":
            reason = (
                f"GPU {device.sys_name} is bound to {device.driver}, not the NVIDIA driver"
                if device.driver
                else f"GPU {device.sys_name} has no driver bound: load the nvidia module"
            )
        else:
            minor, source = int_or_none(proc.get("Device Minor")), "procfs"
            if minor is None:  # without the driver's procfs, minors follow probe order, which is PCI order
                minor, source = bound.index(device), "pci-order"
            details = NvidiaDetails(uuid=uuid, minor=minor, minor_source=source)
            node = f"/dev/nvidia{minor}"
            nodes = (node,)
            if node not in snapshot.dev_entries:
                reason = f"device node {node} is missing: run nvidia-modprobe -c {minor} or load the driver"
        found.append(pci_accelerator(device, KIND, "NVIDIA", model, nodes, reason, details))

    def minor_order(a: Accelerator) -> tuple[int, str]:
        minor = getattr(a.details, "minor", None)
        return (1 << 16 if minor is None else minor, a.bus_address)

    return sorted(found, key=minor_order)


def _drm_gpu(device: SysDevice, snapshot: Snapshot) -> Accelerator:
    vendor = _VENDOR_NAMES[device.attributes["vendor"]]
    drm = snapshot.children(device, "drm")
    render = [d.device_node for d in drm if d.sys_name.startswith("renderD") and d.device_node]
    cards = [
        d.device_node for d in drm if d.sys_name.startswith("card") and d.device_node and "-" not in d.sys_name
    ]  # card0-DP-1 and such are connectors
    model = _model(device, vendor, device.attributes.get("product_name"))
    details = DrmDetails(
        memory_bytes=int_or_none(device.attributes.get("mem_info_vram_total")),
        unique_id=device.attributes.get("unique_id") or None,
    )
    reason = ""
    if not device.driver:
        reason = f"GPU {device.sys_name} has no driver bound"
    elif not render:
        reason = f"GPU {device.sys_name} ({device.driver}) has no DRM render node"
    return pci_accelerator(device, KIND, vendor, model, tuple(render + cards), reason, details)


def _tegra(device: SysDevice, snapshot: Snapshot) -> Accelerator:
    compatible = next(
        v for k, v in sorted(device.properties.items()) if k.startswith("OF_COMPATIBLE_") and v in TEGRA_GPU_COMPATIBLE
    )
    chip = compatible.split(",", 1)[1]
    drm = snapshot.children(device, "drm")
    nodes = [d.device_node for d in drm if d.sys_name.startswith("renderD") and d.device_node]
    nodes += sorted(p for p in TEGRA_NODES if p in snapshot.dev_entries)
    reason = ""
    if not device.driver:
        reason = f"integrated GPU {device.sys_name} has no driver bound (nvgpu)"
    elif not nodes:
        reason = f"integrated GPU {device.sys_name} has no device node (/dev/nvhost-gpu or a render node)"
    return accelerator_from(
        device,
        identity=f"platform-{device.sys_name}",
        kind=KIND,
        bus=Bus.PLATFORM,
        vendor_id="10de",
        product_id="",
        vendor="NVIDIA",
        model=f"Tegra {chip}",
        device_nodes=tuple(nodes),
        reason=reason,
        details=TegraDetails(compatible),
    )


class GpuFamily(Family):
    """NVIDIA, AMD, Intel and Tegra GPUs."""

    kind = KIND
    title = "GPU"
    # (NUMA node and local CPUs: SysDevice.numa_node/local_cpus, read for every device.)
    attributes = {
        "pci": ("vendor", "device", "class", "mem_info_vram_total", "unique_id", "product_name"),
        "drm": (),
        "platform": (),
    }
    watched = ("pci", "drm")
    default_config = FamilyConfig("gpu", {}, ("gpu",), lease=False)
    slot = False  # gres.conf names the driver's own node (/dev/nvidiaN, a render node): it never moves
    cores = True
    udev_identities = (UdevRule("drm", "", "pci", 3),)
    variables = (JobVariable(jobenv.GPUS, lambda identity, node: identity),)
    runner = "gpu"
    # Slurm's own gres/shard (its name is fixed: gres_is_shared_name()), one File= line per shared GPU.
    shard_gres = "shard"
    shard_per_file = True
    extra_config_keys = {
        "types": (dict, "GPU model slug -> GRES type"),
        "isolate": (bool, "lease GPUs too (clusters without cgroup devices)"),
    }

    def wanted(self, device: Candidate) -> bool:
        if device.subsystem == "pci":
            return device.attribute("vendor") in _VENDOR_NAMES
        if device.subsystem == "platform":
            compatible = [v for k, v in device.properties().items() if k.startswith("OF_COMPATIBLE_")]
            return any(c.strip() in TEGRA_GPU_COMPATIBLE for c in compatible)
        return device.subsystem == "drm"

    def find(self, snapshot: Snapshot) -> list[Accelerator]:
        """NVIDIA by minor, then AMD/Intel and Tegra by address."""
        displays = [d for d in snapshot.of_subsystem("pci") if _is_display(d)]
        found = _nvidia([d for d in displays if d.attributes.get("vendor") == NVIDIA], snapshot)
        found += [_drm_gpu(d, snapshot) for d in displays if d.attributes.get("vendor") in (AMD, INTEL)]
        found += [_tegra(d, snapshot) for d in snapshot.of_subsystem("platform")]
        return found

    def unannounced_nodes(self) -> set[str]:
        """NVIDIA's /dev/nvidia* and Tegra's nvgpu nodes: the drivers make them without udev devices."""
        try:
            found = {"/dev/" + name for name in os.listdir("/dev") if name.startswith(("nvidia", "nvhost-gpu"))}
        except OSError:
            found = set()
        return found | {path for path in TEGRA_NODES if os.path.exists(path)}

    def driver_info(self, root: str = NVIDIA_PROC) -> dict[str, dict[str, str]]:
        """The NVIDIA driver's per-GPU ``information`` files (Model, GPU UUID, Device Minor), by bus id."""
        result: dict[str, dict[str, str]] = {}
        try:
            bus_ids = os.listdir(root)
        except OSError:
            return result
        for bus_id in bus_ids:
            try:
                with open(os.path.join(root, bus_id, "information"), encoding="utf-8") as handle:
                    text = handle.read()
            except OSError:
                continue
            pairs = (line.partition(":") for line in text.splitlines())
            result[bus_id.lower()] = {key.strip(): value.strip() for key, sep, value in pairs if sep}
        return result

    def details_from_json(self, item: Mapping[str, Any]) -> Details:
        data = item.get("details") or {}
        if item.get("bus") == "platform" or "compatible" in data:
            return TegraDetails.from_json(data)
        return (NvidiaDetails if item.get("vendor") == "NVIDIA" else DrmDetails).from_json(data)

    def parse_types(self, section: Mapping[str, Any], where: str) -> dict[str, str]:
        types = section.get("types", {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in types.items()):
            raise ConfigError(
                f"{where}: 'families.gpu.types' must map model names to type names", key="families.gpu.types"
            )
        return dict(types)

    def gres_type(self, config: FamilyConfig, accelerator: Accelerator) -> str:
        """The model's slug, or the type the config maps it to."""
        model = model_slug(accelerator.model)
        return config.types.get(model, model)

    def features(self, config: FamilyConfig, accelerators: list[Accelerator]) -> list[str]:
        """The configured features, then each GPU's vendor and type."""
        features = list(config.features)
        for accelerator in accelerators:
            features += [slug(accelerator.vendor), self.gres_type(config, accelerator)]
        return features

    def energy_source(self, config: FamilyConfig, accelerator: Accelerator, sysfs_root: str) -> str:
        """NVIDIA: NVML's energy counter by bus id (read-time fallbacks in energy/figures.py); AMD: its
        hwmon ``power1_average`` where the driver has one, else its ``power1_input``; Jetson and Intel: none."""
        from ..protocol.energy import HWMON_POWER, NO_SOURCE, NVML_ENERGY

        if isinstance(accelerator.details, TegraDetails):
            return f"{NO_SOURCE}:Jetson's GPU has no NVML power readings"
        if accelerator.vendor == "NVIDIA":
            return f"{NVML_ENERGY}:{nvml_bus_id(accelerator.bus_address)}"
        if accelerator.vendor == "AMD":
            hwmon = os.path.join(sysfs_root, "bus", "pci", "devices", accelerator.bus_address, "hwmon")
            try:
                names = sorted(n for n in os.listdir(hwmon) if n.startswith("hwmon"))
            except OSError:
                names = []
            # power1_average where the driver has it; newer amdgpu (RDNA3 and later) publishes only power1_input.
            for power in ("power1_average", "power1_input"):
                for name in names:
                    path = os.path.join(hwmon, name, power)
                    if os.path.isfile(path):
                        return f"{HWMON_POWER}:{path}"
            return f"{NO_SOURCE}:the amdgpu driver publishes no power1_average or power1_input for this GPU"
        return f"{NO_SOURCE}:no power reading for {accelerator.vendor} GPUs"

    def udev_rules(self, config: FamilyConfig, own: str, run: str) -> list[str]:
        if not config.lease:
            return []
        return [
            "# GPUs are leased too (families.gpu.isolate): AMD and Intel DRM render nodes.",
            "# NVIDIA's /dev/nvidiaN are made by the driver, not udev: set its NVreg_DeviceFileMode",
            "# (see README) so idle NVIDIA GPUs are root-only as well.",
            f'ACTION!="remove", SUBSYSTEM=="drm", KERNEL=="renderD*", ATTRS{{vendor}}=="{AMD}|{INTEL}", {own}, {run}',
        ]


FAMILY = GpuFamily()
