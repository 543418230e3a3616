"""gres.conf lines for a node's accelerators.

Devices of a family with slot nodes (``Family.slot``) are named by their *slot node*,
``<slot_dir>/<identity>``, which slurm-tpu keeps for every configured device and never
deletes: a USB stick's own ``/dev/bus/usb/BBB/DDD`` changes each time its firmware loads
and vanishes when it is unplugged, and slurmd exits fatally 20 s after a ``File=`` path
disappears. The udev hook re-points the slot at the device's current node on every add
event. GPU nodes are created by their drivers and stay put, so GPUs use them directly.
"""

from __future__ import annotations

from ..config import Config
from ..cpulist import format_cpu_list, parse_cpu_list
from ..families import family
from ..hardware import Accelerator, Inventory


def slot_path(config: Config, accelerator: Accelerator) -> str:
    """The stable slot node of a device (``<slot_dir>/<identity>``)."""
    return f"{config.slot_dir.rstrip('/')}/{accelerator.identity}"


def gres_file(config: Config, accelerator: Accelerator) -> str:
    """The path gres.conf names for this accelerator."""
    if family(accelerator.kind).slot:
        return slot_path(config, accelerator)
    assert accelerator.primary_node, accelerator.identity  # only usable devices are rendered
    return accelerator.primary_node


def gres_name_type(config: Config, accelerator: Accelerator) -> tuple[str, str]:
    """The GRES name (``tpu``, ``gpu``... unless the config renames them) and type of a device."""
    settings = config.family(accelerator.kind)
    return settings.gres_name, family(accelerator.kind).gres_type(settings, accelerator)


def _cores(accelerator: Accelerator, inventory: Inventory) -> str:
    """`` Cores=...`` in Slurm's core indices, or '' when the device is near every core (sysfs gives
    local *CPUs*: with SMT those are thread ids, which Slurm would reject as core numbers)."""
    if not family(accelerator.kind).cores or not accelerator.local_cpus:
        return ""
    try:
        cpus = parse_cpu_list(accelerator.local_cpus)
        online = parse_cpu_list(inventory.online_cpus)
    except ValueError:
        return ""  # an unreadable list: leave affinity out rather than guess
    mapping = inventory.core_of_cpu
    cores = {mapping.get(cpu, cpu) for cpu in cpus} if mapping else set(cpus)
    every = set(mapping.values()) if mapping else set(online)
    if not cores or (every and cores >= every):
        return ""
    return f" Cores={format_cpu_list(cores)}"


def render_gres_conf(inventory: Inventory, config: Config, node_name: str) -> str:
    """gres.conf lines for ``node_name`` (no block markers; see files.py); an unusable device is
    only a comment giving the reason, so slurmd is never told about a device it cannot use."""
    lines = []
    for accelerator in inventory:
        if not accelerator.usable:
            continue
        name, kind = gres_name_type(config, accelerator)
        lines.append(
            f"NodeName={node_name} Name={name} Type={kind} File={gres_file(config, accelerator)}"
            f"{_cores(accelerator, inventory)}"
        )
    for accelerator in inventory:
        if not accelerator.usable:
            lines.append(f"# not configured: {accelerator.identity} ({accelerator.model}): {accelerator.reason}")
    if not lines:
        lines.append(f"# no accelerators found on {node_name}")
    return "\n".join(lines) + "\n"
