"""Linux CPU lists (``0-3,8,10-11``) and Slurm core indices."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def parse_cpu_list(text: str | None) -> list[int]:
    """``0-3,8`` -> [0, 1, 2, 3, 8]; '' or None -> []; raises ValueError on garbage."""
    cpus: set[int] = set()
    for part in (text or "").strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return sorted(cpus)


def format_cpu_list(values: Iterable[int]) -> str:
    """[0, 1, 2, 3, 8] -> ``0-3,8``."""
    ordered = sorted(set(values))
    ranges: list[str] = []
    start = previous = None
    values_then_end: list[int | None] = [*ordered, None]  # None: the sentinel that ends the last range
    for value in values_then_end:
        if value is not None and previous is not None and value == previous + 1:
            previous = value
            continue
        if start is not None:
            ranges.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = value
    return ",".join(ranges)


def core_indices(topology: Mapping[int, tuple[int, int]]) -> dict[int, int]:
    """CPU id -> Slurm core index, from each CPU's (package id, core id).

    Slurm numbers cores 0..N-1 socket by socket, in core-id order (as hwloc's
    logical indices do); SMT siblings share their core's index. Linux core ids
    may have gaps, so they are ranked, not used directly.
    """
    ranked = {pair: index for index, pair in enumerate(sorted(set(topology.values())))}
    return {cpu: ranked[pair] for cpu, pair in topology.items()}
