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
    ranges: list[list[int]] = []  # [first, last]
    for value in sorted(set(values)):
        if ranges and value == ranges[-1][1] + 1:
            ranges[-1][1] = value
        else:
            ranges.append([value, value])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in ranges)


def core_indices(topology: Mapping[int, tuple[int, int]]) -> dict[int, int]:
    """CPU id -> Slurm core index, from each CPU's (package id, core id).

    Slurm numbers cores 0..N-1 socket by socket, in core-id order (as hwloc's logical indices
    do), SMT siblings sharing one; Linux core ids may have gaps, so they are ranked.
    """
    ranked = {pair: index for index, pair in enumerate(sorted(set(topology.values())))}
    return {cpu: ranked[pair] for cpu, pair in topology.items()}
