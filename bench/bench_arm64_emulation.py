#!/usr/bin/env python3
"""The runner under arm64 emulation vs native, for the record (not a goal); prints JSON.

``slurm-tpu infer --benchmark --json`` on the MobileNet-v1-shaped uint8 model (harness.modelgen,
``--width``) on the CPU: natively on this x86_64 host (A, this checkout's venv) and in the arm64 CI
leg's root under qemu-user emulating a Raspberry Pi 4's Cortex-A72 (B, ``scripts/ci-arm64.sh run``,
after a leg has run: the root's venv and checkout copy). Each round runs A then B (interleaved);
each figure is the benchmark's own p50 latency (load and the first inference left out); the ratio
is B / A of the medians over the rounds, and the median of each round's B / A. What it says: how
much slower the leg's inference is than the host's; nothing about a real Pi, whose Cortex-A72 at
1.5-1.8 GHz runs natively.

    .venv/bin/python bench/bench_arm64_emulation.py [--rounds 5] [--iterations 20] [--width 0.5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from harness.modelgen import mobilenet  # noqa: E402

LEG = ROOT / "scripts" / "ci-arm64.sh"
IN_ROOT_VENV = "/opt/slurm-tpu-venv"
IN_ROOT_MODEL = "build/bench-arm64-mobilenet.tflite"  # under the root's checkout copy (/srv/slurm-tpu)


def p50(command: list[str]) -> float:
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout[done.stdout.index("{") :])["p50_ms"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--width", type=float, default=0.5)
    args = parser.parse_args()
    root = subprocess.run(
        ["bash", "-c", 'ls -d "${SLURM_TPU_ARM64_CACHE:-/var/cache/slurm-tpu/arm64}"/root-*'],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    if not root or not Path(root[0], IN_ROOT_VENV.lstrip("/"), "bin", "slurm-tpu").exists():
        print("bench_arm64_emulation: no arm64 root with a venv: run scripts/ci-arm64.sh first", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as work:
        model = Path(work) / "mobilenet.tflite"
        model.write_bytes(mobilenet.build_mobilenet(width=args.width))
        Path(root[0], "srv/slurm-tpu", IN_ROOT_MODEL).write_bytes(model.read_bytes())
        common = ["infer", "--benchmark", "--json", "--device", "cpu", "--iterations", str(args.iterations)]
        native = [str(ROOT / ".venv" / "bin" / "slurm-tpu"), *common, str(model)]
        emulated = [str(LEG), "run", f"{IN_ROOT_VENV}/bin/slurm-tpu", *common, IN_ROOT_MODEL]
        a, b = [], []
        for _ in range(args.rounds):
            a.append(p50(native))
            b.append(p50(emulated))
    result = {
        "model": f"mobilenet_v1 width {args.width}, uint8, CPU (LiteRT/XNNPACK), 1 process",
        "rounds": args.rounds,
        "native_x86_64_p50_ms": statistics.median(a),
        "emulated_aarch64_p50_ms": statistics.median(b),
        "ratio_emulated_over_native": statistics.median(b) / statistics.median(a),
        "ratio_paired_median": statistics.median(y / x for x, y in zip(a, b)),
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
