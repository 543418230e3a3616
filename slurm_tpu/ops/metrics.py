"""Prometheus metrics for a node's accelerators, labelled with the job that holds each, dcgm-exporter's way.

Each scrape of :class:`NodeCollector` takes a :class:`NodeSnapshot` and yields the families
docs/accounting.md lists. While a job holds a device, its state series carry ``hpc_job`` and
``hpc_user``, as dcgm-exporter's HPC job mapping does; the lifetime device counters carry
``node, identity`` only: with the current job's labels, a sum over series would count the
whole history once per job.

Label values are identities, kinds and models from detection, numbers, and user
names from the password database: nothing a job chooses (its name, comment or
environment) becomes a label. ``prometheus_client`` escapes every value anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Callable

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ..hardware import Inventory
from ..promtext import add, counter, gauge
from ..protocol.audit import LeaseSpan
from .accounting import user_name
from .health_policy import find_problems

JOB_LABEL, USER_LABEL = "hpc_job", "hpc_user"  # dcgm-exporter's hpc_job, and its like for the user


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
    return [present, healthy, leased_g, temperature, *lifetime, *sampled]


class NodeCollector(Collector):
    """A prometheus_client collector: ``snapshot()`` is taken afresh at every collection."""

    def __init__(self, snapshot: Callable[[], NodeSnapshot]):
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        return families(self._snapshot())
