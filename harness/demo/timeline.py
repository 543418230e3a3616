"""The per-node timeline of a demo run and the properties it must have (pure).

Input: the run's job records (jobcomp), the leases (audit log) and what each node
has. TPU jobs are drawn on their device's lane for the time they held it (prolog to
epilog); jobs without a device on the node's CPU lanes, from Slurm's start and end
(whole seconds).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .records import JobRecord, Lease


@dataclass(frozen=True)
class Bar:
    job_id: int
    symbol: str
    start: float
    end: float


@dataclass
class Lane:
    node: str
    label: str  # a device identity, or "cpu"
    bars: list[Bar] = field(default_factory=list)


@dataclass(frozen=True)
class Check:
    ok: bool
    text: str


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """Most intervals open at once; [start, end): one ending when another starts is no overlap."""
    pairs = list(intervals)
    points = sorted([(e, -1) for s, e in pairs] + [(s, 1) for s, e in pairs])
    best = current = 0
    for _, delta in points:
        current += delta
        best = max(best, current)
    return best


def _lease_end(lease: Lease, fallback: float) -> float:
    return lease.end if lease.end is not None else fallback


def build_lanes(
    jobs: Sequence[JobRecord],
    leases: Sequence[Lease],
    devices: Mapping[str, Sequence[str]],
    symbols: Mapping[int, str],
    step: float,
) -> list[Lane]:
    """One lane per device, then as many CPU lanes per node as its device-less jobs need."""
    now = max([j.end or 0.0 for j in jobs] + [lease.start for lease in leases] + [0.0])
    leased = {lease.job_id for lease in leases}
    lanes: list[Lane] = []
    for node, identities in devices.items():
        for identity in identities:
            lane = Lane(node, identity)
            lane.bars = [
                Bar(lease.job_id, symbols.get(lease.job_id, "?"), lease.start, _lease_end(lease, now))
                for lease in leases
                if lease.node == node and lease.identity == identity and lease.job_id in symbols
            ]
            lanes.append(lane)
        cpu_lanes: list[Lane] = []
        plain = sorted(
            (j for j in jobs if j.node == node and j.job_id not in leased and j.start is not None),
            key=lambda j: j.start,
        )
        for job in plain:
            end = max(job.end or job.start, job.start + step)  # whole seconds: draw at least one column
            bar = Bar(job.job_id, symbols.get(job.job_id, "?"), job.start, end)
            free = next((ln for ln in cpu_lanes if ln.bars[-1].end <= bar.start), None)
            if free is None:
                free = Lane(node, "cpu")
                cpu_lanes.append(free)
            free.bars.append(bar)
        lanes += cpu_lanes
    return lanes


def nice_step(span: float, columns: int) -> float:
    """Seconds per column: the smallest of 0.25, 0.5, 1, 2, 5, 10... that fits."""
    for step in (0.25, 0.5, 1, 2, 5, 10, 15, 30, 60):
        if span / step <= columns:
            return step
    return math.ceil(span / columns / 60) * 60


def render(lanes: Sequence[Lane], t0: float, step: float, columns: int) -> list[str]:
    """The chart: node, lane label, then one character per ``step`` seconds."""
    width_node = max([len(lane.node) for lane in lanes] + [4])
    width_label = max([len(lane.label) for lane in lanes] + [3])
    ruler = [" "] * columns
    for col in range(0, columns, 10):
        mark = f"|{col * step:g}s"
        ruler[col : col + len(mark)] = list(mark)
    lines = [f"{'':{width_node}}  {'':{width_label}}  {''.join(ruler[:columns]).rstrip()}"]
    previous = None
    for lane in lanes:
        cells = ["."] * columns
        for bar in lane.bars:
            first = max(0, int((bar.start - t0) / step))
            last = min(columns, max(first + 1, math.ceil((bar.end - t0) / step)))
            for col in range(first, last):
                cells[col] = bar.symbol
        node = lane.node if lane.node != previous else ""
        previous = lane.node
        lines.append(f"{node:{width_node}}  {lane.label:{width_label}}  {''.join(cells)}")
    return lines


def check_run(
    tpu_jobs: Sequence[JobRecord],
    plain_jobs: Sequence[JobRecord],
    leases: Sequence[Lease],
    devices: Mapping[str, Sequence[str]],
) -> list[Check]:
    """The seeds' experiment, as properties of the records.

    ``devices`` maps every node to its Edge TPU identities (empty for the others).
    """
    tpu_nodes = {n for n, ids in devices.items() if ids}
    checks = []
    nodes_used = sorted({j.node for j in tpu_jobs})
    checks.append(
        Check(all(n in tpu_nodes for n in nodes_used), f"TPU jobs ran only on TPU nodes ({', '.join(nodes_used)})")
    )
    by_job: dict[int, list[Lease]] = {}
    for lease in leases:
        by_job.setdefault(lease.job_id, []).append(lease)
    own = [
        j
        for j in tpu_jobs
        if len(by_job.get(j.job_id, [])) == 1
        and by_job[j.job_id][0].node == j.node
        and by_job[j.job_id][0].identity in devices.get(j.node, ())
    ]
    checks.append(
        Check(
            len(own) == len(tpu_jobs),
            f"each TPU job held exactly one Edge TPU of its node ({len(own)}/{len(tpu_jobs)})",
        )
    )
    now = max([lease.start for lease in leases] + [0.0]) + 1
    per_node = []
    ok = True
    for node in sorted(tpu_nodes):
        count = len(devices[node])
        peak = max_overlap((lease.start, _lease_end(lease, now)) for lease in leases if lease.node == node)
        ok &= peak <= count
        per_node.append(f"{node} {peak}/{count}")
    checks.append(Check(ok, "never more TPU jobs at once than the node has TPUs (peak: " + ", ".join(per_node) + ")"))
    shared = [
        i
        for i in {(lease.node, lease.identity) for lease in leases}
        if max_overlap((lease.start, _lease_end(lease, now)) for lease in leases if (lease.node, lease.identity) == i)
        > 1
    ]
    checks.append(
        Check(
            not shared,
            "no Edge TPU was ever held by two jobs at once" + (f" (shared: {sorted(shared)})" if shared else ""),
        )
    )
    # Where plain jobs land is Slurm's choice (LLN spreads them when they overlap, but a
    # job that finishes before the next starts may free the same node): not a property
    # to check. What slurm-tpu promises is that they never hold an accelerator.
    plain_ids = {j.job_id for j in plain_jobs}
    grabbed = sorted({lease.job_id for lease in leases if lease.job_id in plain_ids})
    spread = sorted({j.node for j in plain_jobs})
    checks.append(
        Check(
            not grabbed,
            "plain jobs held no Edge TPU"
            + (f" (jobs {grabbed} did)" if grabbed else "")
            + f"; ran on {', '.join(spread)}",
        )
    )
    return checks
