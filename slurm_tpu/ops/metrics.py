"""Prometheus metrics for a node's accelerators, labelled with the job that holds each, dcgm-exporter's way.

Each scrape of :class:`NodeCollector` takes a :class:`NodeSnapshot` and yields the families
docs/accounting.md lists. While a job holds a device, its state series carry ``hpc_job`` and
``hpc_user``, as dcgm-exporter's HPC job mapping does; the lifetime device counters carry
``node, identity`` only: with the current job's labels, a sum over series would count the
whole history once per job.

On a node that shares Edge TPUs (issue 32: TPU shards), the node's broker answers ``stats``
(:func:`broker_view`): each running shard job's figures as counters labelled ``hpc_job``/``hpc_user``
(the broker's, root's: never what a job reports), each shared device's utilization and busy
seconds, and ``slurm_tpu_broker_up``. A broker that does not answer leaves those series out and
says why in that family's HELP line: a scrape never fails for it.

Energy (issue 33), the same way: while a job holds a device, its energy on it so far (its start file
computed as its Epilog will, with now as the end: :func:`~slurm_tpu.ops.node_state.running_energy`)
is the counter ``slurm_tpu_job_energy_joules_total`` with ``hpc_job``/``hpc_user`` and ``method``
(never a figure without how it was obtained; one that cannot be computed has no sample); the series
ends with the job (on a leased device, with its lease: from its release on, as the state series).
Ended jobs' figures (the Epilog's ``energy`` audit events) are only in the lifetime
``slurm_tpu_device_energy_joules_total`` (node, identity, method), and in ``slurm-tpu report``.

Label values are identities, kinds and models from detection, numbers, and user
names from the password database: nothing a job chooses (its name, comment or
environment) becomes a label. ``prometheus_client`` escapes every value anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Callable

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ..hardware import Inventory
from ..promtext import add, counter, gauge
from ..protocol.audit import LeaseSpan
from .accounting import DeviceFigure, user_name
from .health_policy import find_problems

JOB_LABEL, USER_LABEL = "hpc_job", "hpc_user"  # dcgm-exporter's hpc_job, and its like for the user
METHOD_LABEL = "method"  # protocol/energy.py METHODS


@dataclass(frozen=True)
class Holder:
    """The job that holds a device now."""

    job_id: int
    uid: int

    def labels(self) -> dict[str, str]:
        return {JOB_LABEL: str(self.job_id), USER_LABEL: user_name(self.uid)}


@dataclass(frozen=True)
class JobUsage:
    """A running job's own totals on one device (its usage record)."""

    identity: str
    holder: Holder
    inferences: int
    seconds: float


@dataclass(frozen=True)
class ShardJob:
    """A running job's figures on the node's shared TPUs, as its broker counts them."""

    holder: Holder
    shares: int
    figures: Mapping[str, float]  # protocol/broker_wire.py FIGURES


@dataclass(frozen=True)
class BrokerView:
    """What the node's TPU broker answered to ``stats``; ``why`` (not '') when it did not answer."""

    jobs: tuple[ShardJob, ...] = ()
    devices: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # identity -> busy_s, utilization...
    why: str = ""


@dataclass
class NodeSnapshot:
    """What one scrape reports. ``leased``: identity -> holder of every lease on the node;
    ``holders``: the leases a job holds now (phase held); ``edgetpu_version``: edgetpu_version() of
    the node's libedgetpu, if it has one; ``usage``: the running jobs' usage records."""

    node: str
    configured: Inventory
    live: Inventory
    leased: Mapping[str, Holder]
    holders: Mapping[str, Holder]
    records: Iterable[LeaseSpan]
    now: float
    edgetpu_version: str | None
    usage: Iterable[JobUsage]
    broker: BrokerView | None = None  # None: the node shares no TPU (no broker series at all)
    energy: Iterable[DeviceFigure] = ()  # the ended jobs' per-device figures (the audit log's energy events)
    running_energy: Iterable[DeviceFigure] = ()  # the running jobs' figures so far (node_state.running_energy)


