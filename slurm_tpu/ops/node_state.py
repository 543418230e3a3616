"""Read a node's slurm-tpu state for reporting: configured inventory, leases, audit log."""

from __future__ import annotations

import os

from ..access import statedir
from ..config import Config
from ..protocol import audit
from ..protocol.audit import LeaseSpan
from .accounting import DeviceFigure, energy_figures


def audit_history(paths: list[str]) -> tuple[list[LeaseSpan], list[DeviceFigure]]:
    """Lease spans and the Epilog's per-device energy figures from one or more audit logs (several
    nodes' logs may be combined), each log read once."""
    records: list[LeaseSpan] = []
    figures: list[DeviceFigure] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                events = list(audit.read_events(handle, path))
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise statedir.StateDirError(f"cannot read audit log {path}: {exc.strerror}", path) from exc
        records += audit.pair_leases(events).spans
        figures += energy_figures(events)
    return sorted(records, key=lambda r: (r.start, r.identity)), sorted(figures, key=lambda f: (f.end, f.identity))


def audit_records(paths: list[str]) -> list[LeaseSpan]:
    """Lease spans from one or more audit logs (several nodes' logs may be combined)."""
    return audit_history(paths)[0]


def default_audit_log(config: Config) -> str:
    return os.path.join(config.state_dir, audit.FILE)


def configured_document(config: Config) -> dict | None:
    """The node's configured inventory (state dir, `detect --json` shape); None if absent."""
    from ..access import node_inventory

    try:
        fd = statedir.open_dir(config.state_dir)
    except statedir.StateDirError:
        return None
    try:
        return node_inventory.load_document(fd)
    finally:
        os.close(fd)


def lease_holders(config: Config) -> tuple[dict, dict]:
    """(identity -> Holder of every lease, identity -> Holder of the leases a job holds now) from the
    ledger; ({}, {}) without a state directory. A lease being revoked or kept after its job is not held."""
    from ..access.ledger import HELD, Lease, Ledger
    from .metrics import Holder

    try:
        ledger = Ledger(config.state_dir, create=False)
    except statedir.StateDirError:
        return {}, {}
    with ledger:
        leases = [lease for lease in ledger.all() if isinstance(lease, Lease)]
    every = {lease.identity: Holder(lease.job_id, lease.uid) for lease in leases}
    return every, {lease.identity: every[lease.identity] for lease in leases if lease.phase == HELD}


def running_usage(config: Config, holders: dict) -> list:
    """The running jobs' usage records (JobUsage) for the devices they hold, as they are now."""
    from ..hooks.jobusage import peek
    from .metrics import JobUsage

    by_job: dict = {}
    for identity, holder in holders.items():
        by_job.setdefault(holder, []).append(identity)
    found = []
    for holder, identities in sorted(by_job.items(), key=lambda item: item[0].job_id):
        for identity, record in peek(config.state_dir, holder.job_id, holder.uid, identities).items():
            found.append(JobUsage(identity, holder, record.inferences, record.seconds))
    return found
