"""Read a node's slurm-tpu state for reporting: configured inventory, leases, audit log."""

from __future__ import annotations

import os

from ..config import Config
from ..locks import statedir
from ..protocol import audit
from ..protocol.audit import LeaseSpan


def audit_records(paths: list[str]) -> list[LeaseSpan]:
    """Lease spans from one or more audit logs (several nodes' logs may be combined)."""
    records: list[LeaseSpan] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                records += audit.pair_leases(audit.read_events(handle, path)).spans
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise statedir.StateDirError(f"cannot read audit log {path}: {exc.strerror}", path) from exc
    return sorted(records, key=lambda r: (r.start, r.identity))


def default_audit_log(config: Config) -> str:
    return os.path.join(config.state_dir, audit.FILE)


def configured_document(config: Config) -> dict | None:
    """The node's configured inventory (state dir, `detect --json` shape); None if absent."""
    from ..locks import node_inventory

    try:
        fd = statedir.open_dir(config.state_dir)
    except statedir.StateDirError:
        return None
    try:
        return node_inventory.load_document(fd)
    finally:
        os.close(fd)


def current_leases(config: Config) -> dict[str, int]:
    """identity -> job id of the leases held now ({} without a state directory)."""
    from ..locks.ledger import Lease, Ledger

    try:
        ledger = Ledger(config.state_dir, create=False)
    except statedir.StateDirError:
        return {}
    try:
        return {lease.identity: lease.job_id for lease in ledger.all() if isinstance(lease, Lease)}
    finally:
        ledger.close()
