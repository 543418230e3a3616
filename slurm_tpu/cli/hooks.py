"""Commands around the lease ledger: leases (who holds what) and udev-event."""

from __future__ import annotations

import json
import sys
import time

import click

from .group import EXIT_ERROR, Obj, main, pass_obj, table


def _rows(obj: Obj) -> list[dict]:
    import os

    from ..access import node_inventory, ownership
    from ..access.ledger import KEPT, RELEASING, REVOKING, BadLease, Ledger
    from ..hooks.leasing import holder_alive

    config = obj.config
    if not os.path.lexists(config.state_dir):
        return []
    rows = []
    with Ledger(config.state_dir, create=False) as ledger:
        known = node_inventory.load(ledger.dir_fd)
        for lease in ledger.all():
            device = known.get(lease.identity)
            nodes = device.device_nodes if device else ()
            states = [ownership.node_state(n) for n in nodes]
            row = {
                "identity": lease.identity,
                "job_id": lease.job_id,
                "uid": lease.uid,
                "nodes": [
                    {"path": n, "uid": s.uid if s else None, "mode": f"{s.mode:04o}" if s else None}
                    for n, s in zip(nodes, states)
                ],
            }
            if isinstance(lease, BadLease):
                row.update(user="", start=None, state=f"bad: {lease.reason}")
            else:
                alive = holder_alive(lease)
                clear = f"fix it, then `slurm-tpu leases --clear {lease.identity}`"
                state = {
                    KEPT: f"kept (its epilog found a problem; {clear})",
                    REVOKING: "revoking (" + (alive or "the device did not come back; replug it") + ")",
                    RELEASING: "releasing (" + (alive or "its release was cut short; the next prolog redoes it") + ")",
                }.get(lease.phase) or ("running" if alive else "stale (job gone; reclaimed by the next prolog)")
                row.update(
                    user=lease.user,
                    start=lease.start,
                    kind=lease.kind,
                    allocation=list(lease.allocation),
                    phase=lease.phase,
                    state=state,
                )
            rows.append(row)
    return rows


def _clear(obj: Obj, identity: str) -> None:
    """End the stale lease on ``identity`` now: take it away, revoke, check, idle ownership."""
    from ..access.ledger import Ledger
    from ..hooks import leasing, settings as hook_settings

    settings = hook_settings.for_config(obj.config)
    with Ledger(settings.state_dir, create=False) as ledger:
        outcomes = leasing.clear(ledger, settings, identity)
    if not outcomes:
        click.echo(f"{identity}: no lease on this node; nothing to clear", err=True)
        sys.exit(EXIT_ERROR)
    for name, outcome in outcomes:
        if outcome == "cleared":
            click.echo(f"{name}: cleared; idle ownership restored")
        elif outcome == "revoking":
            click.echo(f"{name}: revoked (port power-cycled); udev restores idle ownership when it is back")
        else:
            click.echo(f"{name}: not cleared: {outcome}", err=True)
            sys.exit(EXIT_ERROR)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the leases as JSON.")
@click.option(
    "--clear",
    "clear_identity",
    metavar="IDENTITY",
    help="End the stale lease on IDENTITY now (after its holder was killed): revoke, check, "
    "and give the device back to its idle owner. A running job's lease is refused.",
)
@pass_obj
def leases(obj: Obj, as_json: bool, clear_identity: str | None) -> None:
    """Show which job holds which accelerator on this node (the lease ledger)."""
    if clear_identity:
        _clear(obj, clear_identity)
        return
    rows = _rows(obj)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"No accelerator is leased on this node ({obj.config.state_dir}).")
        return
    shown = [("IDENTITY", "JOB", "USER", "SINCE", "NODE OWNER", "STATE")]
    for row in rows:
        since = time.strftime("%H:%M:%S", time.localtime(row["start"])) if row.get("start") else "-"
        owners = ",".join(f"{n['path']}={n['uid']}" for n in row["nodes"]) or "-"
        shown.append((row["identity"], str(row["job_id"]), row["user"] or str(row["uid"]), since, owners, row["state"]))
    click.echo(table(shown), nl=False)


@main.command("udev-event")
def udev_event() -> None:
    """Handle a udev device event (reads ACTION, DEVPATH, DEVNAME...).

    The installed udev rules run the same work without the CLI's start-up:
    PREFIX/libexec/slurm-tpu/slurm-tpu-udev-event (see `slurm-tpu udev-rules`).
    This command is for rules that name the slurm-tpu console script, and for
    replaying an event by hand.
    """
    from ..hooks.udev_event import main as run_event

    status = run_event()
    if status:
        sys.exit(EXIT_ERROR)
