"""Bring a node's generated configuration in line with an inventory.

Shared by ``slurm-tpu gres-conf --output`` and the hotplug watcher, so both keep
the same order: slot nodes first (gres.conf must never name a missing path),
then the state-dir inventory the hooks read, then the files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..config import Config
from ..families import family
from ..files import block_markers, merge_block, read_text, write_if_changed
from ..hardware import Inventory
from ..render import node_features, node_gres, render_gres_conf, slot_path
from ..slurm.parse import parse_key_values


def prepare_node_state(config: Config, inventory: Inventory) -> None:
    """Create/re-point slot nodes (families with slots: Edge TPUs...), save the state inventory and
    its persistent copy (restored by ``slurm-tpu boot`` after a reboot)."""
    import json

    from ..access.node_inventory import write_state_inventory
    from ..access.slots import ensure_slot

    for accelerator in (a for a in inventory.usable() if family(a.kind).slot):
        ensure_slot(
            os.path.dirname(slot_path(config, accelerator)), accelerator.identity, accelerator.primary_node or ""
        )
    write_state_inventory(config.state_dir, inventory.to_json())
    os.makedirs(os.path.dirname(config.inventory_file), mode=0o755, exist_ok=True)
    write_if_changed(config.inventory_file, json.dumps(inventory.to_json(), indent=1) + "\n")


def update_node_line(line: str, inventory: Inventory, config: Config) -> str:
    """``line`` with its Gres= and Feature= recomputed; every other attribute kept."""
    fields = parse_key_values(line)
    parts = [f"{k}={v}" for k, v in fields.items() if k not in ("Gres", "Feature")]
    gres, features = node_gres(inventory, config), node_features(inventory, config)
    if gres:
        parts.append(f"Gres={gres}")
    if features:
        parts.append(f"Feature={','.join(features)}")
    return " ".join(parts)


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
    gres_changed: bool
    node_changed: bool
    old_gres: str
    new_gres: str

    @property
    def changed(self) -> bool:
        return self.gres_changed or self.node_changed


def configure_node(
    config: Config, inventory: Inventory, node: str, gres_conf: str, node_conf: str | None = None
) -> ConfigureResult:
    """Slots, state inventory, the node's gres.conf block and (if given) its NodeName line."""
    prepare_node_state(config, inventory)
    gres_text = read_text(gres_conf)
    new_gres_text = merge_block(gres_text, "gres", node, render_gres_conf(inventory, config, node), gres_conf)
    gres_changed = write_if_changed(gres_conf, new_gres_text).changed
    node_changed, old_gres, new_gres = False, "", node_gres(inventory, config)
    if node_conf:
        node_text = read_text(node_conf)
        line = _node_block_line(node_text, node) or f"NodeName={node}"
        old_gres = parse_key_values(line).get("Gres", "")
        updated = update_node_line(line, inventory, config)
        node_changed = write_if_changed(node_conf, merge_block(node_text, "node", node, updated, node_conf)).changed
    return ConfigureResult(gres_changed, node_changed, old_gres, new_gres)
