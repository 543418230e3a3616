"""Benchmark: one `slurm-tpu health` run (HealthCheckProgram) vs a bare Python start.

A real local cluster (one node with the big_node hardware: 10 accelerators);
both commands run under the same umockdev-run testbed, interleaved, so the
difference is what the health check itself costs: detection, the comparison and
its one `scontrol show node`. Slurm kills a HealthCheckProgram after 60 s; the
aim is well under 1 s. Usage (root): .venv/bin/python bench/bench_health.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from harness.localcluster import LocalCluster, NodeSpec  # noqa: E402

HARDWARE = os.path.join(REPO, "tests", "hardware", "big_node")


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, env=env)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="slurm-tpu-bench-health-", dir="/tmp")
    os.chmod(base, 0o755)
    cluster = LocalCluster(base=base, nodes=[NodeSpec("n1", HARDWARE + ".umockdev")])
    try:
        cluster.configure()
        cluster.start()
        env = cluster.env({"SLURM_TPU_CONFIG": cluster.node_config("n1")})
        wrap = [
            "umockdev-run",
            "--device",
            HARDWARE + ".umockdev",
            "--",
            sys.executable,
            "-m",
            "harness.localcluster.testbed",
            HARDWARE + ".extra",
            "--",
        ]
        health = wrap + [sys.executable, "-m", "slurm_tpu.cli", "health", "--node", "n1"]
        bare = wrap + [sys.executable, "-c", "pass"]
        out = subprocess.run(health, capture_output=True, text=True, env=env, check=True).stdout.strip()
        assert "10 configured accelerator(s), 0 problem(s); no change" in out, out
        health_times, bare_times = [], []
        for _ in range(args.rounds):
            bare_times.append(timed(bare, env))
            health_times.append(timed(health, env))
        h, b = statistics.median(health_times), statistics.median(bare_times)
        print(f"rounds: {args.rounds}; node with 10 accelerators; {out}")
        print(f"bare python start (under umockdev-run): median {b * 1000:.0f} ms")
        print(f"slurm-tpu health:                       median {h * 1000:.0f} ms")
        print(f"health check's own cost: {(h - b) * 1000:.0f} ms (ratio {h / b:.2f}x); Slurm's limit: 60000 ms")
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
