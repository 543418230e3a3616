"""Pure parsers of Slurm command output, tested on captured text."""

from __future__ import annotations


def parse_key_values(line: str) -> dict[str, str]:
    """``A=1 B=two`` -> {"A": "1", "B": "two"} (tokens without '=' are skipped)."""
    result = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            result[key] = value
    return result


def parse_slurmd_c(text: str) -> dict[str, str]:
    """The hardware line of ``slurmd -C`` (NodeName=... CPUs=... RealMemory=...)."""
    for line in text.splitlines():
        if line.startswith("NodeName="):
            return parse_key_values(line)
    return {}
