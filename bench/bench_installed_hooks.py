#!/usr/bin/env python3
"""Start-up of an installed Python hook versus the checkout's, and versus a site-packages scan.

Each variant runs the epilog entry point's own lines up to ``main()`` (interpreter
start, the ``_ROOT`` lookup, importing ``slurm_tpu.hooks.epilog``) in a fresh
process, interleaved A/B/C per round; medians are reported.

- ``checkout``: the shipped ``epilog/slurm-tpu-epilog`` of this checkout (``-I -S``);
- ``installed``: the same file as ``slurm-tpu install`` writes it (this Python, the
  package's directory written in, ``-I -S``);
- ``site_scan``: the installed file without the package's directory, so it falls
  back to ``site.main()`` (what an entry point that only knew site-packages would pay).

Run it with the Python of the installation to measure (a venv the wheel was installed
into shows the site-packages case; this checkout's venv the editable one):

    /tmp/venv/bin/python bench/bench_installed_hooks.py [--rounds 40]

Prints one JSON document; ``ratio_installed`` = installed / checkout (1.0 means the
install costs nothing), ``ratio_site_scan`` = site_scan / checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def entry_head(text: str, site_scan: bool = False) -> str:
    """The entry point up to ``main()``: everything before its ``try:``, then the import itself
    (after ``site.main()``, as its fallback does, with ``site_scan``)."""
    fallback = "import site\nsite.main()\n" if site_scan else ""
    return text.split("try:")[0] + fallback + "from slurm_tpu.hooks.epilog import main\n"


def timed(python: str, code: str) -> float:
    start = time.perf_counter()
    subprocess.run([python, "-I", "-S", "-c", code], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    from slurm_tpu.defaults import CONFIG_PATH as DEFAULT_PATH
    from slurm_tpu.ops import node_files
    from slurm_tpu.ops.install import installed_hook_text

    with open(os.path.join(REPO, "epilog", "slurm-tpu-epilog"), encoding="utf-8") as handle:
        shipped = handle.read()
    python = node_files.interpreter()
    installed = installed_hook_text(shipped, "slurm-tpu-epilog", python, node_files.package_root(), DEFAULT_PATH)
    site_scan = installed_hook_text(shipped, "slurm-tpu-epilog", python, "/nonexistent", DEFAULT_PATH)
    # The checkout's hook finds the package next to its own directory: run it from there.
    checkout = shipped.replace("os.path.realpath(__file__)", repr(os.path.join(REPO, "epilog", "x")))
    variants = {
        "checkout": entry_head(checkout),
        "installed": entry_head(installed),
        "site_scan": entry_head(site_scan, site_scan=True),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for code in variants.values():  # warm the page cache
        timed(sys.executable, code)
    for _ in range(args.rounds):
        for name, code in variants.items():
            samples[name].append(timed(sys.executable, code))
    medians = {name: statistics.median(values) * 1000 for name, values in samples.items()}
    print(
        json.dumps(
            {
                "python": python,
                "package_root": node_files.package_root(),
                "rounds": args.rounds,
                "median_ms": {k: round(v, 2) for k, v in medians.items()},
                "ratio_installed": round(medians["installed"] / medians["checkout"], 3),
                "ratio_site_scan": round(medians["site_scan"] / medians["checkout"], 3),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
