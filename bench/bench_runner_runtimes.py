#!/usr/bin/env python3
"""(c) LiteRT vs tflite-runtime on the quantized MobileNet-shaped model, through the runner.

tflite-runtime 2.14 needs numpy<2, so it lives in its own venv (created here in
/tmp/venv-tflite-runtime if missing: pip install tflite-runtime 'numpy<2' ...; the
runner is put on its PYTHONPATH). One worker process per runtime, each with the
model opened by ``slurm_tpu.runner.Runner(runtime=...)``; rounds alternate between
the two workers. Prints median throughput of each and ratio = LiteRT / tflite-runtime.
Skips with a message when tflite-runtime cannot be installed.

    /tmp/venv/bin/python bench/bench_runner_runtimes.py [--iterations 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from harness.modelgen import mobilenet  # noqa: E402

VENV = Path("/tmp/venv-tflite-runtime")
PACKAGES = ["tflite-runtime", "numpy<2", "Pillow", "click", "pyyaml", "flatbuffers", "tflite"]

WORKER = r"""
import json, sys, os
from slurm_tpu.runner import OpenOptions, Runner
runtime, model, iterations = sys.argv[1], sys.argv[2], int(sys.argv[3])
runner = Runner(model, options=OpenOptions(device=["cpu"], runtime=runtime), environ={})
runner.benchmark(5)  # warm up
print("ready", flush=True)
for line in sys.stdin:
    result = runner.benchmark(iterations)
    figures = {"per_s": result.throughput_per_s, "p50_ms": result.p50_ms, "runtime": runner.engine_set.runtime}
    print(json.dumps(figures), flush=True)
"""


def ensure_venv() -> Path | None:
    python = VENV / "bin" / "python"
    probe = [str(python), "-c", "import tflite_runtime.interpreter, numpy; assert numpy.__version__ < '2'"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", *PACKAGES], capture_output=True, text=True)
    if r.returncode != 0 or subprocess.run(probe, capture_output=True).returncode != 0:
        print(
            f"SKIP: tflite-runtime could not be installed in {VENV}: "
            f"{(r.stderr.strip().splitlines() or ['import failed'])[-1]}"
        )
        return None
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    other = ensure_venv()
    if other is None:
        return
    model = Path(tempfile.mkdtemp(prefix="bench-rt-")) / "mobilenet.tflite"
    model.write_bytes(mobilenet.build_mobilenet())
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_TPU_")}
    env["PYTHONPATH"] = str(ROOT)
    workers = {}
    for name, python in (("litert", sys.executable), ("tflite-runtime", str(other))):
        proc = subprocess.Popen(
            [python, "-c", WORKER, name, str(model), str(args.iterations)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"{name} worker failed to start")
        workers[name] = proc
    results: dict[str, list[dict]] = {name: [] for name in workers}
    for r in range(args.rounds):
        for name in list(workers) if r % 2 == 0 else list(reversed(workers)):
            workers[name].stdin.write("go\n")
            workers[name].stdin.flush()
            results[name].append(json.loads(workers[name].stdout.readline()))
    for proc in workers.values():
        proc.stdin.close()
        proc.wait()
    a = statistics.median(x["per_s"] for x in results["litert"])
    b = statistics.median(x["per_s"] for x in results["tflite-runtime"])
    print(
        json.dumps(
            {
                "iterations": args.iterations,
                "rounds": args.rounds,
                "litert_per_s": round(a, 1),
                "tflite_runtime_per_s": round(b, 1),
                "litert_p50_ms": round(statistics.median(x["p50_ms"] for x in results["litert"]), 2),
                "tflite_runtime_p50_ms": round(statistics.median(x["p50_ms"] for x in results["tflite-runtime"]), 2),
                "ratio": round(a / b, 2),
            },
            indent=2,
        )
    )
    print(
        f"{'LiteRT faster' if a > b else 'LiteRT NOT faster'}: LiteRT runs the quantized model "
        f"{a / b:.1f}x as fast as tflite-runtime 2.14 through the same runner"
    )


if __name__ == "__main__":
    main()
