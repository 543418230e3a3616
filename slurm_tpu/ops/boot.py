"""``slurm-tpu boot``: restore what a reboot wipes, before slurmd starts.

``/dev`` (slot nodes) and ``/run`` (the state inventory the hooks read) are tmpfs.
Without them slurmd exits 20 s after start on a missing ``File=`` and the hooks
know no devices. This restores both from the persistent copy of the configured
inventory (``inventory_file``): present devices get their real slot and current
node paths; a configured device absent at boot gets an inert placeholder slot,
so slurmd still starts, and ``slurm-tpu health`` drains the node for it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

from ..config import Config
from ..errors import SlurmTpuError
from ..families import family, inventory_from_json
from ..hardware import Accelerator, Inventory
from ..render import slot_path


@dataclass(frozen=True)
class BootResult:
    configured: int
    present: tuple[str, ...]
    absent: tuple[str, ...]


def restore_node_state(config: Config, live: Inventory) -> BootResult:
    """Slots and state inventory from ``config.inventory_file`` and the live hardware."""
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
