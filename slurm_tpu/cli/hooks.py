"""Commands around the lease ledger: leases (who holds what) and udev-event."""

from __future__ import annotations

import json
import sys
import time

import click

from . import EXIT_ERROR, Obj, main

pass_obj = click.make_pass_decorator(Obj)


def _rows(obj: Obj) -> list[dict]:
    import os

    from ..hooks.leasing import holder_alive
    from ..locks import node_inventory, ownership
    from ..locks.ledger import BadLease, Ledger

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
            row = {"identity": lease.identity, "job_id": lease.job_id, "uid": lease.uid,
                   "nodes": [{"path": n, "uid": s.uid if s else None, "mode": f"{s.mode:04o}" if s else None}
                             for n, s in zip(nodes, states)]}
            if isinstance(lease, BadLease):
                row.update(user="", start=None, state=f"bad: {lease.reason}")
            else:
                alive = holder_alive(lease)
                row.update(user=lease.user, start=lease.start, kind=lease.kind,
                           allocation=list(lease.allocation),
                           state="running" if alive else "stale (job gone; reclaimed by the next prolog)")
            rows.append(row)
    return rows


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the leases as JSON.")
@pass_obj
def leases(obj: Obj, as_json: bool) -> None:
    """Show which job holds which accelerator on this node (the lease ledger)."""
    rows = _rows(obj)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"No accelerator is leased on this node ({obj.config.state_dir}).")
        return
    table = [("IDENTITY", "JOB", "USER", "SINCE", "NODE OWNER", "STATE")]
    for row in rows:
        since = time.strftime("%H:%M:%S", time.localtime(row["start"])) if row.get("start") else "-"
        owners = ",".join(f"{n['path']}={n['uid']}" for n in row["nodes"]) or "-"
        table.append((row["identity"], str(row["job_id"]), row["user"] or str(row["uid"]), since, owners,
                      row["state"]))
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    for r in table:
        click.echo("  ".join(c.ljust(widths[i]) for i, c in enumerate(r[:5])) + "  " + r[5])


@main.command("udev-event")
def udev_event() -> None:
    """Handle a udev device event (run by udev; reads ACTION, DEVPATH, DEVNAME...)."""
    from ..hooks.udev_event import main as run_event

    status = run_event()
    if status:
        sys.exit(EXIT_ERROR)
