"""The TPU broker as a process: real TFLite on generated models through the libedgetpu double (the CPU
twin), real sockets, real peer checks (clients in a root-owned ``job_<J>`` cgroup, real unix users).
Every assertion is on what the broker answered or counted, never on timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from broker_support import REPO, probe, start_probe, wait_for

from slurm_tpu.protocol import broker_wire as wire


@pytest.mark.parametrize("name", ["classifier", "detector"])
def test_results_through_the_broker_equal_in_process(broker, cgroups, models, name):
    endpoint = broker.open(11, shares=2)
    result = probe(cgroups, 11, endpoint, ["compare", str(models[name]), "6"])
    assert result["equal"] is True
    assert result["stats"][wire.INFERENCES] == 12
    assert result["stats"][wire.LOADS] == 1


def test_cli_infer_runs_through_the_broker_with_no_new_flag(broker, cgroups, models, tmp_path):
    endpoint = broker.open(12)
    images = str(models["images"])
    env = dict(os.environ, SLURM_TPU_BROKER=endpoint, PYTHONPATH=str(REPO))
    env.pop("SLURM_TPU_DEVICES", None)
    cli = [
        sys.executable,
        "-c",
        "from slurm_tpu.cli import run; run()",
        "infer",
        "--model",
        str(models["classifier"]),
        "--labels",
        str(models["classifier_labels"]),
    ]
    through = subprocess.run(
        cgroups.command(12, [*cli, images, "--output", str(tmp_path / "b.jsonl")]),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert through.returncode == 0, through.stderr
    local = subprocess.run(
        [*cli, "--device", "cpu", images, "--output", str(tmp_path / "l.jsonl")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert local.returncode == 0, local.stderr
    records = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert records == [json.loads(line) for line in (tmp_path / "l.jsonl").read_text().splitlines()]
    assert broker.control("stats")["jobs"]["12"][wire.INFERENCES] == len(records)


def test_a_directory_through_the_broker_keeps_several_requests_in_flight_in_order(broker, cgroups, models, tmp_path):
    # MobileNet (milliseconds per inference on the broker's CPU) so that the runner's threads send
    # while the device runs; the broker's own high-water mark of the job's requests shows they overlapped.
    endpoint = broker.open(13)
    env = dict(os.environ, SLURM_TPU_BROKER=endpoint, PYTHONPATH=str(REPO))
    env.pop("SLURM_TPU_DEVICES", None)
    cli = [sys.executable, "-c", "from slurm_tpu.cli import run; run()", "infer", "--model", str(models["mobilenet"])]
    cli += ["--labels", str(models["mobilenet_labels"]), "--top-k", "3", str(models["images"])]
    through = subprocess.run(
        cgroups.command(13, [*cli, "--output", str(tmp_path / "b.jsonl")]),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert through.returncode == 0, through.stderr
    local = subprocess.run(
        [*cli, "--device", "cpu", "--output", str(tmp_path / "l.jsonl")], env=env, capture_output=True, text=True
    )
    assert local.returncode == 0, local.stderr
    records = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert len(records) >= 6
    assert records == [json.loads(line) for line in (tmp_path / "l.jsonl").read_text().splitlines()]
    stats = broker.control("stats")
    assert stats["jobs"]["13"][wire.INFERENCES] == len(records)
    assert stats["in_flight_peak"]["13"] >= 2, stats["in_flight_peak"]


def test_a_serial_client_holds_one_slot_at_a_time(broker, cgroups, models):
    # An idle reader holds no slot, and an answer frees its slot before the client can read it.
    endpoint = broker.open(15)
    result = probe(cgroups, 15, endpoint, ["serial", str(models["classifier"]), "30"])
    assert result == {"done": 30, "wrong": 0, "peak": 1}, result
    assert broker.control("stats")["in_flight_peak"]["15"] == 1


def test_an_engine_shared_by_threads_gets_each_thread_its_own_answers(broker, cgroups, models):
    endpoint = broker.open(14)
    result = probe(cgroups, 14, endpoint, ["threads", str(models["mobilenet"]), "4", "12"])
    assert result == {"done": 48, "wrong": 0, "peak_at_least_2": True}, result


def test_broker_down_is_one_line(cgroups, models, tmp_path):
    env = dict(os.environ, SLURM_TPU_BROKER=str(tmp_path / "gone.sock"), PYTHONPATH=str(REPO))
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from slurm_tpu.cli import run; run()",
            "infer",
            "--model",
            str(models["classifier"]),
            "--benchmark",
            "3",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "broker is not running" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_fair_shares_under_saturation(broker, cgroups, models):
    a, b = broker.open(21, shares=1), broker.open(22, shares=3)
    floods = [
        start_probe(cgroups, 21, a, ["flood", str(models["mobilenet"]), "3"]),
        start_probe(cgroups, 22, b, ["flood", str(models["mobilenet"]), "3"]),
    ]
    try:

        def jobs():
            return broker.control("stats")["jobs"]

        # Both saturating (each has run some), then measure a window of 300 inferences.
        wait_for(
            lambda: all(jobs().get(j, {}).get(wire.INFERENCES, 0) >= 20 for j in ("21", "22")),
            timeout=120,
            what="both jobs running",
        )
        first = jobs()
        start = sum(f[wire.INFERENCES] for f in first.values())
        second = wait_for(
            lambda: (lambda now: now if sum(f[wire.INFERENCES] for f in now.values()) >= start + 300 else None)(jobs()),
            timeout=300,
            what="300 more inferences",
        )
        busy_a = second["21"][wire.BUSY_MS] - first["21"][wire.BUSY_MS]
        busy_b = second["22"][wire.BUSY_MS] - first["22"][wire.BUSY_MS]
        assert all(p.poll() is None for p in floods), "a flooding client stopped: not saturated"
    finally:
        for p in floods:
            p.kill()
            p.wait()
    ratio = busy_b / busy_a
    assert 3 * 0.9 <= ratio <= 3 * 1.1, (busy_a, busy_b, ratio)


@pytest.mark.parametrize(
    "kind",
    ["garbage", "huge", "huge-header", "mismatch", "unknown-model", "not-tflite", "many-outputs", "huge-arena"],
)
def test_hostile_client_gets_one_error_and_harms_no_one(broker, cgroups, models, kind):
    hostile, good = broker.open(31), broker.open(32)
    answer = probe(cgroups, 31, hostile, ["hostile", kind, str(models["classifier"])])
    assert len(answer["answers"]) == 1 and answer["answers"][0]["ok"] is False, answer
    assert len(answer["answers"][0]["error"].splitlines()) == 1
    assert broker.control("ping")["devices_alive"] is True
    # the other job is served, correctly, meanwhile and after
    assert probe(cgroups, 32, good, ["run", str(models["classifier"]), "50"]) == {"done": 50, "wrong": 0}
    assert broker.process.poll() is None


def test_thousands_of_requests_from_one_job_do_not_starve_another(broker, cgroups, models):
    loud, quiet = broker.open(41, shares=1), broker.open(42, shares=1)
    flood = start_probe(cgroups, 41, loud, ["flood", str(models["mobilenet"]), "8"])
    try:
        wait_for(lambda: broker.control("stats")["jobs"].get("41", {}).get(wire.INFERENCES, 0) >= 10, what="the flood")
        assert probe(cgroups, 42, quiet, ["run", str(models["classifier"]), "200"]) == {"done": 200, "wrong": 0}
        assert flood.poll() is None
    finally:
        flood.kill()
        flood.wait()
    figures = broker.control("stats")["jobs"]
    assert figures["41"][wire.INFERENCES] > 0 and figures["42"][wire.INFERENCES] == 200


def test_another_user_cannot_connect_and_same_user_outside_the_job_is_refused(broker, cgroups, models, users):
    alice, bob = sorted(users)
    endpoint = broker.open(51, uid=users[alice], gid=users[alice])
    assert os.stat(endpoint).st_uid == users[alice] and os.stat(endpoint).st_mode & 0o777 == 0o600
    mine = probe(cgroups, 51, endpoint, ["connect", str(models["classifier"])], user=alice)
    assert mine == {"ok": True}
    other_user = probe(cgroups, 51, endpoint, ["connect", str(models["classifier"])], user=bob)
    assert other_user["ok"] is False and "permission denied" in other_user["error"].lower()
    outside = probe(cgroups, None, endpoint, ["connect", str(models["classifier"])], user=alice)
    assert outside["ok"] is False and "not one of its tasks" in outside["error"]
    other_job = probe(cgroups, 52, endpoint, ["connect", str(models["classifier"])], user=alice)
    assert other_job["ok"] is False and "not one of its tasks" in other_job["error"]


def test_close_drops_the_job_and_returns_its_figures(broker, cgroups, models):
    endpoint = broker.open(61)
    probe(cgroups, 61, endpoint, ["run", str(models["classifier"]), "10"])
    closed = broker.control("close", job=61)
    assert closed["ok"] and closed["stats"][wire.INFERENCES] == 10
    assert not os.path.exists(endpoint)
    assert "61" not in broker.control("stats")["jobs"]
    assert json.loads((broker.broker_dir / wire.STATS / "61").read_text())[wire.INFERENCES] == 10
    devices = broker.control("stats")["devices"]
    assert all(d["models"] == 0 for d in devices.values())  # nobody refers to the model: dropped


def test_restart_reopens_endpoints_from_grants(broker, cgroups, models):
    endpoint = broker.open(71, shares=2)
    probe(cgroups, 71, endpoint, ["run", str(models["classifier"]), "5"])
    wait_for(lambda: (broker.broker_dir / wire.STATS / "71").exists(), what="the figures file")
    broker.kill()  # a crash: no cleanup at all
    broker.start()
    assert probe(cgroups, 71, endpoint, ["run", str(models["classifier"]), "5"]) == {"done": 5, "wrong": 0}
    assert broker.control("stats")["jobs"]["71"][wire.INFERENCES] == 10  # the saved figures carried on


def test_the_broker_follows_the_grants(broker, cgroups, models):
    # A grant with no endpoint gets one (no "open" asked), one whose grant goes is closed with no
    # figures file left, a stale figures file goes, and a job the Epilog closed is not re-opened.
    stats = broker.broker_dir / wire.STATS
    (stats / "999").write_text("{}\n")
    broker.grant(91)
    endpoint = wire.endpoint_path(str(broker.state_dir), 91)
    wait_for(lambda: os.path.exists(endpoint), what="the endpoint of a grant nobody opened")
    assert probe(cgroups, 91, endpoint, ["run", str(models["classifier"]), "3"]) == {"done": 3, "wrong": 0}
    wait_for(lambda: not (stats / "999").exists(), what="the stale figures file to go")
    (broker.broker_dir / wire.GRANTS / "91").unlink()
    wait_for(lambda: not os.path.exists(endpoint), what="the endpoint of a job whose grant went")
    wait_for(lambda: "91" not in broker.control("stats")["jobs"] and not (stats / "91").exists(), what="no trace")
    closed = broker.open(92)
    broker.control("close", job=92)
    assert (stats / "92").exists()  # the Epilog's, until it removes the grant
    wait_for(lambda: "92" not in broker.control("stats")["jobs"], what="job 92 closed")
    for stale in ("998", "997"):  # two reconciles seen to run (each removes a stale figures file) ...
        (stats / stale).write_text("{}\n")
        wait_for(lambda: not (stats / stale).exists(), what=f"a reconcile after job 92's close ({stale})")
    assert not os.path.exists(closed) and (stats / "92").exists()  # ... left the closed job closed
    assert broker.control("ping")["devices_alive"] is True


def test_a_model_shared_by_two_jobs_is_loaded_once(broker, cgroups, models):
    a, b = broker.open(81), broker.open(82)
    probe(cgroups, 81, a, ["run", str(models["classifier"]), "3"])
    probe(cgroups, 82, b, ["run", str(models["classifier"]), "3"])
    stats = broker.control("stats")
    assert stats["jobs"]["81"][wire.LOADS] == 1 and stats["jobs"]["82"][wire.LOADS] == 0
    assert sum(d[wire.LOADS] for d in stats["devices"].values()) == 1
    broker.control("close", job=81)
    assert sum(d["models"] for d in broker.control("stats")["devices"].values()) == 1  # job 82 still refers to it


def test_control_socket_serves_root_only(broker, users):
    alice = sorted(users)[0]
    control = wire.control_path(str(broker.state_dir))
    assert os.stat(control).st_mode & 0o777 == 0o600 and os.stat(control).st_uid == 0
    done = subprocess.run(
        [
            "runuser",
            "-u",
            alice,
            "--",
            sys.executable,
            "-c",
            f"import socket; s=socket.socket(socket.AF_UNIX); s.connect({control!r})",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "Permission denied" in done.stderr


def test_no_shared_device_is_one_line_and_nonzero(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "slurm_tpu.broker", "--state-dir", str(tmp_path)],
        env=dict(
            os.environ,
            PYTHONPATH=str(REPO),
            SLURM_TPU_CONFIG=str(tmp_path / "none.yaml"),
            SLURM_TPU_STATE_DIR=str(tmp_path),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr


class _SharedEngine:
    """An engine that may be shared (``in_flight``) and whose runs wait for each other: a barrier
    of ``in_flight`` parties passes only when that many runs are under way at once."""

    label = "edgetpu shard"

    def __init__(self, in_flight: int):
        import threading

        self.inputs: list = []
        self.outputs: list = []
        self.in_flight = in_flight
        self.barrier = threading.Barrier(in_flight, timeout=60)

    def run(self, inputs):
        import numpy as np

        self.barrier.wait()  # BrokenBarrierError (the test fails) unless in_flight runs overlap
        return [np.asarray(inputs[0]) * 2]


def test_the_pipeline_gives_a_shared_engine_its_requests_in_flight_and_keeps_order():
    import numpy as np

    from slurm_tpu.runner.pipeline import Item, infer_ordered

    engine = _SharedEngine(3)
    items = [Item(i, f"k{i}", inputs=[np.array([i])]) for i in range(30)]
    done = list(infer_ordered([engine], iter(items)))
    assert [item.key for item in done] == [f"k{i}" for i in range(30)]
    assert [int(item.outputs[0][0]) for item in done] == [2 * i for i in range(30)]


def test_serve_device_queue_gives_a_shared_engine_its_requests_in_flight():
    import numpy as np

    from slurm_tpu.runner.serve.devicequeue import DeviceQueue

    engine = _SharedEngine(4)
    queue = DeviceQueue([[engine]], capacity=16)
    queue.start()
    try:
        futures = queue.submit_all(0, [[np.array([i])] for i in range(8)])
        assert [int(f.wait(60)[0][0]) for f in futures] == [2 * i for i in range(8)]
    finally:
        queue.close(timeout=60)


def test_frames_read_whole_however_the_stream_is_cut():
    import socket
    import threading

    frames = [
        ({"op": "invoke", "id": 1}, b"x" * 3),
        ({"op": "stats"}, b""),
        ({"ok": True, "pad": "p" * 60000}, b"y" * 200000),  # JSON past the read-ahead, payload past the buffer
        ({"ok": False, "error": "e"}, bytes(range(256)) * 4),
    ]
    stream = b"".join(wire.encode_frame(h, p) for h, p in frames)
    for cut in (1, 7, 4096, len(stream)):
        a, b = socket.socketpair()

        def write(a=a, cut=cut) -> None:
            for i in range(0, len(stream), cut):
                a.sendall(stream[i : i + cut])
            a.close()

        writer = threading.Thread(target=write)
        writer.start()
        reader = wire.FrameReader(b)
        got = []
        for _ in frames:
            header, length = reader.head()
            got.append((header, bytes(reader.payload(length))))
        with pytest.raises(EOFError):
            reader.head()
        writer.join()
        b.close()
        assert got == frames, cut


def test_a_send_the_socket_takes_in_part_is_finished_in_order():
    import socket
    import threading

    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    big = bytes(range(256)) * 4096  # 1 MiB: more than the socket takes at once
    rest = wire.try_send(a, wire.frame_parts({"ok": True, "id": 1}, [big[:1000], big[1000:]]))
    assert rest  # not all of it went
    reader = wire.FrameReader(b)
    got = []

    def read() -> None:
        for _ in range(2):
            header, length = reader.head()
            got.append((header, bytes(reader.payload(length))))

    thread = threading.Thread(target=read)
    thread.start()
    wire.send_parts(a, rest)
    wire.send_frame(a, {"ok": True, "id": 2}, b"z")
    thread.join(60)
    assert got == [({"ok": True, "id": 1}, big), ({"ok": True, "id": 2}, b"z")]
    a.close()
    b.close()


def test_a_foreign_or_oversized_frame_is_refused_on_its_head():
    import socket

    from slurm_tpu.protocol import FormatError

    for head in (b"GET / HTTP/1.1\r\n", wire.HEAD.pack(wire.MAGIC, 1 << 30, 0), wire.HEAD.pack(wire.MAGIC, 2, 1 << 31)):
        a, b = socket.socketpair()
        a.sendall(head)
        with pytest.raises(FormatError):
            wire.FrameReader(b).head()
        a.close()
        b.close()


def test_a_device_thread_survives_an_answer_that_raises_and_is_charged(models):
    # An answer that cannot be made (ValueError: a header past MAX_HEADER; MemoryError) becomes the
    # requester's error answer; the device thread goes on, and ping's devices_alive stays true.
    import threading

    import numpy as np

    from slurm_tpu.broker.executor import DevicePool, SharedDevice, Work
    from slurm_tpu.broker.models import ModelRegistry

    registry = ModelRegistry()
    pool = DevicePool([SharedDevice("cpu-0", None, None)], registry)
    pool.start()
    try:
        pool.add_job(1, 1)
        entry, _ = registry.add(1, models["classifier"].read_bytes())
        pool.prepare(entry, 1)
        assert pool.figures(1).busy_s > 0 and pool.figures(1).loads == 1  # the build is the job's device time
        inputs = [np.zeros(s.shape, s.dtype) for s in entry.inputs]
        answers: list = []
        finished = threading.Event()

        def failing(kind):
            def done(outputs, error, busy, wait):
                answers.append((kind, outputs is not None, error))
                if error is None:
                    raise kind("the answer cannot be made")
                finished.set() if kind is MemoryError else None

            return done

        for kind in (ValueError, MemoryError):
            pool.submit(Work(1, entry.sha256, inputs, failing(kind)))
        assert finished.wait(60)
        assert [a[:2] for a in answers] == [
            (ValueError, True),
            (ValueError, False),
            (MemoryError, True),
            (MemoryError, False),
        ]
        assert all("could not send" in a[2] for a in answers[1::2])
        ok = threading.Event()
        pool.submit(Work(1, entry.sha256, inputs, lambda o, e, b, w: ok.set() if e is None else None))
        assert ok.wait(60) and pool.alive()
        assert pool.figures(1).inferences == 3
        before = [list(d.samples) for d in pool._devices]
        pool.device_figures()
        pool.device_figures()
        assert [list(d.samples) for d in pool._devices] == before  # stats read the window, never shorten it
    finally:
        pool.stop()


def test_a_jobs_model_room_is_checked_and_taken_at_once(models):
    from slurm_tpu.broker.models import LimitError, ModelRegistry

    registry = ModelRegistry(max_models_per_job=1)
    data = models["classifier"].read_bytes()
    registry.add(1, data)
    registry.add(1, data)  # the same model again: no more room needed
    with pytest.raises(LimitError):
        registry.add(1, models["detector"].read_bytes())
    registry.add(2, models["detector"].read_bytes())
