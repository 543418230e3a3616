#!/usr/bin/env python3
"""Where a request's time goes through the TPU broker, stage by stage; prints JSON.

The broker runs in this process (its CPU-only device: the model runs on the broker's CPU, as
with the libedgetpu double, whose delegate claims no op) and one client in a child process
sends serial requests (one in flight) of a small model, so the broker's own per-request path
dominates. Both sides stamp CLOCK_MONOTONIC (``time.perf_counter`` on Linux), so stamps
compare across the two processes. The broker's stamps come from wrapping, in this process
only, the pool's ``submit`` (the reader handed the request over), the request's ``done``
(called on the device thread after the invoke) and the socket sends of the answer; the
device's start and busy time are the broker's own figures (``wait_ms``, ``busy_ms``).
The wrappers cost a little; the stages are medians of ``--count`` requests. With ``--depth N``
the client pipelines N requests instead, and the figure is the device's idle gap between one
run's end and the next one's start (what keeps a pipelined client below in-process throughput).
Runs on a tree's own code, so an older checkout's broker can be profiled beside this one.

    .venv/bin/python bench/profile_broker.py [--model classifier|mobilenet] [--count 2000] [--depth 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from slurm_tpu.protocol import broker_wire as wire  # noqa: E402


def client(endpoint: str, model: str, count: int, depth: int) -> None:
    """In the child: ``count`` serial requests, each stamped before encode, after send, after receive
    (``depth`` > 1: pipelined through ``run_many``, no stamps)."""
    import numpy as np

    from slurm_tpu.runner.broker_client import BrokerEngine

    engine = BrokerEngine(model, endpoint)
    inputs = [np.zeros(s.shape, s.dtype) for s in engine.inputs]
    for _ in range(50):
        engine.run(inputs)
    if depth > 1:
        started = time.perf_counter()
        for _ in engine.run_many((inputs for _ in range(count)), depth):
            pass
        print(json.dumps({"seconds": time.perf_counter() - started}))
        return
    stamps = []
    clock = time.perf_counter
    for _ in range(count):
        c0 = clock()
        request_id = engine._submit(inputs)
        c1 = clock()
        if hasattr(engine, "_answer"):
            answer_id = engine._answer(request_id)[0]["id"]
        else:  # the broker client before the thread-safe engine (profiles of older trees)
            answer_id, _ = engine._collect()
        c2 = clock()
        assert answer_id == request_id
        stamps.append((c0, c1, c2))
    print(json.dumps(stamps))


def in_process_ms(model: str, count: int) -> float:
    import numpy as np

    from slurm_tpu.runner.engines import InterpreterEngine, select_runtime

    engine = InterpreterEngine(model, "cpu", select_runtime(), 1)
    inputs = [np.zeros(s.shape, s.dtype) for s in engine.inputs]
    for _ in range(50):
        engine.run(inputs)
    started = time.perf_counter()
    for _ in range(count):
        engine.run(inputs)
    return (time.perf_counter() - started) / count * 1000


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["classifier", "mobilenet"], default="classifier")
    parser.add_argument("--width", type=float, default=0.5)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--depth", type=int, default=1, help="> 1: pipelined; the device's gaps between runs")
    args = parser.parse_args()

    from harness.modelgen import classifier, mobilenet
    from slurm_tpu.broker import executor, server

    base = Path(tempfile.mkdtemp(prefix="stpu-profile-"))
    model = base / "model.tflite"
    built = classifier.build_classifier() if args.model == "classifier" else mobilenet.build_mobilenet(args.width)
    model.write_bytes(built)
    os.chmod(base, 0o755)
    os.chmod(model, 0o644)
    state = base / "state"
    state.mkdir()

    clock = time.perf_counter
    submitted: list[float] = []  # reader handed the request to the pool
    figures: list[tuple[float, float, float]] = []  # (enqueued, wait_s, busy_s)
    done_in: list[float] = []  # the device thread called done()
    done_out: list[float] = []  # done() returned (answer encoded and queued, or sent)
    sends: list[tuple[float, float, str]] = []  # an answer's send on the socket: start, end, thread
    lock = threading.Lock()

    original_submit = executor.DevicePool.submit
    original_run_here = getattr(executor.DevicePool, "run_here", None)  # the reader runs it (idle device)

    def wrap(work) -> None:
        """Stamp the hand-over now and the device's done() when it comes."""
        submitted.append(clock())
        inner = work.done

        def done(outputs, error, busy_s, wait_s):
            done_in.append(clock())
            figures.append((work.enqueued, wait_s, busy_s))
            inner(outputs, error, busy_s, wait_s)
            done_out.append(clock())

        work.done, work.unwrapped = done, inner

    def submit(self, work):
        wrap(work)
        return original_submit(self, work)

    def run_here(self, work):
        wrap(work)
        if original_run_here(self, work):
            return True
        submitted.pop()  # submit stamps it again
        work.done = work.unwrapped
        return False

    executor.DevicePool.submit = submit  # type: ignore[method-assign]
    if original_run_here is not None:
        executor.DevicePool.run_here = run_here  # type: ignore[attr-defined]

    def stamped(function):
        def wrapper(sock, *rest, **named):
            started = clock()
            result = function(sock, *rest, **named)
            with lock:
                sends.append((started, clock(), threading.current_thread().name))
            return result

        return wrapper

    for name in ("send_frame", "send_parts", "try_send"):
        if hasattr(wire, name):
            setattr(wire, name, stamped(getattr(wire, name)))

    broker = server.Broker(str(state), [executor.SharedDevice("cpu-0", None, None)], in_job=lambda pid, job: True)
    broker.start()
    try:
        grants = state / wire.BROKER_DIR / wire.GRANTS
        grants.mkdir(mode=0o700, exist_ok=True)
        (grants / "1").write_bytes(wire.encode_grant(1, os.getuid(), os.getgid(), 1))
        endpoint = broker.open_job(1)
        local = in_process_ms(str(model), args.count)
        done = subprocess.run(
            [sys.executable, __file__, "--client", endpoint, str(model), str(args.count), str(args.depth)],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            timeout=600,
        )
        if done.returncode != 0:
            raise SystemExit(f"profile_broker: the client failed: {done.stderr.strip()}")
        stamps = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        broker.stop()
        executor.DevicePool.submit = original_submit  # type: ignore[method-assign]
        if original_run_here is not None:
            executor.DevicePool.run_here = original_run_here  # type: ignore[attr-defined]
    if args.depth > 1:
        runs = figures[-args.count :]
        spans = [(enqueued + wait, enqueued + wait + busy) for enqueued, wait, busy in runs]
        gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:])]
        print(
            json.dumps(
                {
                    "model": args.model,
                    "depth": args.depth,
                    "in_process_ms": round(local, 4),
                    "client_ms_per_inference": round(stamps["seconds"] / args.count * 1000, 4),
                    "invoke_ms_median": round(statistics.median(b for _, _, b in runs) * 1000, 4),
                    "device_gap_us_median": round(statistics.median(gaps) * 1e6, 1),
                    "device_gap_us_mean": round(statistics.mean(gaps) * 1e6, 1),
                },
                indent=1,
            )
        )
        return

    n = len(stamps)
    answer_sends = [s for s in sends if s[2] != "control peer"]
    # The client's requests are the last n the broker saw (after its warm-up and the load).
    submitted, figures, done_in, done_out = submitted[-n:], figures[-n:], done_in[-n:], done_out[-n:]
    answer_sends = answer_sends[-n:]
    stages: dict[str, list[float]] = {k: [] for k in STAGES}
    for i, (c0, c1, c2) in enumerate(stamps):
        enqueued, wait_s, busy_s = figures[i]
        start = enqueued + wait_s
        end = start + busy_s
        s0, s1, _ = answer_sends[i]
        values = {
            "client_encode_send": c1 - c0,
            "send_to_reader_queued": submitted[i] - c1,
            "queue_to_device_start": start - submitted[i],
            "invoke": busy_s,
            "invoke_end_to_done": done_in[i] - end,
            "answer_encode_and_handoff": s0 - done_in[i],
            "socket_send": s1 - s0,
            "send_to_client_decoded": c2 - s1,
            "round_trip": c2 - c0,
        }
        for key, value in values.items():
            stages[key].append(value)
    threads = sorted({s[2].split(" ")[-1] for s in answer_sends})  # reader, writer, or the device's
    median = {k: round(statistics.median(v) * 1e6, 1) for k, v in stages.items()}
    result = {
        "model": args.model,
        "requests": n,
        "in_process_us": round(local * 1000, 1),
        "stages_median_us": median,
        "round_trip_minus_invoke_us": round(median["round_trip"] - median["invoke"], 1),
        "answers_sent_by": threads,
        "note": "serial requests, one in flight; CLOCK_MONOTONIC stamps across the two processes",
    }
    print(json.dumps(result, indent=1))


STAGES = (
    "client_encode_send",
    "send_to_reader_queued",
    "queue_to_device_start",
    "invoke",
    "invoke_end_to_done",
    "answer_encode_and_handoff",
    "socket_send",
    "send_to_client_decoded",
    "round_trip",
)


if __name__ == "__main__":
    main()
