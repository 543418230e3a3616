"""Benchmark: scontrol vs pyslurm on Slurm 25.11: the prolog's query, one health check, a watcher's polls.

A real local 25.11 cluster (one node with six Edge TPUs, a running --gres=tpu:2
job). Each pair is interleaved and compared by medians:
- prolog query: a fresh interpreter asking the job's per-node GRES the way the
  prolog does (``scontrol show job -d`` + parse) vs asking pyslurm (import +
  ``Job.load().get_resource_layout_per_node()``): the hook pays for its query on
  every job. Both run the venv's Python (the real prolog's ``python3 -I -S``
  cannot import pyslurm at all; its bare start is printed for scale);
- health: one ``slurm-tpu health`` run with ``slurm.backend: scontrol`` vs ``pyslurm``;
- watcher: 20 node-state queries in one running process (pyslurm's import paid once).
Every line ends with the ratio pyslurm/scontrol (<1: pyslurm is faster).
Usage (root; needs scripts/build-slurm.sh --pyslurm):
  .venv/bin/python bench/bench_slurm_backends.py [--rounds N] [--slurm /opt/slurm-25.11]
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

HARDWARE = os.path.join(REPO, "tests", "isolation", "hardware", "n1_two_tpus.umockdev")
HOOK_QUERY = f"""
import sys; sys.path.insert(0, {REPO!r})
from slurm_tpu.slurm import installation
from slurm_tpu.slurm.commands import Slurm
Slurm(installation.find(use_path=False)).job_gres(int(sys.argv[1]), "n1")
"""
PYSLURM_QUERY = f"""
import sys; sys.path.insert(0, {REPO!r})
from slurm_tpu.slurm.commands import Slurm
from slurm_tpu.slurm.backend import load
load(Slurm()).job_gres(int(sys.argv[1]), "n1")
"""
POLLS = 20
WATCH_LOOP = f"""
import sys, time; sys.path.insert(0, {REPO!r})
from slurm_tpu.slurm.commands import Slurm
started = time.perf_counter()
slurm = Slurm()
if sys.argv[1] == "pyslurm":
    from slurm_tpu.slurm.backend import load
    slurm = load(slurm)
for _ in range({POLLS}):
    slurm.node_state("n1")
print(time.perf_counter() - started)
"""


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, env=env)
    return time.perf_counter() - started


def pair(name: str, scontrol, pyslurm, rounds: int) -> None:
    a, b = [], []
    for _ in range(rounds):
        a.append(scontrol())
        b.append(pyslurm())
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{name:<34} scontrol {ma * 1000:7.1f} ms   pyslurm {mb * 1000:7.1f} ms   ratio {mb / ma:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--slurm", default="/opt/slurm-25.11", help="Slurm prefix (default /opt/slurm-25.11)")
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="slurm-tpu-bench-backends-", dir="/tmp")
    os.chmod(base, 0o755)
    cluster = LocalCluster(base=base, nodes=[NodeSpec("n1", HARDWARE)], slurm_prefix=args.slurm)
    try:
        cluster.configure()
        cluster.start()
        job = cluster.sbatch(["--gres=tpu:2", "-w", "n1", "-o", "/dev/null"], "#!/bin/sh\nsleep 600\n")
        cluster._wait(lambda: cluster.job_state(job) == "RUNNING", 60, f"job {job} to run")
        env = cluster.env({"SLURM_TPU_CONFIG": cluster.node_config("n1")})
        hook_python = "/usr/bin/python3"
        configs = {}
        for backend in ("scontrol", "pyslurm"):
            path = os.path.join(base, f"{backend}.yaml")
            with open(cluster.node_config("n1"), encoding="utf-8") as source, open(path, "w") as target:
                target.write(source.read() + f"slurm:\n  backend: {backend}\n")
            configs[backend] = path
        # --dry-run --grace 0: the node's TPUs are not on this machine, so health finds them missing;
        # what is timed is one run's detection, decision and node-state query, not a drain.
        health = {
            b: [
                sys.executable,
                "-m",
                "slurm_tpu.cli",
                "--config",
                configs[b],
                "health",
                "--node",
                "n1",
                "--dry-run",
                "--grace",
                "0",
            ]
            for b in configs
        }
        for argv in health.values():  # both work, and agree
            out = subprocess.run(argv, capture_output=True, text=True, env=env)
            assert out.returncode == 0, out.stderr
        print(f"Slurm {args.slurm}, {args.rounds} rounds, medians; job {job} holds 2 TPUs on n1")
        for label, argv in (
            ("prolog's python3 -I -S", [hook_python, "-I", "-S", "-c", "pass"]),
            ("venv python", [sys.executable, "-c", "pass"]),
        ):
            bare = statistics.median([timed(argv, env) for _ in range(args.rounds)])
            print(f"{'bare start, ' + label:<34} {bare * 1000:7.1f} ms")
        pair(
            "prolog query (fresh process)",
            lambda: timed([sys.executable, "-c", HOOK_QUERY, str(job)], env),
            lambda: timed([sys.executable, "-c", PYSLURM_QUERY, str(job)], env),
            args.rounds,
        )
        pair(
            "slurm-tpu health (whole run)",
            lambda: timed(health["scontrol"], env),
            lambda: timed(health["pyslurm"], env),
            args.rounds,
        )

        def loop(backend: str) -> float:
            out = subprocess.run(
                [sys.executable, "-c", WATCH_LOOP, backend], check=True, capture_output=True, text=True, env=env
            ).stdout
            return float(out)

        pair(f"watcher: {POLLS} node-state polls", lambda: loop("scontrol"), lambda: loop("pyslurm"), args.rounds)
    finally:
        cluster.command(["scancel", "--partition=debug"], check=False)
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