def families(snap: NodeSnapshot) -> list[Metric]:
    """The metric families of one snapshot."""
    present = gauge("slurm_tpu_device_present", "1 if a configured accelerator is present on the node")
    healthy = gauge(
        "slurm_tpu_device_healthy", "1 if a configured accelerator is present, usable and below its thermal trip point"
    )
    leased_g = gauge("slurm_tpu_device_leased", "1 if a job holds the accelerator's lease")
    temperature = gauge("slurm_tpu_device_temperature_celsius", "accelerator temperature")
    lifetime = [  # filled in the order of the audit log's totals below
        counter("slurm_tpu_device_jobs", "jobs that leased the accelerator"),
        counter("slurm_tpu_device_lease_seconds", "seconds the accelerator was leased"),
        counter("slurm_tpu_device_inferences", "inferences run on the accelerator"),
        counter("slurm_tpu_device_inference_seconds", "seconds spent in inference calls on the accelerator"),
    ]
    job_inferences = counter(
        "slurm_tpu_job_inferences", "inferences the job holding the accelerator has run on it so far (its usage record)"
    )
    job_seconds = counter(
        "slurm_tpu_job_inference_seconds",
        "seconds the job holding the accelerator has spent in inference calls on it so far",
    )
    # The usual *_info pattern: a constant 1 whose labels carry the version.
    runtime = gauge("slurm_tpu_edgetpu_runtime_info", "libedgetpu on the node, by its edgetpu_version()")

    configured, live, node, holders = snap.configured, snap.live, snap.node, snap.holders
    problems = {p.identity for p in find_problems([a.identity for a in configured], live)}
    identities = dict.fromkeys([a.identity for a in configured] + [a.identity for a in live.usable()])
    totals: dict[str, list[float]] = {}
    for record in snap.records:
        added = (1, record.seconds_within(None, None, snap.now), record.inferences, record.inference_seconds)
        totals[record.identity] = [a + b for a, b in zip(totals.get(record.identity, [0, 0.0, 0, 0.0]), added)]
    for identity in identities:
        here = live.by_identity(identity)
        accelerator = here or configured.by_identity(identity)
        assert accelerator is not None
        holder = holders.get(identity)
        job = holder.labels() if holder is not None else {}
        short = {"node": node, "identity": identity}
        labels = {**short, "kind": accelerator.kind, "model": accelerator.model, **job}
        add(present, labels, 1.0 if here is not None else 0.0)
        add(healthy, labels, 0.0 if identity in problems or configured.by_identity(identity) is None else 1.0)
        add(leased_g, {**short, **job}, 1.0 if identity in snap.leased else 0.0)
        if here is not None and here.details.temperature_c is not None:
            add(temperature, {**short, **job}, float(here.details.temperature_c))
        for family, value in zip(lifetime, totals.get(identity, [0, 0.0, 0, 0.0])):
            add(family, short, value)
    for usage in snap.usage:
        if holders.get(usage.identity) != usage.holder:
            continue  # not the device's holder now (a record read as its job ended)
        labels = {"node": node, "identity": usage.identity, **usage.holder.labels()}
        add(job_inferences, labels, usage.inferences)
        add(job_seconds, labels, usage.seconds)
    if snap.edgetpu_version:
        add(runtime, {"node": node, "version": snap.edgetpu_version}, 1.0)
    sampled = [f for f in (job_inferences, job_seconds, runtime) if f.samples]
    broker = broker_families(node, snap.broker) if snap.broker is not None else []
    return [present, healthy, leased_g, temperature, *lifetime, *sampled, *broker, *energy_families(node, snap)]


def energy_families(node: str, snap: NodeSnapshot) -> list[Metric]:
    """Each running job's energy so far per device it holds (labelled with the job, its user and the
    method), and each device's lifetime energy per method from the jobs that ended."""
    per_job = counter(
        "slurm_tpu_job_energy_joules",
        "energy the job holding the accelerator has used on it so far (computed as its Epilog will); "
        "method: measured (the device's energy counter), integrated (its polled power), estimated "
        "(datasheet or calibrated idle/active watts x allocated and busy time), self-reported (the same "
        "with the job's own busy time, bounded by its allocation); a figure that cannot be had has no sample",
    )
    for figure in snap.running_energy:
        holder = Holder(figure.job_id, figure.uid)
        if figure.joules is None or (figure.identity in snap.leased and snap.holders.get(figure.identity) != holder):
            continue  # a leased device the job no longer holds (its Epilog is releasing it): no job label on it
        labels = {"node": node, "identity": figure.identity, **holder.labels()}
        add(per_job, {**labels, METHOD_LABEL: figure.method}, figure.joules)
    lifetime = counter("slurm_tpu_device_energy_joules", "energy of every job that ended on the accelerator, by method")
    totals: dict[tuple[str, str], float] = {}
    for figure in snap.energy:
        if figure.joules is not None:
            key = (figure.identity, figure.method)
            totals[key] = totals.get(key, 0.0) + figure.joules
    for (identity, method), joules in sorted(totals.items()):
        add(lifetime, {"node": node, "identity": identity, METHOD_LABEL: method}, joules)
    return [family for family in (per_job, lifetime) if family.samples]


