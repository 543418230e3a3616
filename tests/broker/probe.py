"""A client of a job's broker endpoint ($SLURM_TPU_BROKER), run by the broker tests as a job's process.

    probe.py compare MODEL N       BrokerEngine vs an in-process InterpreterEngine on N inputs
    probe.py run MODEL N           N requests, pipelined; checks every answer against in-process
    probe.py threads MODEL T N     one engine shared by T threads, N requests each, checked likewise
    probe.py flood MODEL CONNS     CONNS connections saturating the broker until killed
    probe.py connect MODEL         connect and load: {"ok"} or the one error line
    probe.py serial MODEL N        N requests, each sent once the last was answered: the broker's in-flight peak
    probe.py hostile KIND MODEL    garbage | huge | mismatch | unknown-model | not-tflite | many-outputs |
                                   huge-arena: what the broker answered
Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading

import numpy as np

from slurm_tpu.errors import SlurmTpuError
from slurm_tpu.protocol import broker_wire as wire
from slurm_tpu.runner.broker_client import BrokerEngine
from slurm_tpu.runner.engines import InterpreterEngine, select_runtime

ENDPOINT = os.environ["SLURM_TPU_BROKER"]


def inputs_for(engine, count: int, seed: int = 7) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    sets = []
    for _ in range(count):
        sets.append(
            [
                rng.integers(0, 256, spec.shape).astype(spec.dtype)
                if spec.dtype.kind in "iu"
                else rng.random(spec.shape).astype(spec.dtype)
                for spec in engine.inputs
            ]
        )
    return sets


def compare(model: str, count: int) -> dict:
    remote = BrokerEngine(model, ENDPOINT)
    local = InterpreterEngine(model, "cpu", select_runtime(), 1)
    equal = True
    for inputs in inputs_for(local, count):
        a, b = remote.run(inputs), local.run(inputs)
        equal &= len(a) == len(b) and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b))
    # the same through the pipelined path
    sets = inputs_for(local, count, seed=11)
    for inputs, outputs in zip(sets, remote.run_many(sets, depth=4)):
        expected = local.run(inputs)
        equal &= all(np.array_equal(x, y) for x, y in zip(outputs, expected))
    return {"equal": bool(equal), "count": count, "outputs": len(local.outputs), "stats": remote.stats()}


def run(model: str, count: int) -> dict:
    remote = BrokerEngine(model, ENDPOINT)
    local = InterpreterEngine(model, "cpu", select_runtime(), 1)
    sets = inputs_for(local, 8)
    wrong = done = 0
    for index, outputs in enumerate(remote.run_many((sets[i % 8] for i in range(count)), depth=8)):
        done += 1
        wrong += not all(np.array_equal(x, y) for x, y in zip(outputs, local.run(sets[index % 8])))
    return {"done": done, "wrong": wrong}


def serial(model: str, count: int) -> dict:
    remote = BrokerEngine(model, ENDPOINT)
    local = InterpreterEngine(model, "cpu", select_runtime(), 1)
    sets = inputs_for(local, 4)
    wrong = sum(
        not all(np.array_equal(x, y) for x, y in zip(remote.run(sets[i % 4]), local.run(sets[i % 4])))
        for i in range(count)
    )
    return {"done": count, "wrong": wrong, "peak": remote.stats_answer()["in_flight_peak"]}


def one_op_model(outputs: int, shape: tuple[int, ...]) -> bytes:
    """A .tflite of one custom op with ``outputs`` uint8 outputs of ``shape`` (never built by the broker)."""
    from slurm_tpu.broker import oneop
    from slurm_tpu.runner.modelinfo import TensorSpec

    spec = TensorSpec("in", (1, 4), np.dtype("uint8"), 0.0, 0)
    outs = [TensorSpec(f"out{i}", shape, np.dtype("uint8"), 0.0, 0) for i in range(outputs)]
    return oneop.build(b"\0" * 16, [spec], outs)


def threads(model: str, count: int, each: int) -> dict:
    remote = BrokerEngine(model, ENDPOINT)
    local = InterpreterEngine(model, "cpu", select_runtime(), 1)
    sets = inputs_for(local, count * each)
    expected = [local.run(inputs) for inputs in sets]
    results: dict[int, list] = {}
    start = threading.Barrier(count)

    def one(index: int) -> None:
        start.wait()
        for i in range(index, len(sets), count):
            results[i] = remote.run(sets[i])

    workers = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    wrong = sum(not all(np.array_equal(x, y) for x, y in zip(results[i], expected[i])) for i in range(len(sets)))
    peak = remote.stats_answer()["in_flight_peak"]
    return {"done": len(results), "wrong": wrong, "peak_at_least_2": peak >= 2}


def flood(model: str, connections: int) -> None:
    def one() -> None:
        engine = BrokerEngine(model, ENDPOINT)
        sets = inputs_for(engine, 4)

        def forever():
            i = 0
            while True:
                yield sets[i % 4]
                i += 1

        for _ in engine.run_many(forever(), depth=8):
            pass

    threads = [threading.Thread(target=one, daemon=True) for _ in range(connections)]
    for t in threads:
        t.start()
    print(json.dumps({"flooding": connections}), flush=True)
    for t in threads:
        t.join()


def connect(model: str) -> dict:
    try:
        engine = BrokerEngine(model, ENDPOINT)
    except SlurmTpuError as exc:
        return {"ok": False, "error": str(exc)}
    engine.close()
    return {"ok": True}


def hostile(kind: str, model: str) -> dict:
    engine = BrokerEngine(model, ENDPOINT)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(60)
    sock.connect(ENDPOINT)
    sizes = [int(np.prod(s.shape)) * s.dtype.itemsize for s in engine.inputs]
    if kind == "garbage":
        sock.sendall(os.urandom(4096))
    elif kind == "huge":
        sock.sendall(wire.HEAD.pack(wire.MAGIC, 20, 1 << 31))
    elif kind == "huge-header":
        sock.sendall(wire.HEAD.pack(wire.MAGIC, 1 << 30, 0))
    elif kind == "mismatch":
        sock.sendall(
            wire.encode_frame(
                {"op": "invoke", "id": 1, "model": engine.model, "tensors": [sizes[0] + 1]}, b"\0" * (sizes[0] + 1)
            )
        )
    elif kind == "unknown-model":
        sock.sendall(
            wire.encode_frame({"op": "invoke", "id": 1, "model": "0" * 64, "tensors": sizes}, b"\0" * sum(sizes))
        )
    elif kind == "not-tflite":
        sock.sendall(wire.encode_frame({"op": "load"}, b"not a model at all"))
    elif kind == "many-outputs":  # a load answer past MAX_HEADER, and thousands of outputs per answer
        sock.sendall(wire.encode_frame({"op": "load"}, one_op_model(3000, (1, 1))))
    elif kind == "huge-arena":  # tensors of 2 GiB: refused before an interpreter allocates them
        sock.sendall(wire.encode_frame({"op": "load"}, one_op_model(2, (1 << 30,))))
    answers = []
    try:
        while True:
            header, _ = wire.recv_frame(sock)
            answers.append(header)
    except (EOFError, OSError):
        pass
    return {"answers": answers, "closed": True}


def main() -> None:
    command, *args = sys.argv[1:]
    if command == "compare":
        result = compare(args[0], int(args[1]))
    elif command == "run":
        result = run(args[0], int(args[1]))
    elif command == "serial":
        result = serial(args[0], int(args[1]))
    elif command == "threads":
        result = threads(args[0], int(args[1]), int(args[2]))
    elif command == "flood":
        flood(args[0], int(args[1]))
        return
    elif command == "connect":
        result = connect(args[0])
    elif command == "hostile":
        result = hostile(args[0], args[1])
    else:
        raise SystemExit(f"unknown command {command}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
