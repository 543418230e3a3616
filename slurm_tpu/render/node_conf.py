"""The slurm.conf NodeName line: hardware facts, Gres= and Feature=."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from ..config import Config
from ..families import FAMILIES
from ..hardware import Inventory
from .gres_conf import gres_name_type, is_whole, shard_counts

# slurmd -C facts we carry into the NodeName line, in slurm.conf's usual order.
HARDWARE_KEYS = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")


def node_gres(inventory: Inventory, config: Config) -> str:
    """``Gres=`` value: ``name:type:count`` per (name, type) of the whole devices, in inventory order,
    then ``name:count`` per shard GRES (untyped: its count is the node's shares)."""
    whole = (a for a in inventory.usable() if is_whole(config, a))
    counts = Counter(gres_name_type(config, accelerator) for accelerator in whole)
    items = [f"{name}:{kind}:{count}" for (name, kind), count in counts.items()]
    items += [f"{name}:{count}" for name, count in shard_counts(inventory, config).items()]
    return ",".join(items)


def accounting_tres(gres: str) -> list[str]:
    """``AccountingStorageTRES`` entries for a ``Gres=`` value: ``gres/NAME`` and ``gres/NAME:TYPE`` for each.

    Slurm tracks (sacct/sreport, QOS limits) only the GRES named there; a typed GRES needs
    both the name (limits such as ``MaxTRESPerUser=gres/tpu=1``) and the name:type (usage per type).
    """
    from ..slurm.parse import parse_gres_items

    entries: list[str] = []
    for name, kind, _ in parse_gres_items(gres):
        entries += [f"gres/{name}", f"gres/{name}:{kind}"] if kind else [f"gres/{name}"]
    return list(dict.fromkeys(entries))


def inventory_tres(inventory: Inventory, config: Config) -> list[str]:
    """``AccountingStorageTRES`` entries for every GRES name and type of ``inventory`` (family by family)."""
    return accounting_tres(node_gres(inventory, config))


def accounting_tres_of_nodes_conf(text: str) -> list[str]:
    """``AccountingStorageTRES`` entries for every ``Gres=`` of the NodeName lines in ``text``."""
    from ..slurm.parse import parse_key_values

    entries: list[str] = []
    for line in text.splitlines():
        if line.strip().startswith("NodeName="):
            entries += accounting_tres(parse_key_values(line).get("Gres", ""))
    return list(dict.fromkeys(entries))


def node_features(inventory: Inventory, config: Config) -> list[str]:
    """Node features, family by family: each family's configured features and its
    devices' own (Edge TPU types; GPU vendors and types...)."""
    features: list[str] = []
    for family in FAMILIES:
        devices = inventory.usable(family.kind)
        if devices:
            features += family.features(config.family(family.kind), devices)
    return list(dict.fromkeys(features))  # de-duplicate, keep order


def render_node_line(
    inventory: Inventory,
    config: Config,
    node_name: str,
    hardware: Mapping[str, str] | None = None,
    extra: Mapping[str, str] | None = None,
) -> str:
    """One NodeName line; ``hardware`` from ``slurmd -C``, ``extra`` from --set."""
    parts = [f"NodeName={node_name}"]
    parts += [f"{key}={hardware[key]}" for key in HARDWARE_KEYS if hardware and key in hardware]
    parts += [f"{key}={value}" for key, value in (extra or {}).items()]
    gres = node_gres(inventory, config)
    if gres:
        parts.append(f"Gres={gres}")
    features = node_features(inventory, config)
    if features:
        parts.append(f"Feature={','.join(features)}")
    return " ".join(parts) + "\n"
