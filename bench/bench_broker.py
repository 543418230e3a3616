#!/usr/bin/env python3
"""The TPU broker vs in-process inference, sharing, fairness, memory and swaps; prints JSON.

Runs on the CPU twin: the broker's device is the libedgetpu double (tests/edgetpu_double), whose
delegate claims no op, so every model runs on the broker's CPU exactly as it would in process.
The figures are the broker's own overhead and scheduling; an Edge TPU's own times are not in them.
Needs root (the broker is root's) and a writable cgroup hierarchy (the clients are put in
``job_<J>`` cgroups, as Slurm puts a job's tasks, so the broker's peer check admits them).

- overhead: the same model (MobileNet-v1-shaped, ``--width``) and inputs, 1 interpreter thread:
  in-process ``InterpreterEngine.run`` (the baseline) vs ``BrokerEngine.run`` (one at a time),
  ``BrokerEngine.run_many`` (pipelined, depth 4, one thread) and one engine shared by
  ``in_flight`` threads each calling ``run`` (how ``infer`` on a directory and ``serve`` drive a
  broker engine); each round runs every arm once, in that order (interleaved A/B); each arm's
  time is measured after its client loaded the model and warmed up; medians over the rounds,
  every ratio against the baseline of the same run.
  Goals: < 0.3 ms added per inference; pipelined >= 0.95 x in-process throughput.
- sharing: the device's steady-state inferences/s with 1 job vs 4 jobs at once (goal >= 0.95):
  every client loads its model and keeps requests in flight; once each has been answered the
  window opens, and the device's own count (the broker's ``stats``) over ``--count`` inferences
  gives the rate; 1 job and 4 jobs alternate over the rounds. The old figure (wall clock of
  whole client processes, start-up and model loads included) is printed beside it.
- fairness: 2 jobs of 1 and 3 shares saturating; device-time ratio from the broker's figures.
- memory: the broker's RSS with 8 jobs and 4 models (2 jobs per model).
- swap: busy ms per inference alternating 2 models vs one model (the CPU twin's swap cost: an
  interpreter switch; on an Edge TPU a swap also re-uploads the parameter cache).

    .venv/bin/python bench/bench_broker.py [--width 0.5] [--count 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "broker")]
from broker_support import BrokerProcess, JobCgroups, temp_base, wait_for  # noqa: E402

from edgetpu_double.build import build_double  # noqa: E402
from harness.modelgen import mobilenet  # noqa: E402
from slurm_tpu.protocol import broker_wire as wire  # noqa: E402


def worker(args: list[str]) -> None:
    """In a job's cgroup: ``MODE MODEL COUNT`` -> one JSON line of timings."""
    import numpy as np

    from slurm_tpu.runner.broker_client import BrokerEngine

    mode, model, count = args[0], args[1], int(args[2])
    engine = BrokerEngine(model, os.environ[wire.ENDPOINT_ENV])
    rng = np.random.default_rng(1)
    inputs = [rng.integers(0, 256, engine.inputs[0].shape).astype(engine.inputs[0].dtype)]
    for _ in range(20):  # warm: the broker's interpreter, this process's paths
        engine.run(inputs)
    busy_before = engine.stats()[wire.BUSY_MS] if mode != "steady" else 0.0
    started = time.perf_counter()
    if mode == "serial":
        for _ in range(count):
            engine.run(inputs)
    elif mode == "pipelined":
        for _ in engine.run_many((inputs for _ in range(count)), depth=4):
            pass
    elif mode == "threads":  # as the runner's pipeline and serve's device queue share a broker engine
        import threading

        def share(n: int) -> None:
            for _ in range(n):
                engine.run(inputs)

        workers = [
            threading.Thread(target=share, args=(count // engine.in_flight + (i < count % engine.in_flight),))
            for i in range(engine.in_flight)
        ]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
    elif mode == "steady":  # keep requests in flight until killed (the sharing figure)
        print(json.dumps({"started": True}), flush=True)
        while True:
            for _ in engine.run_many((inputs for _ in range(10**9)), depth=4):
                pass
    elif mode == "forever":
        print(json.dumps({"started": True}), flush=True)
        while True:
            for _ in engine.run_many((inputs for _ in range(10**9)), depth=8):
                pass
    seconds = time.perf_counter() - started
    busy_ms = engine.stats()[wire.BUSY_MS] - busy_before  # the device's own time of these runs
    print(json.dumps({"seconds": seconds, "count": count, "busy_ms": busy_ms}), flush=True)


def in_process(model: str, count: int) -> float:
    import numpy as np

    from slurm_tpu.runner.engines import InterpreterEngine, select_runtime

    engine = InterpreterEngine(model, "cpu", select_runtime(), 1)
    rng = np.random.default_rng(1)
    inputs = [rng.integers(0, 256, engine.inputs[0].shape).astype(engine.inputs[0].dtype)]
    for _ in range(20):
        engine.run(inputs)
    started = time.perf_counter()
    for _ in range(count):
        engine.run(inputs)
    seconds = time.perf_counter() - started
    engine.close()
    return seconds


def client(groups: JobCgroups, job: int, endpoint: str, mode: str, model: str, count: int) -> subprocess.Popen:
    env = dict(os.environ, SLURM_TPU_BROKER=endpoint, PYTHONPATH=str(ROOT))
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", mode, model, str(count)]
    return subprocess.Popen(groups.command(job, argv), env=env, stdout=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> dict:
    out, _ = process.communicate(timeout=600)
    assert process.returncode == 0, out
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2:])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=float, default=0.5)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = temp_base()
    groups = JobCgroups()
    if groups.base is None:
        raise SystemExit("bench_broker: needs root and a writable cgroup hierarchy")
    (base / "double").mkdir()
    double = build_double(base / "double")
    models = []
    for i, width in enumerate((args.width, 0.25, 0.75, 0.35)):
        path = base / f"mobilenet_{i}.tflite"
        path.write_bytes(mobilenet.build_mobilenet(width))
        models.append(str(path))
    os.chmod(base, 0o755)
    broker = BrokerProcess(base, double).start()
    result: dict = {"device": "CPU twin (libedgetpu double: the model runs on the broker's CPU)", "width": args.width}
    try:
        model, count = models[0], args.count
        # ---- overhead: alternate in-process, serial, pipelined ----
        endpoint = broker.open(1)
        arms: dict[str, list[float]] = {"in_process": [], "serial": [], "pipelined": [], "threads": []}
        busy: dict[str, list[float]] = {"serial": [], "pipelined": [], "threads": []}
        for _ in range(args.rounds):
            arms["in_process"].append(in_process(model, count) / count * 1000)
            for mode in ("serial", "pipelined", "threads"):
                done = finish(client(groups, 1, endpoint, mode, model, count))
                arms[mode].append(done["seconds"] / count * 1000)
                busy[mode].append(done["busy_ms"] / count)
        local, serial, piped, threaded = (statistics.median(arms[k]) for k in arms)
        device_serial = statistics.median(busy["serial"])
        result["overhead"] = {
            "in_process_ms": round(local, 4),
            "broker_serial_ms": round(serial, 4),
            "added_ms": round(serial - local, 4),
            # The CPU twin runs the model on the broker's CPU, beside the client: its invoke there
            # (the broker's busy time) is not the in-process one. What the round trip adds to it:
            "broker_device_ms_serial": round(device_serial, 4),
            "added_over_broker_device_ms": round(serial - device_serial, 4),
            "broker_device_ms_per_arm": {k: round(statistics.median(v), 4) for k, v in busy.items()},
            "broker_pipelined_ms": round(piped, 4),
            "pipelined_throughput_ratio": round(local / piped, 3),
            "broker_shared_engine_ms": round(threaded, 4),
            "shared_engine_throughput_ratio": round(local / threaded, 3),
            "rounds_ms": {k: [round(v, 4) for v in values] for k, values in arms.items()},
            "goals": {"added_ms_below": 0.3, "pipelined_ratio_at_least": 0.95},
        }
        # ---- sharing: 1 job alone vs 4 jobs at once (the device's steady-state inferences/s) ----
        for job in range(2, 6):
            broker.open(job)
        alone, shared, alone_wall, shared_wall = [], [], [], []
        for _ in range(args.rounds):
            alone.append(steady_rate(broker, groups, [2], model, count))
            shared.append(steady_rate(broker, groups, [2, 3, 4, 5], model, count))
        for _ in range(args.rounds):  # the old figure: whole client processes, start-up and loads included
            started = time.perf_counter()
            finish(client(groups, 2, broker_endpoint(broker, 2), "pipelined", model, count))
            alone_wall.append(count / (time.perf_counter() - started))
            started = time.perf_counter()
            procs = [client(groups, j, broker_endpoint(broker, j), "pipelined", model, count // 4) for j in range(2, 6)]
            for p in procs:
                finish(p)
            shared_wall.append(4 * (count // 4) / (time.perf_counter() - started))
        result["sharing"] = {
            "one_job_per_s": round(statistics.median(alone), 1),
            "four_jobs_per_s": round(statistics.median(shared), 1),
            "ratio": round(statistics.median(shared) / statistics.median(alone), 3),
            "rounds_per_s": {"one_job": [round(v, 1) for v in alone], "four_jobs": [round(v, 1) for v in shared]},
            "note": "steady state: the device's own count over a window opened once every job's model was loaded"
            " and each had been answered",
            "goal_at_least": 0.95,
            "wall_clock": {
                "one_job_per_s": round(statistics.median(alone_wall), 1),
                "four_jobs_per_s": round(statistics.median(shared_wall), 1),
                "ratio": round(statistics.median(shared_wall) / statistics.median(alone_wall), 3),
                "note": "the old figure: whole client processes (start-up and model loads included)",
            },
        }
        # ---- fairness 1:3 ----
        a, b = broker.open(10, shares=1), broker.open(11, shares=3)
        floods = [
            client(groups, 10, a, "forever", model, 0),
            client(groups, 10, a, "forever", model, 0),
            client(groups, 11, b, "forever", model, 0),
            client(groups, 11, b, "forever", model, 0),
        ]
        try:

            def jobs():
                return broker.control("stats")["jobs"]

            wait_for(lambda: all(jobs().get(j, {}).get(wire.INFERENCES, 0) >= 20 for j in ("10", "11")), 120)
            first = jobs()
            total = first["10"][wire.INFERENCES] + first["11"][wire.INFERENCES]
            second = wait_for(
                lambda: (
                    lambda now: (
                        now if now["10"][wire.INFERENCES] + now["11"][wire.INFERENCES] >= total + 2 * count else None
                    )
                )(jobs()),
                600,
            )
        finally:
            for p in floods:
                p.kill()
                p.wait()
        busy_a = second["10"][wire.BUSY_MS] - first["10"][wire.BUSY_MS]
        busy_b = second["11"][wire.BUSY_MS] - first["11"][wire.BUSY_MS]
        result["fairness"] = {
            "shares": "1:3",
            "busy_ms": [round(busy_a, 1), round(busy_b, 1)],
            "ratio": round(busy_b / busy_a, 3),
            "inferences": 2 * count,
            "goal": "3 +- 10%",
        }
        for job in (1, 2, 3, 4, 5, 10, 11):
            broker.control("close", job=job)
        # ---- swap cost: one job alternating two models vs one model ----
        broker.open(20)
        swap = finish(swapper(groups, broker_endpoint(broker, 20), models[0], models[1], count))
        result["swap"] = swap
        broker.control("close", job=20)
        # ---- memory: 8 jobs, 4 models ----
        rss_idle = rss(broker.process.pid)
        procs = []
        for job in range(30, 38):
            endpoint = broker.open(job)
            procs.append(client(groups, job, endpoint, "serial", models[job % 4], 5))
        for p in procs:
            finish(p)
        result["memory"] = {
            "rss_mb_before": rss_idle,
            "rss_mb_8_jobs_4_models": rss(broker.process.pid),
            "models_loaded": sum(d["models"] for d in broker.control("stats")["devices"].values()),
            "model_mb": round(sum(os.path.getsize(m) for m in models) / 2**20, 2),
        }
    finally:
        broker.stop()
        groups.cleanup()
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(result, indent=1))


def steady_rate(broker: BrokerProcess, groups: JobCgroups, jobs: list[int], model: str, count: int) -> float:
    """Inferences/s of the device while ``jobs`` each keep requests in flight (after every one was answered)."""

    def figures() -> tuple[dict, int]:
        stats = broker.control("stats")
        return stats["jobs"], sum(d["inferences"] for d in stats["devices"].values())

    before = figures()[0]
    procs = [client(groups, job, broker_endpoint(broker, job), "steady", model, 0) for job in jobs]
    try:
        # Open the window once every client has loaded, warmed up (20 runs) and been answered again.
        deadline = time.monotonic() + 300
        while True:
            now = figures()[0]
            if all(now[str(j)][wire.INFERENCES] >= before[str(j)][wire.INFERENCES] + 30 for j in jobs):
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit("bench_broker: a steady client did not start")
            time.sleep(0.05)
        start, first = time.perf_counter(), figures()[1]
        while True:
            time.sleep(0.05)
            end, last = time.perf_counter(), figures()[1]
            if last - first >= count:
                return (last - first) / (end - start)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def broker_endpoint(broker: BrokerProcess, job: int) -> str:
    return wire.endpoint_path(str(broker.state_dir), job)


def swapper(groups: JobCgroups, endpoint: str, model_a: str, model_b: str, count: int) -> subprocess.Popen:
    code = f"""
import json, time, numpy as np
from slurm_tpu.runner.broker_client import BrokerEngine
a, b = BrokerEngine({model_a!r}, {endpoint!r}), BrokerEngine({model_b!r}, {endpoint!r})
def x(e): return [np.zeros(e.inputs[0].shape, e.inputs[0].dtype)]
xa, xb = x(a), x(b)
for _ in range(3): a.run(xa); b.run(xb)
s0 = a.stats()
for _ in range({count}): a.run(xa)
s1 = a.stats()
for _ in range({count}): b.run(xb)
s2 = a.stats()
for _ in range({count} // 2): a.run(xa); b.run(xb)
s3 = a.stats()
same = (s2["busy_ms"] - s0["busy_ms"]) / (2 * {count})
alternating = (s3["busy_ms"] - s2["busy_ms"]) / (2 * ({count} // 2))
print(json.dumps({{"busy_ms_per_inference_same_model": round(same, 4),
                  "busy_ms_per_inference_alternating": round(alternating, 4),
                  "swap_cost_ms": round(alternating - same, 4), "swaps": s3["model_swaps"] - s2["model_swaps"],
                  "note": "CPU twin: an interpreter switch; an Edge TPU adds its parameter-cache upload"}}))
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        groups.command(20, [sys.executable, "-c", code]), env=env, stdout=subprocess.PIPE, text=True
    )


def rss(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


if __name__ == "__main__":
    main()
