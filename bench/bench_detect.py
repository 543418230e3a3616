"""Benchmark: ``slurm-tpu detect --json`` on a 64-device node vs a bare Python start.

Both commands run under the same ``umockdev-run`` testbed, interleaved, so the
ratio measures what detection adds to a Python process start. Prints medians and
the ratio. Usage: .venv/bin/python bench/bench_detect.py [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def node_with_64_devices() -> str:
    """A umockdev description: 32 USB sticks, 16 PCIe Edge TPUs, 16 AMD GPUs."""
    parts = [
        "P: /devices/pci0000:00/0000:00:14.0\nE: SUBSYSTEM=pci\nA: vendor=0x8086\nA: device=0xa36d\n"
        "A: class=0x0c0330\nA: numa_node=0\nA: local_cpulist=0-1\n"
    ]
    for i in range(32):
        bus, port = 1 + i // 8, 1 + i % 8
        vid, pid = ("18d1", "9302") if i % 2 else ("1a6e", "089a")
        parts.append(
            f"P: /devices/pci0000:00/0000:00:14.0/usb{bus}/{bus}-{port}\nN: bus/usb/{bus:03d}/{port + 1:03d}\n"
            f"E: DEVNAME=/dev/bus/usb/{bus:03d}/{port + 1:03d}\nE: SUBSYSTEM=usb\nE: DEVTYPE=usb_device\n"
            f"A: idVendor={vid}\nA: idProduct={pid}\nA: speed=5000\nA: busnum={bus}\nA: devnum={port + 1}\n"
        )
    for i in range(16):
        pci = f"0000:{0x10 + i:02x}:00.0"
        parts.append(
            f"P: /devices/pci0000:00/0000:00:1c.0/{pci}\nE: SUBSYSTEM=pci\nE: DRIVER=apex\n"
            f"L: driver=../../../../bus/pci/drivers/apex\nA: vendor=0x1ac1\nA: device=0x089a\n"
            f"A: class=0x0880\nA: numa_node=0\nA: local_cpulist=0-1\n"
        )
        parts.append(
            f"P: /devices/pci0000:00/0000:00:1c.0/{pci}/apex/apex_{i}\nN: apex_{i}\nE: DEVNAME=/dev/apex_{i}\n"
            f"E: SUBSYSTEM=apex\nA: temp=45000\n"
        )
    for i in range(16):
        pci = f"0000:{0x40 + i:02x}:00.0"
        parts.append(
            f"P: /devices/pci0000:40/{pci}\nE: SUBSYSTEM=pci\nE: DRIVER=amdgpu\n"
            f"L: driver=../../../bus/pci/drivers/amdgpu\nA: vendor=0x1002\nA: device=0x73bf\n"
            f"A: class=0x030000\nA: numa_node=0\nA: local_cpulist=0-1\n"
        )
        parts.append(
            f"P: /devices/pci0000:40/{pci}/drm/renderD{128 + i}\nN: dri/renderD{128 + i}\n"
            f"E: DEVNAME=/dev/dri/renderD{128 + i}\nE: SUBSYSTEM=drm\nE: DEVTYPE=drm_minor\n"
        )
    handle = tempfile.NamedTemporaryFile("w", suffix=".umockdev", delete=False)
    handle.write("\n".join(parts))
    handle.close()
    return handle.name


def timed(argv: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    completed = subprocess.run(argv, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, completed.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    device_file = node_with_64_devices()
    wrap = ["umockdev-run", "--device", device_file, "--"]
    detect = wrap + [sys.executable, "-m", "slurm_tpu.cli", "detect", "--json"]
    bare = wrap + [sys.executable, "-c", "pass"]
    _, out = timed(detect)
    found = json.loads(out)["accelerators"]
    assert len(found) == 64 and all(a["usable"] for a in found), f"expected 64 usable devices, got {len(found)}"
    detect_times, bare_times = [], []
    for _ in range(args.rounds):  # interleaved A/B: the machine's noise hits both alike
        bare_times.append(timed(bare)[0])
        detect_times.append(timed(detect)[0])
    detect_median, bare_median = statistics.median(detect_times), statistics.median(bare_times)
    print(f"devices: {len(found)}  rounds: {args.rounds}")
    print(f"bare python start (under umockdev-run): median {bare_median * 1000:.0f} ms")
    print(f"slurm-tpu detect --json (64 devices):   median {detect_median * 1000:.0f} ms")
    print(
        f"ratio detect / bare start: {detect_median / bare_median:.2f}x "
        f"(detection adds {(detect_median - bare_median) * 1000:.0f} ms)"
    )
    Path(device_file).unlink()


if __name__ == "__main__":
    main()
