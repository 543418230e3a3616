#!/usr/bin/env python3
"""Start-up cost of the root hooks' modules: this checkout versus a baseline checkout.

Each sample is a fresh ``python3 -I -S`` (as the hooks run) importing the modules
the prolog and epilog load on a job with leases (ledger, leasing, usage box, env
file, and through them the lease and audit formats), then checking that none of
json, re, typing or dataclasses came with them. Runs alternate between the two
checkouts (A/B interleaved, bytecode warmed first), so machine noise hits both
alike.

    python3 bench/bench_hook_imports.py --baseline /path/to/a/checkout/of/main [--runs 40]

Prints one JSON document: median milliseconds per start for each, and ``ratio``
= this checkout / baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

HOOK_MODULES = (
    "slurm_tpu.access.ledger",
    "slurm_tpu.hooks.leasing",
    "slurm_tpu.hooks.jobusage",
    "slurm_tpu.hooks.prolog",
    "slurm_tpu.hooks.epilog",
)
CODE = (
    "import sys; sys.path.insert(0, '.')\n"
    + "".join(f"import {name}\n" for name in HOOK_MODULES)
    + "heavy = [m for m in ('json', 're', 'typing', 'dataclasses') if m in sys.modules]\n"
    + "assert not heavy, heavy\n"
)


def start(checkout: str) -> float:
    began = time.perf_counter()
    subprocess.run(["python3", "-I", "-S", "-c", CODE], cwd=checkout, check=True)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", required=True, help="a checkout to compare with (e.g. a worktree of main)")
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    checkouts = {"this": here, "baseline": os.path.abspath(args.baseline)}
    for path in checkouts.values():
        start(path)  # compile and cache bytecode
    times: dict[str, list[float]] = {name: [] for name in checkouts}
    for _ in range(args.runs):
        for name, path in checkouts.items():
            times[name].append(start(path))
    medians = {name: round(statistics.median(values) * 1000, 3) for name, values in times.items()}
    ratio = round(medians["this"] / medians["baseline"], 3)
    print(json.dumps({"median_ms": medians, "runs": args.runs, "ratio": ratio}))


if __name__ == "__main__":
    main()
