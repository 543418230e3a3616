#!/usr/bin/env python3
"""What a job's energy reads cost its Prolog and Epilog, in process (energy/figures.py), per device kind.

The Prolog's part is :func:`start_readings` and the start file's write; the Epilog's is the start
file's read and removal and :func:`device_figures`. GPUs are read through the NVML double
(tests/nvml_double): its load and init are a stand-in for the real library's (a real ``nvmlInit``
enumerates the driver's GPUs and takes far longer), so the GPU figures are the suite's own cost
around NVML, not NVML's. A GPU's reads run in a forked child with a deadline (energy/guard.py):
``guard_fork_only`` is that fork's own cost, reading nothing. Prints one JSON document of median
milliseconds.

    sudo .venv/bin/python bench/bench_energy_reads.py [--runs 200]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

import nvml_double  # noqa: E402
from slurm_tpu.access import statedir  # noqa: E402
from slurm_tpu.energy import figures  # noqa: E402
from slurm_tpu.protocol.energy import StartDevice  # noqa: E402

GPUS = ("00000000:41:00.0", "00000000:81:00.0")
CASES = {
    "edgetpu_whole": [StartDevice("usb-2-1.3", "edgetpu", "model:0.5:2", None, None)],
    "edgetpu_shard": [StartDevice("usb-2-1.3", "edgetpu", "model:0.5:2", None, (2, 4))],
    "gpu_one": [StartDevice("pci-0000:41:00.0", "gpu", f"nvml-energy:{GPUS[0]}", None, None)],
    "gpu_two": [StartDevice(f"pci-{bus[4:]}", "gpu", f"nvml-energy:{bus}", None, None) for bus in GPUS],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_energy_reads: must run as root (the state directory is root's)", file=sys.stderr)
        return 2
    base = tempfile.mkdtemp(prefix="slurm-tpu-energy-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.chmod(base, 0o755)
    library = str(nvml_double.build(os.path.join(base, "nvml")))
    os.environ[nvml_double.STATE_VARIABLE] = os.path.join(base, "gpus")
    for bus in GPUS:
        nvml_double.set_gpu(os.path.join(base, "gpus"), bus, energy_mj=10**9, power_mw=200_000)
    state = statedir.open_dir(os.path.join(base, "state"), create=True)
    report: dict[str, dict[str, float]] = {}
    try:
        for case, devices in CASES.items():
            prolog, epilog = [], []
            for job in range(1, args.runs + 1):
                t0 = time.perf_counter()
                start, _ = figures.start_readings(job, devices, library)
                figures.write_start(state, start)
                t1 = time.perf_counter()
                found, poll, _ = figures.take_start(state, job)
                assert found is not None
                figures.device_figures(found, library, poll, figures.busy_times(found, {}, 1000.0))
                t2 = time.perf_counter()
                prolog.append((t1 - t0) * 1000)
                epilog.append((t2 - t1) * 1000)
            report[case] = {
                "prolog_ms": round(statistics.median(prolog), 3),
                "epilog_ms": round(statistics.median(epilog), 3),
            }
        # The guard's own part of a GPU job's reads (energy/guard.py): a fork, a pipe, a reap, reading nothing.
        from slurm_tpu.energy import guard

        forks = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            guard.call(lambda: 0, "nothing")
            forks.append((time.perf_counter() - t0) * 1000)
        report["guard_fork_only"] = {"call_ms": round(statistics.median(forks), 3)}
    finally:
        os.close(state)
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"runs": args.runs, "median_ms": report}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
