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
