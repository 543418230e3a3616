"""The accelerator family registry: every kind of device the suite knows, in one tuple.

Adding a family is its module (a :class:`~slurm_tpu.families.base.Family` and a ``FAMILY``
instance), its tests, and its module's name in :data:`MODULES`, whose order is the order of
detection's output and of the job environment's variables. The root hooks never import this
package: what they need is precomputed into their snapshot (protocol/hooks_snapshot.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import Any

from ..hardware import Inventory
from .base import Family, FamilyConfig

# The registered family modules (each defines FAMILY), in registry order.
MODULES = ("coral", "gpu", "hailo")
FAMILIES: tuple[Family, ...] = tuple(import_module(f"{__name__}.{name}").FAMILY for name in MODULES)

KINDS: tuple[str, ...] = tuple(f.kind for f in FAMILIES)


def family(kind: str) -> Family:
    """The family of a kind string; KeyError names the known kinds."""
    for candidate in FAMILIES:
        if candidate.kind == kind:
            return candidate
    raise KeyError(f"unknown accelerator kind {kind!r} (known: {', '.join(KINDS)})")


def inventory_from_json(document: Mapping[str, Any]) -> Inventory:
    """An Inventory from a ``detect --json`` document, each item's details typed by its family
    (KeyError/TypeError/ValueError on bad input, an unknown kind included)."""
    return Inventory.from_json(dict(document), lambda item: family(str(item["kind"])).details_from_json(item))


def subsystems() -> tuple[str, ...]:
    """Every udev subsystem some family looks at, in registry order."""
    return tuple(dict.fromkeys(s for f in FAMILIES for s in f.attributes))


__all__ = ["FAMILIES", "KINDS", "Family", "FamilyConfig", "family", "inventory_from_json", "subsystems"]
