"""The holder scan's cost per fd: statx(AT_STATX_DONT_SYNC) (what it does) against stat() (what it did).

The scan looks at every open fd on the node. It used to stat() each one through
/proc/PID/fd/N, which waits on a stalled FUSE server; it now asks statx() for what the
kernel already knows. This measures whether that costs time: DECOYS processes each hold
FDS duplicates of /dev/null (a decoy flood, the scan's worst case), and the same scan runs
with each look, interleaved, REPEAT pairs; it prints the medians and ratio = statx / stat.

    sudo .venv/bin/python bench/bench_holder_scan.py [DECOYS FDS REPEAT]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from slurm_tpu.access import processes

HOLD = "import os, sys, time\nfds = [os.dup(0) for _ in range(int(sys.argv[1]))]\nprint(flush=True)\ntime.sleep(3600)\n"


class _StatLook(processes._Devices):
    """The look as it was: stat() through the magic link (the class's own fallback, without statx)."""

    def __init__(self, rdevs) -> None:
        super().__init__(rdevs)
        self._statx = None


def scan_seconds(look: type) -> float:
    real = processes._Devices
    processes._Devices = look  # type: ignore[misc]
    try:
        started = time.perf_counter()
        found = processes.scan_holders([os.makedev(240, 250)], set(), 600.0)
        elapsed = time.perf_counter() - started
    finally:
        processes._Devices = real  # type: ignore[misc]
    assert found.complete and not found.holders
    return elapsed


def main() -> int:
    decoys, fds, repeat = (int(a) for a in sys.argv[1:4]) if len(sys.argv) > 3 else (20, 10000, 5)
    null = open(os.devnull)
    holders = [
        subprocess.Popen([sys.executable, "-c", HOLD, str(fds)], stdin=null, stdout=subprocess.PIPE, text=True)
        for _ in range(decoys)
    ]
    try:
        for holder in holders:
            assert holder.stdout is not None
            holder.stdout.readline()  # holds its fds now
        times: dict[str, list[float]] = {"stat": [], "statx": []}
        for _ in range(repeat):
            times["stat"].append(scan_seconds(_StatLook))
            times["statx"].append(scan_seconds(processes._Devices))
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
    medians = {name: statistics.median(values) for name, values in times.items()}
    total_fds = decoys * fds
    print(
        json.dumps(
            {
                "fds": total_fds,
                "median_s": {name: round(value, 3) for name, value in medians.items()},
                "us_per_fd": {name: round(value / total_fds * 1e6, 2) for name, value in medians.items()},
                "ratio": round(medians["statx"] / medians["stat"], 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
