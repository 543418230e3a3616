"""Which GPU LiteRT's GPU accelerator opens: the job's own, as docs/user-guide.md explains.

Dawn (WebGPU over Vulkan) takes the first adapter the Vulkan loader lists; Mesa's
device-select layer, an implicit layer wrapping ``vkEnumeratePhysicalDevices`` for every
driver, lists the ``DRI_PRIME`` PCI address alone (matched through ``VK_EXT_pci_bus_info``).
Slurm's numeric indices name no PCI address reliably (their meaning changes with
``ConstrainDevices`` and ``CUDA_DEVICE_ORDER``). Checked against Debian bookworm's
mesa-vulkan-drivers 22.3.6.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Callable

from ..protocol import jobenv

DRI_PRIME = "DRI_PRIME"
FORCE_DEFAULT = "MESA_VK_DEVICE_SELECT_FORCE_DEFAULT_DEVICE"
MESA_SELECT = "MESA_VK_DEVICE_SELECT"
LAYER_OFF = "NODEVICE_SELECT"  # the layer manifest's disable_environment
LAYER_NAME = "VK_LAYER_MESA_device_select"
# Where the Vulkan loader looks for implicit layers (its default search path on Linux).
LAYER_DIRS = (
    "/etc/vulkan/implicit_layer.d",
    "/usr/local/share/vulkan/implicit_layer.d",
    "/usr/share/vulkan/implicit_layer.d",
)


@dataclass(frozen=True)
class GpuChoice:
    """The GPU the runner asks Vulkan for, the variables that ask for it, and one line saying how.

    ``uncertain``: the job's GPU is known but nothing makes Vulkan list it first
    while this process can open other GPUs too (worth a warning).
    """

    pci_address: str | None
    environment: Mapping[str, str] = field(default_factory=dict)
    how: str = ""
    uncertain: bool = False


def openable_gpu_nodes(dev: str = "/dev") -> list[str]:
    """The GPU device nodes this process may open (NVIDIA's /dev/nvidiaN, DRM render nodes)."""
    found = []
    for directory, prefix in ((dev, "nvidia"), (os.path.join(dev, "dri"), "renderD")):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in sorted(names):
            if name.startswith(prefix) and name[len(prefix) :].isdigit():
                path = os.path.join(directory, name)
                if os.access(path, os.R_OK | os.W_OK):
                    found.append(path)
    return found


def dri_prime_tag(pci_address: str) -> str:
    """Mesa's tag for a PCI address: ``0000:03:00.0`` -> ``pci-0000_03_00_0``."""
    domain, bus, rest = pci_address.lower().split(":")
    device, function = rest.split(".")
    return f"pci-{int(domain, 16):04x}_{int(bus, 16):02x}_{int(device, 16):02x}_{int(function, 16):1x}"


def job_gpu_address(
    environ: Mapping[str, str], driver_info: Callable[[], Mapping[str, Mapping[str, str]]] | None = None
) -> tuple[str | None, str]:
    """The PCI address of the job's first GPU and where it came from, or (None, why not)."""
    leased = [v for v in environ.get(jobenv.GPUS, "").split(",") if v.startswith("pci-")]
    if leased:
        return leased[0][len("pci-") :].lower(), jobenv.GPUS
    visible = [v.strip() for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and visible[0].lower().startswith("gpu-"):
        if driver_info is None:
            from ..families.gpu import FAMILY

            driver_info = FAMILY.driver_info
        uuids = {fields["GPU UUID"].lower(): bus for bus, fields in driver_info().items() if fields.get("GPU UUID")}
        address = uuids.get(visible[0].lower())
        if address:
            return address, "CUDA_VISIBLE_DEVICES"
        return None, f"the NVIDIA driver does not list CUDA_VISIBLE_DEVICES' {visible[0]}"
    if visible:
        return None, "CUDA_VISIBLE_DEVICES holds indices, which name no PCI address"
    return None, "the job names no GPU"


def device_select_layer(dirs: tuple[str, ...] = LAYER_DIRS) -> str | None:
    """The manifest of Mesa's device-select layer, if the Vulkan loader will find one."""
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            try:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    if LAYER_NAME in handle.read(65536):
                        return path
            except OSError:
                continue
    return None


def choose(
    environ: Mapping[str, str],
    driver_info: Callable[[], Mapping[str, Mapping[str, str]]] | None = None,
    layer_dirs: tuple[str, ...] = LAYER_DIRS,
    openable: Callable[[], list[str]] = openable_gpu_nodes,
) -> GpuChoice:
    """How this process will get the job's GPU from Vulkan (nothing is changed here)."""
    for name in (DRI_PRIME, MESA_SELECT, LAYER_OFF):
        if environ.get(name):
            return GpuChoice(None, {}, f"the GPU {name}={environ[name]} selects (set by the user)")
    address, source = job_gpu_address(environ, driver_info)
    if address is None:
        return GpuChoice(
            None,
            {},
            f"the first GPU Vulkan lists ({source}; the job's device cgroup or leases decide which GPUs that is)",
        )
    tag = dri_prime_tag(address)
    layer = device_select_layer(layer_dirs)
    if layer is None:
        return GpuChoice(
            address,
            {},
            f"the first GPU Vulkan lists, which is not necessarily {address} (from "
            f"{source}): Mesa's device-select layer is not installed "
            "(apt install mesa-vulkan-drivers)",
            uncertain=len(openable()) > 1,
        )
    return GpuChoice(
        address,
        {DRI_PRIME: tag, FORCE_DEFAULT: "1"},
        f"GPU {address} (from {source}), the only one Vulkan lists: {DRI_PRIME}={tag} "
        f"{FORCE_DEFAULT}=1 through Mesa's device-select layer ({layer})",
    )


def apply(choice: GpuChoice, environ: MutableMapping[str, str] | None = None) -> None:
    """Set the choice's variables in this process, before LiteRT first loads Vulkan."""
    target = os.environ if environ is None else environ
    target.update(choice.environment)
