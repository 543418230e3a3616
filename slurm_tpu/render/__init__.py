"""Renderers: pure functions from an Inventory (and Config) to config-file text."""

from .gres_conf import render_gres_conf, shard_counts, shared_devices, slot_path
from .node_conf import node_features, node_gres, render_node_line
from .udev_rules import render_udev_rules

__all__ = [
    "render_gres_conf",
    "shard_counts",
    "shared_devices",
    "slot_path",
    "node_features",
    "node_gres",
    "render_node_line",
    "render_udev_rules",
]
