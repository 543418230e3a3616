"""``slurm-tpu health``: detect, compare, and drain or resume this node in Slurm.

Runs as Slurm's HealthCheckProgram (as root, every HealthCheckInterval seconds).
One node-state query, at most one drain or resume (``scontrol``, or pyslurm when
``slurm.backend: pyslurm``; see ``slurm/backend.py`` for why not by default).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from ..config import Config
from ..errors import SlurmTpuError
from ..families import inventory_from_json
from ..hardware import Bus, Inventory
from ..slurm.backend import open_backend
from .health_policy import Action, Decision, Problem, decide, find_problems


@dataclass(frozen=True)
class HealthResult:
    node: str
    configured: tuple[str, ...]
    problems: tuple[Problem, ...]
    decision: Decision
    applied: bool


def configured_inventory(config: Config) -> Inventory:
    """The usable accelerators this node was configured with (its state-dir inventory)."""
    from .node_state import configured_document

    document = configured_document(config)
    if not document:
        return Inventory()
    inventory = inventory_from_json(document)
    return dataclasses.replace(inventory, accelerators=tuple(inventory.usable()))


def _detect() -> Inventory:
    from ..detect import detect_inventory

    return detect_inventory(use_nvml=False)


def clear_kept_leases(config: Config) -> list[tuple[str, str]]:
    """End the leases an epilog kept (a holder survived) whose holder is gone now, as root.

    The device goes back to its idle owner at once, not at the next job's prolog.
    """
    import os

    from ..access.ledger import LEASES, Ledger
    from ..hooks import leasing, settings as hook_settings

    leases_dir = os.path.join(config.state_dir, LEASES)
    if os.geteuid() != 0 or not os.path.isdir(leases_dir) or not os.listdir(leases_dir):
        return []
    settings = hook_settings.for_config(config)
    with Ledger(settings.state_dir, create=False) as ledger:
        return leasing.clear(ledger, settings)


def check_node(config: Config, node: str, grace: float = 1.5, apply: bool = True) -> HealthResult:
    """Find problems and bring the node's Slurm state in line with them."""
    if apply:
        try:
            clear_kept_leases(config)
        except (SlurmTpuError, OSError):
            pass  # the ledger's own problem; the epilog and `slurm-tpu leases` report it
    configured_devices = configured_inventory(config)
    configured = tuple(a.identity for a in configured_devices)
    problems = find_problems(configured, _detect()) if configured else []
    # A USB stick re-enumerating (firmware load, port reset) is absent for a moment:
    # look again before calling it missing.
    if any(p.message.endswith(" missing") and p.identity.startswith(f"{Bus.USB.value}-") for p in problems):
        time.sleep(grace)
        problems = find_problems(configured, _detect())
    slurm = open_backend(config, "health")
    current = slurm.node_state(node)
    from ..render import node_gres

    decision = decide(
        current["state"], current["reason"], problems, current["gres"], node_gres(configured_devices, config)
    )
    applied = apply and decision.action != Action.NOTHING
    if applied and decision.action == Action.DRAIN:
        slurm.drain(node, decision.reason)
    elif applied:
        slurm.resume(node)
    return HealthResult(node, configured, tuple(problems), decision, applied)
