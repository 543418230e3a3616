"""Operations commands: health (and the watcher, metrics, report)."""

from __future__ import annotations

import json
import os
import socket

import click

from . import Obj, main

pass_obj = click.make_pass_decorator(Obj)


def node_name(obj: Obj, node: str | None) -> str:
    """--node, else slurmd's SLURMD_NODENAME, else the config's node_name, else the short hostname."""
    return (node or os.environ.get("SLURMD_NODENAME") or obj.config.node_name
            or socket.gethostname().split(".")[0])


@main.command()
@click.option("--node", metavar="NAME",
              help="Slurm NodeName (default: $SLURMD_NODENAME, else config node_name, else short hostname).")
@click.option("--dry-run", is_flag=True, help="Report what would be done; do not drain or resume.")
@click.option("--grace", type=float, default=1.5, show_default=True, metavar="SECONDS",
              help="Look again after this long before calling a USB stick missing (re-enumeration).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_obj
def health(obj: Obj, node: str | None, dry_run: bool, grace: float, as_json: bool) -> None:
    """Drain this node when a configured accelerator is missing, unusable or too hot.

    For slurm.conf's HealthCheckProgram. Resumes the node once healthy, but only
    if slurm-tpu drained it (reason starting 'slurm-tpu:'); an admin's drain is
    never overridden.
    """
    from ..ops.health_check import check_node

    result = check_node(obj.config, node_name(obj, node), grace=grace, apply=not dry_run)
    if as_json:
        click.echo(json.dumps({
            "node": result.node, "configured": list(result.configured),
            "problems": [{"identity": p.identity, "message": p.message} for p in result.problems],
            "action": result.decision.action.value, "reason": result.decision.reason,
            "applied": result.applied, "why": result.decision.why}))
        return
    verb = {"drain": "drained", "resume": "resumed", "nothing": "no change"}[result.decision.action.value]
    if dry_run and result.decision.action.value != "nothing":
        verb = f"would be {verb} (dry run)"
    detail = result.decision.reason or result.decision.why
    click.echo(f"{result.node}: {len(result.configured)} configured accelerator(s), "
               f"{len(result.problems)} problem(s); {verb}: {detail}")


@main.command()
@click.option("--node", metavar="NAME", help="Slurm NodeName (default: config node_name, else short hostname).")
@click.option("--gres-conf", "gres_conf", metavar="FILE", default="/etc/slurm/gres.conf", show_default=True,
              help="gres.conf holding this node's slurm-tpu block.")
@click.option("--node-conf", "node_conf", metavar="FILE",
              help="File holding this node's NodeName block (from node-conf --output); its Gres=/Feature= "
                   "are kept in line too.")
@click.option("--stop-command", metavar="COMMAND", default="systemctl stop slurmd", show_default=True,
              help="Stops this node's slurmd (split like a shell would, run without one).")
@click.option("--start-command", metavar="COMMAND", default="systemctl start slurmd", show_default=True,
              help="Starts this node's slurmd.")
@click.option("--controller-command", metavar="COMMAND", default="",
              help="Restarts slurmctld, needed when a GRES count changes (e.g. 'ssh ctl systemctl restart "
                   "slurmctld'). Without it the node stays drained with a reason saying what to restart, "
                   "and `slurm-tpu health` resumes it once slurmctld reports the new GRES.")
@click.option("--files-only", is_flag=True, help="Only rewrite the files; never drain or restart.")
@click.option("--settle", type=float, default=5.0, show_default=True, metavar="SECONDS",
              help="Quiet time after the last udev event before acting (covers USB re-enumeration).")
@click.option("--duration", type=float, metavar="SECONDS", help="Stop after this long (default: run forever).")
@pass_obj
def watch(obj: Obj, node: str | None, gres_conf: str, node_conf: str | None, stop_command: str,
          start_command: str, controller_command: str, files_only: bool, settle: float,
          duration: float | None) -> None:
    """Follow udev hotplug events and keep gres.conf and Slurm in line with the hardware.

    A USB re-enumeration (the same stick back under its topology path) changes
    nothing. A real plug/unplug regenerates this node's gres.conf block (slot nodes
    first, so it never names a missing path) and NodeName line, then drains the
    node, waits for its accelerator jobs, restarts slurmd (and slurmctld when the
    GRES count changed and --controller-command is given) and resumes the node.
    """
    import shlex

    from ..ops.restart import RestartCommands
    from ..ops.watch import Watcher

    commands = None if files_only else RestartCommands(
        shlex.split(stop_command), shlex.split(start_command), shlex.split(controller_command))
    watcher = Watcher(obj.config, node or obj.config.node_name or socket.gethostname().split(".")[0],
                      gres_conf, node_conf, commands, settle=settle)
    watcher.run(stop_after=duration)
