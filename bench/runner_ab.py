"""Shared by the runner benchmarks: time two batch runs A/B, interleaved, and report the ratio.

Rounds alternate the order (A B, B A, ...) so machine noise hits both; medians are
compared. Each run gets its own output file, checked by the caller's ``check``.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Callable

Run = Callable[[str], None]  # writes its results to the given path


def interleaved(
    rounds: int, work: Path, runs: dict[str, Run], items: int, check: Callable[[Path], None]
) -> dict[str, list[float]]:
    """Items per second of each named run, per round."""
    names = list(runs)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            out = work / f"{name}-{r}.jsonl"
            start = time.perf_counter()
            runs[name](str(out))
            rates[name].append(items / (time.perf_counter() - start))
            check(out)
    return rates


def report(rates: dict[str, list[float]], what: str, goal: float, **facts: object) -> None:
    """Print both medians, the rounds and runner / hand loop, with PASS/FAIL against ``goal``."""
    a, b = statistics.median(rates["runner"]), statistics.median(rates["hand"])
    ratio = a / b
    print(
        json.dumps(
            {
                **facts,
                "runner_per_s": round(a, 1),
                "hand_loop_per_s": round(b, 1),
                "ratio": round(ratio, 3),
                "runner_rounds": [round(x, 1) for x in rates["runner"]],
                "hand_rounds": [round(x, 1) for x in rates["hand"]],
            },
            indent=2,
        )
    )
    verdict = "PASS" if ratio >= goal else "FAIL"
    print(f"{verdict}: runner {what} is {ratio:.2f}x the hand-written loop (goal >= {goal})")
