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

import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from ..errors import SlurmCommandError
from ..slurm.commands import find_program, run
from .health import HOLD_PREFIX, REASON_PREFIX, parse_node_state

CHANGE_REASON = f"{REASON_PREFIX} accelerators changed; restarting slurmd"


@dataclass(frozen=True)
class RestartCommands:
    """How to stop/start this node's slurmd and (optionally) restart slurmctld."""

    stop_slurmd: Sequence[str]
    start_slurmd: Sequence[str]
    restart_controller: Sequence[str] = ()


def jobs_with_gres(node: str, squeue: str) -> list[str]:
    """Ids of running/completing jobs on ``node`` that asked for a GRES."""
    out = run([squeue, "-h", "-w", node, "-t", "RUNNING,COMPLETING", "-o", "%i %b"])
    jobs = []
    for line in out.splitlines():
        job, _, gres = line.strip().partition(" ")
        if job and gres.strip() not in ("", "N/A", "(null)"):
            jobs.append(job)
    return jobs


def _run_command(argv: Sequence[str], node: str) -> None:
    try:
        subprocess.run(list(argv), check=True, timeout=120, capture_output=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        stderr = getattr(exc, "stderr", b"") or b""
        detail = stderr.decode(errors="replace").strip().splitlines()[-1:] or [str(exc)]
        raise SlurmCommandError(f"{' '.join(argv)} failed: {detail[0]}; {node} stays drained", argv[0]) from exc


def apply_hardware_change(node: str, count_changed: bool, commands: RestartCommands, new_gres: str,
                          log: Callable[[str], None], wait_timeout: float = 3600, poll: float = 2.0) -> bool:
    """Make Slurm use the regenerated files. True when the node serves jobs again."""
    scontrol, squeue = find_program("scontrol"), find_program("squeue")
    current = parse_node_state(run([scontrol, "show", "node", node]))
    admin_drained = "DRAIN" in current["state"] and not current["reason"].startswith(REASON_PREFIX)
    if not admin_drained:
        run([scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={CHANGE_REASON}"])
    deadline = time.monotonic() + wait_timeout
    while (busy := jobs_with_gres(node, squeue)):
        if time.monotonic() > deadline:
            raise SlurmCommandError(f"{node}: accelerator jobs {', '.join(busy)} still running after "
                                    f"{wait_timeout:g} s; slurmd not restarted (node stays drained)", "squeue")
        log(f"slurm-tpu watch: waiting for accelerator job(s) {', '.join(busy)} on {node} to end")
        time.sleep(poll)
    if count_changed and not commands.restart_controller:
        hold = (f"{HOLD_PREFIX}; restart slurmctld, then slurmd on {node}, "
                f"to apply Gres={new_gres or '(none)'}")
        if not admin_drained:
            run([scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={hold}"])
        log(f"slurm-tpu watch: {hold} (no --controller-command given)")
        return False
    _run_command(commands.stop_slurmd, node)
    if count_changed:
        _run_command(commands.restart_controller, node)
    _run_command(commands.start_slurmd, node)
    _wait_responding(node, scontrol)
    if not admin_drained:
        now = parse_node_state(run([scontrol, "show", "node", node]))
        if now["reason"].startswith(REASON_PREFIX):
            run([scontrol, "update", f"NodeName={node}", "State=RESUME"])
    return not admin_drained


def _wait_responding(node: str, scontrol: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = parse_node_state(run([scontrol, "show", "node", node]))["state"]
        except SlurmCommandError:  # the controller may still be starting
            state = ""
        if state and not any(bad in state for bad in ("DOWN", "NOT_RESPONDING", "UNKNOWN")):
            return
        time.sleep(1)
    raise SlurmCommandError(f"{node} did not come back within {timeout:g} s after the restart", scontrol)