def broker_families(node: str, view: BrokerView) -> list[Metric]:
    """The broker's families: up, and (when it answered) its jobs' and shared devices' figures."""
    from ..protocol.broker_wire import BUSY_MS, INFERENCES, LOADS, SWAPS, WAIT_MS

    if view.why:  # the HELP line is the one comment saying why the broker's series are missing
        up = gauge("slurm_tpu_broker_up", f"1 if the node's TPU broker answered; 0 now: {view.why}")
        add(up, {"node": node}, 0.0)
        return [up]
    up = gauge("slurm_tpu_broker_up", "1 if the node's TPU broker answered")
    add(up, {"node": node}, 1.0)
    shares = gauge("slurm_tpu_job_shards", "TPU shares the job holds on the node")
    per_job = [  # (family, figure, scale)
        (counter("slurm_tpu_job_shard_busy_seconds", "device time the broker ran the job's inferences"), BUSY_MS, 1e-3),
        (counter("slurm_tpu_job_shard_inferences", "inferences the broker ran for the job"), INFERENCES, 1.0),
        (counter("slurm_tpu_job_shard_model_swaps", "model swaps the job's inferences caused"), SWAPS, 1.0),
        (counter("slurm_tpu_job_shard_queue_wait_seconds", "time the job's requests waited"), WAIT_MS, 1e-3),
        (counter("slurm_tpu_job_shard_model_loads", "models the job loaded into the broker"), LOADS, 1.0),
    ]
    for job in view.jobs:
        labels = {"node": node, **job.holder.labels()}
        add(shares, labels, job.shares)
        for family, figure, scale in per_job:
            add(family, labels, float(job.figures.get(figure, 0)) * scale)
    utilization = gauge(
        "slurm_tpu_device_utilization", "fraction of recent time the shared TPU ran inferences (the broker's)"
    )
    busy = counter("slurm_tpu_device_busy_seconds", "seconds the shared TPU ran inferences since its broker started")
    swaps = counter("slurm_tpu_device_model_swaps", "model swaps on the shared TPU since its broker started")
    for identity, figures in sorted(view.devices.items()):
        labels = {"node": node, "identity": identity}
        add(utilization, labels, float(figures.get("utilization", 0.0)))
        add(busy, labels, float(figures.get("busy_s", 0.0)))
        add(swaps, labels, float(figures.get("model_swaps", 0)))
    return [up, shares, *(family for family, _, _ in per_job), utilization, busy, swaps]


def broker_view(state_dir: str, shares_here: bool) -> BrokerView | None:
    """The node's broker's ``stats``, with each job's user from its grant; None when the node shares
    no TPU and runs no broker (``shares_here`` False and no control socket)."""
    import os

    from ..access.ledger import Ledger
    from ..access.statedir import StateDirError
    from ..hooks import shards
    from ..protocol import FormatError, broker_wire

    if not shares_here and not os.path.exists(broker_wire.control_path(state_dir)):
        return None
    try:
        answer = shards.ask(state_dir, {"op": "stats"})
    except shards.BrokerUnavailable as exc:
        return BrokerView(why=f"{exc} (systemctl status slurm-tpu-broker)")
    jobs, devices = answer.get("jobs"), answer.get("devices")
    found = []
    try:
        ledger = Ledger(state_dir, create=False)
    except StateDirError as exc:
        return BrokerView(why=str(exc))
    with ledger:
        for key, figures in sorted((jobs if isinstance(jobs, dict) else {}).items()):
            grant = shards.read_grant(ledger, int(key)) if str(key).isdigit() else None
            if grant is None:
                continue  # no grant: no job of this node's (its epilog ran, or the broker is confused)
            try:
                found.append(
                    ShardJob(Holder(grant[0], grant[1]), grant[3], broker_wire.decode_figures(figures, f"job {key}"))
                )
            except FormatError:
                continue
    shown = {}
    for identity, figures in (devices if isinstance(devices, dict) else {}).items():
        if isinstance(identity, str) and identity.isprintable() and isinstance(figures, dict):
            shown[identity] = {
                k: float(v)
                for k, v in figures.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
            }
    return BrokerView(tuple(found), shown)


class NodeCollector(Collector):
    """A prometheus_client collector: ``snapshot()`` is taken afresh at every collection."""

    def __init__(self, snapshot: Callable[[], NodeSnapshot]):
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        return families(self._snapshot())
