"""gres.conf lines for a node's accelerators.

A shared device (``families.<kind>.shared``) is counted in its family's shard GRES
(``Family.shard_gres``): an Edge TPU's in one count-only ``tpu_shard`` line per node instead of
its own ``tpu`` line, a GPU's in Slurm's ``shard`` lines (one per GPU, ``File=`` its node) beside
its ``gpu`` line.

Devices of a family with slot nodes (``Family.slot``) are named by their *slot node*,
``<slot_dir>/<identity>``, which never moves or vanishes as a USB stick's own node does
(docs/architecture.md, "Stable device paths"); GPU nodes are created by their drivers and
stay put, so GPUs use them directly.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Shared:
    """One usable shared device: the shard GRES that counts it and its shares."""

    accelerator: Accelerator
    gres_name: str  # the shard GRES (tpu_shard, shard)
    shares: int
    per_file: bool  # Slurm's gres/shard (a File= line per device, beside the whole GRES) or a node-level count


def shared_devices(inventory: Inventory, config: Config) -> list[Shared]:
    """The usable devices the config shares, in inventory order."""
    found = []
    for accelerator in inventory.usable():
        owner, settings = family(accelerator.kind), config.family(accelerator.kind)
        shares = owner.device_shares(settings, accelerator)
        if shares:
            found.append(Shared(accelerator, owner.shard_name(settings), shares, owner.shard_per_file))
    return found


def is_whole(config: Config, accelerator: Accelerator) -> bool:
    """Whether the device is a whole GRES of its own (not shared, or shared the gres/shard way beside it)."""
    owner = family(accelerator.kind)
    return owner.shard_per_file or not owner.device_shares(config.family(accelerator.kind), accelerator)


def shard_counts(inventory: Inventory, config: Config) -> dict[str, int]:
    """Shard GRES name -> the node's count of it (the sum of its shared devices' shares)."""
    counts: dict[str, int] = {}
    for item in shared_devices(inventory, config):
        counts[item.gres_name] = counts.get(item.gres_name, 0) + item.shares
    return counts


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
    for accelerator in inventory.usable():
        if not is_whole(config, accelerator):
            continue
        name, kind = gres_name_type(config, accelerator)
        lines.append(
            f"NodeName={node_name} Name={name} Type={kind} File={gres_file(config, accelerator)}"
            f"{_cores(accelerator, inventory)}"
        )
    shared = shared_devices(inventory, config)
    for item in shared:  # Slurm's gres/shard: the shares of each device, named by its node
        if item.per_file:
            lines.append(
                f"NodeName={node_name} Name={item.gres_name} Count={item.shares} "
                f"File={gres_file(config, item.accelerator)}"
            )
    counted = [item for item in shared if not item.per_file]
    for name in dict.fromkeys(item.gres_name for item in counted):  # one count per node: no File=, no Type=
        mine = [item for item in counted if item.gres_name == name]
        covers = ", ".join(f"{item.accelerator.identity} ({item.shares})" for item in mine)
        lines.append(f"# {name}: the shares of the shared devices {covers}")
        lines.append(f"NodeName={node_name} Name={name} Count={sum(item.shares for item in mine)}")
    for accelerator in inventory:
        if not accelerator.usable:
            lines.append(f"# not configured: {accelerator.identity} ({accelerator.model}): {accelerator.reason}")
    if not lines:
        lines.append(f"# no accelerators found on {node_name}")
    return "\n".join(lines) + "\n"
