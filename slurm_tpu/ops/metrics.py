"""Prometheus text-format metrics for a node's accelerators.

Gauges from the live hardware, the configured inventory and the ledger (present,
healthy, leased, temperature); counters from the audit log (jobs, lease time,
inferences and inference time per device, as reported by the runner).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from ..model import Inventory
from ..protocol.audit import LeaseSpan
from .health import find_problems


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@dataclass
class _Family:
    name: str
    kind: str
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, labels: dict[str, str], value: float) -> None:
        self.samples.append((labels, value))

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        for labels, value in self.samples:
            inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{self.name}{{{inner}}} {value:.17g}" if inner else f"{self.name} {value:.17g}")
        return "\n".join(lines)


def render_metrics(node: str, configured: Inventory, live: Inventory, leased: dict[str, int],
                   records: Iterable[LeaseSpan], now: float, edgetpu_version: str | None = None) -> str:
    """The exposition text. ``leased``: identity -> job id of current leases;
    ``edgetpu_version``: edgetpu_version() of the node's libedgetpu, if it has one."""
    present = _Family("slurm_tpu_device_present", "gauge", "1 if a configured accelerator is present on the node")
    healthy = _Family("slurm_tpu_device_healthy", "gauge", "1 if a configured accelerator is present, usable and "
                                                           "below its thermal trip point")
    leased_g = _Family("slurm_tpu_device_leased", "gauge", "1 if a job holds the accelerator's lease")
    temperature = _Family("slurm_tpu_device_temperature_celsius", "gauge", "accelerator temperature")
    jobs = _Family("slurm_tpu_device_jobs_total", "counter", "jobs that leased the accelerator")
    lease_seconds = _Family("slurm_tpu_device_lease_seconds_total", "counter", "seconds the accelerator was leased")
    inferences = _Family("slurm_tpu_device_inferences_total", "counter", "inferences run on the accelerator")
    inference_seconds = _Family("slurm_tpu_device_inference_seconds_total", "counter",
                                "seconds spent in inference calls on the accelerator")
    problems = {p.identity for p in find_problems([a.identity for a in configured], live)}
    identities = [a.identity for a in configured] + [a.identity for a in live.usable()
                                                     if configured.by_identity(a.identity) is None]
    totals: dict[str, list[float]] = {}
    for record in records:
        entry = totals.setdefault(record.identity, [0, 0.0, 0, 0.0])
        entry[0] += 1
        entry[1] += record.seconds_within(None, None, now)
        entry[2] += record.inferences
        entry[3] += record.inference_seconds
    for identity in identities:
        accelerator = live.by_identity(identity) or configured.by_identity(identity)
        assert accelerator is not None
        labels = {"node": node, "identity": identity, "kind": accelerator.kind, "model": accelerator.model}
        present.add(labels, 1.0 if live.by_identity(identity) is not None else 0.0)
        healthy.add(labels, 0.0 if identity in problems or configured.by_identity(identity) is None else 1.0)
        short = {"node": node, "identity": identity}
        leased_g.add(short, 1.0 if identity in leased else 0.0)
        live_one = live.by_identity(identity)
        if live_one is not None and live_one.details.temperature_c is not None:
            temperature.add(short, float(live_one.details.temperature_c))
        job_count, lease_s, count, infer_s = totals.get(identity, [0, 0.0, 0, 0.0])
        jobs.add(short, job_count)
        lease_seconds.add(short, lease_s)
        inferences.add(short, count)
        inference_seconds.add(short, infer_s)
    # The usual *_info pattern: a constant 1 whose labels carry the version.
    runtime = _Family("slurm_tpu_edgetpu_runtime_info", "gauge", "libedgetpu on the node, by its edgetpu_version()")
    if edgetpu_version:
        runtime.add({"node": node, "version": edgetpu_version}, 1.0)
    families = (present, healthy, leased_g, temperature, jobs, lease_seconds, inferences, inference_seconds)
    text = "\n".join(f.render() for f in families if f.samples or f.kind == "gauge")
    return text + ("\n" + runtime.render() if runtime.samples else "") + "\n"
