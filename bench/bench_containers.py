#!/usr/bin/env python3
"""Jobs in rootless Podman containers: start overhead of the CDI spec, and inference throughput; prints JSON.

Real rootless Podman 4.3 (runc) as a real user (stpu_alice), the offline image
(harness/containers/image.py), this node's CDI specs written by ``slurm-tpu cdi`` for big_node's
materialised device nodes (tests/containers/podman_support.py, as the Podman tests make them); the
node's libedgetpu is the double (tests/edgetpu_double), whose delegate claims no op, so the model
runs on the CPU in both places and the figures compare the container with the host, not silicon.

- start: ``podman run --rm IMAGE date +%s.%N`` without devices (A) vs with the job's two Edge TPUs
  by their CDI names (B: a card's node, the USB directory, the node's library mounted over the
  image's); the time from the launch to the container's first command (its printed clock; the
  teardown after it is left out); each round runs A then B (interleaved); medians over the
  rounds, and B - A in ms: what the spec adds to each containerised task's start.
- throughput: the MobileNet-v1-shaped model (``--width``), 1 interpreter thread, the node's
  library loaded as a delegate (``load_delegate('libedgetpu.so.1')``), ``--count`` invocations
  timed inside the process after a warm-up (start-up and model load left out), on the host (this
  checkout's venv, LiteRT and numpy at the versions the image pins) and in the container; host and
  container alternate over the rounds; the ratio is container / host of the medians (goal >= 0.98),
  and the median of each round's container / host (paired: less sensitive to other load).

    .venv/bin/python bench/bench_containers.py [--rounds 7] [--count 200] [--width 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "containers")]
from podman_support import Podman, cdi_devices, device_flags, ensure_subids, make_node, rootless_problem  # noqa: E402

from edgetpu_double.build import build_double  # noqa: E402
from harness.containers import image as builder  # noqa: E402
from harness.localcluster.users import real_users  # noqa: E402
from harness.modelgen import mobilenet  # noqa: E402

USER = "stpu_alice"
IMAGE = "localhost/slurm-tpu-coral:bench"
JOB = ["pci-0000:06:00.0", "usb-2-1"]  # a card and a stick of big_node
# Times COUNT invocations after a warm-up; prints inferences/s. Runs the same on the host and inside.
LOOP = """
import sys, time
import numpy as np
from ai_edge_litert.interpreter import Interpreter, load_delegate
model, library, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
interpreter = Interpreter(model_path=model, num_threads=1, experimental_delegates=[load_delegate(library)])
interpreter.allocate_tensors()
detail = interpreter.get_input_details()[0]
pixels = np.random.default_rng(0).integers(0, 255, detail["shape"], dtype=np.uint8).astype(detail["dtype"])
for _ in range(10):
    interpreter.set_tensor(detail["index"], pixels); interpreter.invoke()
started = time.perf_counter()
for _ in range(count):
    interpreter.set_tensor(detail["index"], pixels); interpreter.invoke()
