"""Bring a node's slot nodes, state inventory and generated configuration in line with an inventory.

Shared by ``slurm-tpu gres-conf --output`` and the hotplug watcher, so both keep
the same order: slot nodes first (gres.conf must never name a missing path),
then the state-dir inventory the hooks read, then the files. ``slurm-tpu boot`` restores
the first two after a reboot (:func:`restore_node_state`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

from ..config import Config
from ..errors import SlurmTpuError
from ..families import family, inventory_from_json
from ..files import block_markers, merge_block, read_text, write_if_changed
from ..hardware import Accelerator, Inventory
from ..render import node_gres, render_gres_conf, render_node_line, slot_path
from ..slurm.parse import parse_key_values


def prepare_node_state(config: Config, inventory: Inventory) -> None:
    """Create/re-point slot nodes (families with slots: Edge TPUs...), save the state inventory and
    its persistent copy (restored by ``slurm-tpu boot`` after a reboot), and rewrite this node's CDI
    specs where it has them (``slurm-tpu cdi``: a hotplugged device gets its CDI name, an unplugged
    one loses it)."""
    from ..access.node_inventory import write_state_inventory
    from ..access.slots import ensure_slot
    from .cdi import refresh_cdi

    for accelerator in (a for a in inventory.usable() if family(a.kind).slot):
        ensure_slot(
            os.path.dirname(slot_path(config, accelerator)), accelerator.identity, accelerator.primary_node or ""
        )
    write_state_inventory(config.state_dir, inventory.to_json())
    os.makedirs(os.path.dirname(config.inventory_file), mode=0o755, exist_ok=True)
    write_if_changed(config.inventory_file, json.dumps(inventory.to_json(), indent=1) + "\n")
    refresh_cdi(config, inventory)


def _node_block_line(text: str, node: str) -> str | None:
    begin, end = block_markers("node", node)
    inside = False
    for line in text.splitlines():
        if line.startswith(begin):
            inside = True
        elif inside and (line == f"NodeName={node}" or line.startswith(f"NodeName={node} ")):
            return line
        elif line == end:
            inside = False
    return None


@dataclass(frozen=True)
class ConfigureResult:
    changed: bool  # a file was rewritten
    new_gres: str  # the node's Gres= now


def configure_node(
    config: Config, inventory: Inventory, node: str, gres_conf: str, node_conf: str | None = None
) -> ConfigureResult:
    """Slots, state inventory, the node's gres.conf block and (if given) its NodeName line."""
    prepare_node_state(config, inventory)
    gres_text = read_text(gres_conf)
    new_gres_text = merge_block(gres_text, "gres", node, render_gres_conf(inventory, config, node), gres_conf)
    changed = write_if_changed(gres_conf, new_gres_text).changed
    if node_conf:
        node_text = read_text(node_conf)
        # The node's line with Gres= and Feature= recomputed; every other attribute kept.
        fields = parse_key_values(_node_block_line(node_text, node) or f"NodeName={node}")
        kept = {key: value for key, value in fields.items() if key not in ("NodeName", "Gres", "Feature")}
        line = render_node_line(inventory, config, node, extra=kept)
        changed = write_if_changed(node_conf, merge_block(node_text, "node", node, line, node_conf)).changed or changed
    return ConfigureResult(changed, node_gres(inventory, config))


@dataclass(frozen=True)
class BootResult:
    configured: int
    present: tuple[str, ...]
    absent: tuple[str, ...]


def restore_node_state(config: Config, live: Inventory) -> BootResult:
    """Slots and state inventory from ``config.inventory_file`` (the persistent copy) and the live hardware,
    after a reboot wiped ``/dev``'s slots and ``/run``'s state inventory (slurmd exits on a missing ``File=``).
    A configured device absent now gets an inert placeholder slot: slurmd starts, and health drains the node."""
    from ..access.node_inventory import write_state_inventory
    from ..access.slots import ensure_placeholder_slot, ensure_slot

    try:
        with open(config.inventory_file, encoding="utf-8") as handle:
            configured = inventory_from_json(json.load(handle))
    except FileNotFoundError:
        raise SlurmTpuError(
            f"no configured inventory at {config.inventory_file}: run "
            "`slurm-tpu gres-conf --output /etc/slurm/gres.conf` once on this node"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SlurmTpuError(
            f"{config.inventory_file} is unreadable ({exc}); rerun `slurm-tpu gres-conf --output ...` to rewrite it"
        ) from exc
    present: list[str] = []
    absent: list[str] = []
    restored: list[Accelerator] = []
    for accelerator in configured:
        now = live.by_identity(accelerator.identity)
        if accelerator.usable and family(accelerator.kind).slot:
            directory = os.path.dirname(slot_path(config, accelerator))
            if now is not None and now.usable and now.primary_node:
                ensure_slot(directory, accelerator.identity, now.primary_node)
            else:
                ensure_placeholder_slot(directory, accelerator.identity)
        if accelerator.usable:
            (present if now is not None and now.usable else absent).append(accelerator.identity)
        # Current node paths where the device is here; the configured ones otherwise.
        restored.append(
            dataclasses.replace(accelerator, device_nodes=now.device_nodes)
            if now is not None and now.device_nodes
            else accelerator
        )
    write_state_inventory(config.state_dir, dataclasses.replace(configured, accelerators=tuple(restored)).to_json())
    return BootResult(len(configured.usable()), tuple(present), tuple(absent))
