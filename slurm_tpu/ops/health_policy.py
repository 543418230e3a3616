"""Node health: compare the live hardware with what the node was configured with.

Pure functions only. The reference is the node's configured inventory
(``<state_dir>/inventory.json``, written with gres.conf by ``gres-conf --output``):
a configured device that is missing, unusable, or at/above its first thermal trip
point makes the node unhealthy.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..hardware import Inventory

REASON_PREFIX = "slurm-tpu:"
# The watcher's drain while a GRES count change waits for daemon restarts: health
# resumes it only once slurmctld reports the GRES the hardware now has.
HOLD_PREFIX = f"{REASON_PREFIX} accelerators changed"
# Shorter than any drain reason may be (slurm.commands.MAX_REASON): health's list of
# missing devices is read in `sinfo -R`, on one line.
MAX_REASON = 200


@dataclass(frozen=True)
class Problem:
    """One reason a configured device cannot serve jobs."""

    identity: str
    message: str


def find_problems(configured: Iterable[str], live: Inventory) -> list[Problem]:
    """Problems of the configured identities in the live inventory, in a stable order."""
    problems = []
    for identity in sorted(configured):
        accelerator = live.by_identity(identity)
        if accelerator is None:
            problems.append(Problem(identity, f"{identity} missing"))
            continue
        temperature, trips = accelerator.details.temperature_c, accelerator.details.trip_points_c
        if not accelerator.usable:
            problems.append(Problem(identity, f"{identity} unusable ({accelerator.reason})"))
        elif temperature is not None and trips and temperature >= trips[0]:
            problems.append(
                Problem(identity, f"{identity} at {temperature:.1f} C, above its {trips[0]:.0f} C trip point")
            )
    return problems


def drain_reason(problems: Iterable[Problem]) -> str:
    """The Slurm drain reason for these problems (starts with ``slurm-tpu:``), in the form the drain
    stores (``node_reason``), so that it equals what Slurm reports back while the problems stay."""
    from ..slurm.commands import node_reason

    return node_reason(f"{REASON_PREFIX} " + "; ".join(p.message for p in problems), MAX_REASON)


class Action(enum.Enum):
    """What the health check does to the node."""

    NOTHING = "nothing"
    DRAIN = "drain"
    RESUME = "resume"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str = ""
    why: str = ""


def decide(
    state: str,
    reason: str,
    problems: list[Problem],
    controller_gres: str | None = None,
    expected_gres: str | None = None,
) -> Decision:
    """Drain/resume policy: never override a drain that is not ours.

    ``state`` is Slurm's node state (``IDLE+DRAIN``, ``MIXED``...), ``reason`` the
    node's current reason without Slurm's ``[user@time]`` suffix. A watcher hold
    (:data:`HOLD_PREFIX`) is resumed only when ``controller_gres`` (what slurmctld
    reports) equals ``expected_gres`` (what the configured hardware renders to).
    """
    drained = "DRAIN" in state.upper()
    ours = reason.startswith(REASON_PREFIX)
    if drained and reason.startswith(HOLD_PREFIX):
        if problems or controller_gres is None or strip_affinity(controller_gres) != (expected_gres or "(null)"):
            return Decision(Action.NOTHING, reason=reason, why="waiting for slurmctld/slurmd restarts")
        return Decision(Action.RESUME, why="slurmctld now reports the new GRES; resuming")
    if problems:
        wanted = drain_reason(problems)
        if drained and not ours:
            return Decision(
                Action.NOTHING, why=f"node already drained by someone else ({reason or 'no reason'}); left alone"
            )
        if drained and reason == wanted:
            return Decision(Action.NOTHING, reason=wanted, why="already drained for this reason")
        return Decision(Action.DRAIN, reason=wanted, why="unhealthy")
    if drained and ours:
        return Decision(Action.RESUME, why="healthy again; resuming the drain slurm-tpu made")
    return Decision(Action.NOTHING, why="healthy")


def strip_affinity(gres: str) -> str:
    """``gpu:a100:2(S:0-1),tpu:x:1`` -> ``gpu:a100:2,tpu:x:1`` (Slurm's socket annotations)."""
    return re.sub(r"\(S:[^)]*\)", "", gres)