print(count / (time.perf_counter() - started))
"""


def timed(engine: Podman, args: list[str], env: dict[str, str]) -> float:
    """One ``podman ARGS`` as the user, whose container prints ``date +%s.%N`` as its first act:
    ms from the launch to the container's command running (the start; not the teardown after it,
    which waits on conmon). A failure stops the benchmark."""
    launched = time.time()
    done = engine.run(args, env=env)
    if done.returncode != 0:
        raise SystemExit(f"podman {' '.join(args[:3])}... failed: {done.stderr.strip()[-500:]}")
    return (float(done.stdout.split()[-1]) - launched) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--count", type=int, default=200, help="inferences timed per throughput run")
    parser.add_argument("--width", type=float, default=0.5, help="MobileNet width multiplier")
    args = parser.parse_args()
    problem = rootless_problem()
    if problem:
        print(f"bench_containers: rootless Podman cannot run here: {problem}", file=sys.stderr)
        return 1
    base = Path(tempfile.mkdtemp(prefix="stp-", dir="/tmp"))  # short: see podman_support.Podman
    base.chmod(0o755)
    try:
        with real_users([USER]):
            ensure_subids(USER)
            library = build_double(base)
            library.chmod(0o755)
            node = make_node(base / "node", library)
            node.lease(JOB, USER)
            work = base / "work"
            work.mkdir(mode=0o755)
            model = work / "mobilenet.tflite"
            model.write_bytes(mobilenet.build_mobilenet(args.width))
            model.chmod(0o644)
            engine = Podman(USER, base / "p0", node.cdi)
            try:
                imported = engine.run(["import", builder.build().rootfs, IMAGE])
                if imported.returncode != 0:
                    raise SystemExit(f"podman import failed: {imported.stderr.strip()[-500:]}")
                # The double lists the job's card and opens its node (the same path on the host and,
                # by the spec's device node, in the container); the job's variable names it.
                card = node.nodes()[JOB[0]]
                env = {"SLURM_TPU_CDI_DEVICES": cdi_devices(JOB), "EDGETPU_VISIBLE_DEVICES": card}
                double = {"EDGETPU_DOUBLE_DEVICES": f"pci:{card}"}
                plain = ["run", "--rm", IMAGE, "date", "+%s.%N"]
                with_spec = ["run", "--rm", *device_flags(env["SLURM_TPU_CDI_DEVICES"]), IMAGE, "date", "+%s.%N"]
                timed(engine, plain, env)  # the first start also starts the user's pause process
                starts: dict[str, list[float]] = {"without": [], "with": []}
                for _ in range(args.rounds):
                    starts["without"].append(timed(engine, plain, env))
                    starts["with"].append(timed(engine, with_spec, env))
                rates: dict[str, list[float]] = {"host": [], "container": []}
                inside = [
                    "run", "--rm", *device_flags(env["SLURM_TPU_CDI_DEVICES"]), "-v", f"{work}:/work:ro",
                    "-e", f"EDGETPU_DOUBLE_DEVICES={double['EDGETPU_DOUBLE_DEVICES']}",
                    IMAGE, "python3", "-c", LOOP, "/work/mobilenet.tflite", "libedgetpu.so.1", str(args.count),
                ]  # fmt: skip
                variables = [f"{k}={v}" for k, v in {**env, **double}.items()]
                host = ["env", *variables, sys.executable, "-c", LOOP, str(model), str(library), str(args.count)]
                for _ in range(args.rounds):
                    done = subprocess.run(
                        ["runuser", "-u", USER, "--", *host], capture_output=True, text=True, check=True, cwd="/"
                    )
                    rates["host"].append(float(done.stdout.split()[-1]))
                    run = engine.run(inside, env=env)
                    if run.returncode != 0:
                        raise SystemExit(f"inference in the container failed: {run.stderr.strip()[-500:]}")
                    rates["container"].append(float(run.stdout.split()[-1]))
            finally:
                engine.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    start = {arm: statistics.median(times) for arm, times in starts.items()}
    rate = {arm: statistics.median(values) for arm, values in rates.items()}
    result = {
        "rounds": args.rounds,
        "start_ms": {arm: round(value, 1) for arm, value in start.items()},
        "start_added_ms": round(start["with"] - start["without"], 1),
        "inferences_per_s": {arm: round(value, 1) for arm, value in rate.items()},
        "container_over_host": round(rate["container"] / rate["host"], 3),
        # Each round's container run beside its host run: robust to a machine busy in some rounds.
        "container_over_host_paired": round(
            statistics.median(c / h for c, h in zip(rates["container"], rates["host"])), 3
        ),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "raw": {"start_ms": starts, "inferences_per_s": rates},
    }
    print(json.dumps(result, indent=1))
    print(
        f"start: {start['without']:.0f} ms without the spec, {start['with']:.0f} ms with it "
        f"(+{start['with'] - start['without']:.0f} ms); throughput container/host = "
        f"{rate['container'] / rate['host']:.3f}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
