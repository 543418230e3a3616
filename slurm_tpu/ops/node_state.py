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


def running_energy(config: Config, usage: list, broker=None) -> list[DeviceFigure]:
    """Each running job's energy so far on each device it holds here: its start file computed as its
    Epilog would, with now as the end (energy/figures.py figures_so_far: no file is removed or changed),
    with the busy time its Epilog would use (``usage``: the running jobs' JobUsage, their own; ``broker``:
    the BrokerView, root's, for shard jobs). Only figures that have joules, of jobs whose user the start
    file names: a figure that cannot be computed is left out, never shown wrong. [] with energy off or
    where this process cannot read the state directory (not root); NVML is opened only for a GPU that
    needs it, and a library this process cannot open leaves that GPU's figure out."""
    import time

    if not config.energy.enabled:
        return []
    from ..energy import figures
    from ..protocol.broker_wire import BUSY_MS

    reported: dict[int, dict[str, float]] = {}
    for record in usage:
        reported.setdefault(record.holder.job_id, {})[record.identity] = record.seconds
    broker_busy = {job.holder.job_id: job.figures.get(BUSY_MS) for job in (broker.jobs if broker else ())}

    def busy_of(start):
        return figures.busy_times(start, reported.get(start.job_id, {}), broker_busy.get(start.job_id))

    try:
        fd = statedir.open_dir(config.state_dir)
    except (OSError, statedir.StateDirError):
        return []
    try:
        found = figures.figures_so_far(
            fd, config.energy.nvml_library, busy_of, config.sysfs_root, poll_s=config.energy.poll_seconds
        )
    except OSError:  # the energy directory itself unreadable (its files' problems are passed over): no figures
        return []
    finally:
        os.close(fd)
    now = time.time()
    return [
        DeviceFigure(figure.identity, start.job_id, start.uid, now, figure.joules, figure.method, figure.seconds)
        for start, computed in found
        if start.uid >= 0
        for figure in computed
        if figure.joules is not None
    ]
