"""Applying a hardware change safely: drain, wait for accelerator jobs, restart, resume.

What Slurm 22.05 accepts (measured on the local cluster): a changed ``File=``
list with the same count needs only a slurmd restart; a changed *count* with
``File=`` is refused by ``scontrol reconfigure`` and ``scontrol update
NodeName=... Gres=...`` ("invalid with File configuration") and takes a slurmctld
restart, with slurmd stopped meanwhile so it never registers a count the
controller does not expect (that marks the node invalid). A compute node cannot
restart the controller by itself, so that step runs only when the admin gave a
command for it; otherwise the node stays drained with a reason saying what to
restart, and ``slurm-tpu health`` resumes it once slurmctld reports the new GRES.

The node is drained first (unless an admin drained it: then it stays drained and
is not resumed), and nothing is restarted while a job on the node holds a GRES.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

from ..errors import SlurmCommandError
from ..slurm.backend import SlurmBackend
from .health_policy import HOLD_PREFIX, REASON_PREFIX

CHANGE_REASON = f"{REASON_PREFIX} accelerators changed; restarting slurmd"


@dataclass(frozen=True)
class RestartCommands:
    """How to stop/start this node's slurmd and (optionally) restart slurmctld."""

    stop_slurmd: Sequence[str]
    start_slurmd: Sequence[str]
    restart_controller: Sequence[str] = ()


def _run_command(slurm: SlurmBackend, argv: Sequence[str], node: str) -> None:
    """Run an admin's restart command (found like every program: Slurm's directories, PATH; no shell)."""
    if not argv:
        return
    try:
        slurm.run_command(argv, timeout=120)
    except SlurmCommandError as exc:
        raise SlurmCommandError(f"{exc}; {node} stays drained", argv[0], exc.stderr) from exc


def apply_hardware_change(
    slurm: SlurmBackend,
    node: str,
    count_changed: bool,
    commands: RestartCommands,
    new_gres: str,
    log: Callable[[str], None],
    wait_timeout: float = 3600,
    poll: float = 2.0,
) -> bool:
    """Make Slurm use the regenerated files. True when the node serves jobs again."""
    current = slurm.node_state(node)
    admin_drained = "DRAIN" in current["state"] and not current["reason"].startswith(REASON_PREFIX)
    if not admin_drained:
        slurm.drain(node, CHANGE_REASON)
    deadline = time.monotonic() + wait_timeout
    while busy := slurm.jobs_with_gres(node):
        if time.monotonic() > deadline:
            raise SlurmCommandError(
                f"{node}: accelerator jobs {', '.join(busy)} still running after "
                f"{wait_timeout:g} s; slurmd not restarted (node stays drained)",
                "squeue",
            )
        log(f"slurm-tpu watch: waiting for accelerator job(s) {', '.join(busy)} on {node} to end")
        time.sleep(poll)
    if count_changed and not commands.restart_controller:
        hold = f"{HOLD_PREFIX}; restart slurmctld, then slurmd on {node}, to apply Gres={new_gres or '(none)'}"
        if not admin_drained:
            slurm.drain(node, hold)
        log(f"slurm-tpu watch: {hold} (no --controller-command given)")
        return False
    _run_command(slurm, commands.stop_slurmd, node)
    if count_changed:
        _run_command(slurm, commands.restart_controller, node)
    _run_command(slurm, commands.start_slurmd, node)
    _wait_responding(slurm, node)
    if not admin_drained and slurm.node_state(node)["reason"].startswith(REASON_PREFIX):
        slurm.resume(node)
    return not admin_drained


def _wait_responding(slurm: SlurmBackend, node: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = slurm.node_state(node)["state"]
        except SlurmCommandError:  # the controller may still be starting
            state = ""
        if state and not any(bad in state for bad in ("DOWN", "NOT_RESPONDING", "UNKNOWN")):
            return
        time.sleep(1)
    raise SlurmCommandError(f"{node} did not come back within {timeout:g} s after the restart", "slurmd")
