#!/usr/bin/env python3
"""Served inference vs an in-process loop: throughput with 1 and 8 clients, and latency added.

Same model (the generated MobileNet-v1-shaped uint8 model; ``--width`` scales its cost:
0.5 takes a few ms per invoke here, the order of an Edge TPU's), same JPEG inputs, same
runtime (LiteRT) and thread count, same work per input (decode, LANCZOS resize as
pycoral, invoke, top-3 classes):

- in-process: ``Runner.run(path)`` for each input, one after the other (what a job
  script does with the Python API);
- served: ``slurm-tpu serve`` in its own process; clients in this process send each
  file's bytes to ``:classify`` over keep-alive connections (1 client, then 8).

Rounds alternate the arms; medians are reported. Goals: served throughput with 8
clients >= 0.8 x in-process, and median latency added per request at 1 client
(round trip - in-process time for the same inputs) < 2 ms on loopback.

    .venv/bin/python bench/bench_serve.py [--images 200] [--rounds 3] [--width 0.5]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.modelgen import images, mobilenet
from slurm_tpu.runner import Runner
from slurm_tpu.runner.serve.auth import read_address

JOB = "424242"


def in_process(runner: Runner, paths: list[str]) -> tuple[float, list[float]]:
    """(inputs/s, seconds per input) of a plain loop over Runner.run."""
    times = []
    started = time.perf_counter()
    for path in paths:
        t = time.perf_counter()
        runner.run(path, runner.options(3))
        times.append(time.perf_counter() - t)
    return len(paths) / (time.perf_counter() - started), times


def served(port: int, token: str, paths: list[str], clients: int) -> tuple[float, list[float]]:
    """(inputs/s, seconds per request) with ``clients`` connections sharing the inputs."""
    bodies = [Path(p).read_bytes() for p in paths]
    times: list[float] = []
    lock = threading.Lock()
    failures: list[str] = []

    def client(share: list[bytes]) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port)
        headers = {"Authorization": f"Bearer {token}"}
        mine = []
        for body in share:
            t = time.perf_counter()
            connection.request("POST", "/v1/models/m:classify?top_k=3", body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
            mine.append(time.perf_counter() - t)
            if response.status != 200:
                failures.append(data.decode())
        connection.close()
        with lock:
            times.extend(mine)

    threads = [threading.Thread(target=client, args=(bodies[i::clients],)) for i in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit(f"served requests failed: {failures[0]}")
    return len(bodies) / (time.perf_counter() - started), times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=float, default=0.5, help="MobileNet width multiplier (model cost)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    model = work / "mobilenet.tflite"
    model.write_bytes(mobilenet.build_mobilenet(args.width))
    paths = [str(p) for p, _ in images.write_images(work / "images", args.images, size=320, fmt="jpg")]
    home = work / "home"
    home.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_VISIBLE"))}
    env.update(HOME=str(home), SLURM_JOB_ID=JOB)
    server = subprocess.Popen(
        [sys.executable, "-m", "slurm_tpu.cli", "serve", f"{model}=m", "--host", "127.0.0.1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                address = read_address(JOB, env)
                break
            except Exception:  # noqa: BLE001 - not up yet (no address file, or a partial one): retry
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"serve did not start: {server.stderr.read().decode()}") from None
                time.sleep(0.1)
        port = int(address.url.rsplit(":", 1)[1])
        rates: dict[str, list[float]] = {"in_process": [], "served_1": [], "served_8": []}
        per_input: dict[str, list[float]] = {"in_process": [], "served_1": []}
        with Runner(str(model), environ=env) as runner:
            in_process(runner, paths[:10])  # warm-up both
            served(port, address.token, paths[:10], 2)
            arms = {
                "in_process": lambda: in_process(runner, paths),
                "served_1": lambda: served(port, address.token, paths, 1),
                "served_8": lambda: served(port, address.token, paths, 8),
            }
            names = list(arms)
            for r in range(args.rounds):
                for name in names if r % 2 == 0 else names[::-1]:
                    rate, times = arms[name]()
                    rates[name].append(rate)
                    if name in per_input:
                        per_input[name].extend(times)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    median = {k: statistics.median(v) for k, v in rates.items()}
    added_ms = (statistics.median(per_input["served_1"]) - statistics.median(per_input["in_process"])) * 1000
    ratio_1, ratio_8 = median["served_1"] / median["in_process"], median["served_8"] / median["in_process"]
    print(
        json.dumps(
            {
                "images": args.images,
                "rounds": args.rounds,
                "width": args.width,
                "cpus": os.cpu_count(),
                "in_process_ms": round(statistics.median(per_input["in_process"]) * 1000, 3),
                "served_1_round_trip_ms": round(statistics.median(per_input["served_1"]) * 1000, 3),
                **{f"{k}_per_s": round(v, 1) for k, v in median.items()},
                "ratio_1_client": round(ratio_1, 3),
                "ratio_8_clients": round(ratio_8, 3),
                "added_latency_ms": round(added_ms, 3),
            },
            indent=2,
        )
    )
    print(
        f"{'PASS' if ratio_8 >= 0.8 else 'FAIL'}: served throughput with 8 clients is {ratio_8:.2f}x the in-process "
        "loop (goal >= 0.8)"
    )
    print(
        f"{'PASS' if added_ms < 2 else 'FAIL'}: median latency added per request at 1 client {added_ms:.2f} ms "
        "(goal < 2 ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
