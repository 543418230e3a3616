"""slurm-tpu serve on loopback: TF Serving's REST API, task endpoints equal to `infer --json`,
refusals of bad input, queueing to devices, overload, graceful stop, the address file.

Models are the project's generated ones in the real LiteRT runtime; Edge TPUs are the
libedgetpu test double (the model runs on the CPU behind it).
"""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import stat
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from runner_support import USB_A, USB_B, run_cli
from serve_support import Client, GatedEngine, raw_exchange, start_server

from slurm_tpu.protocol.usage import read_record
from slurm_tpu.runner import Runner
from slurm_tpu.runner.serve import auth
from slurm_tpu.runner.serve.app import Limits
from slurm_tpu.runner.serve.devicequeue import DeviceQueue, Overloaded


@pytest.fixture(scope="module")
def served(tmp_path_factory, request):
    """classifier, detector and segmenter served on the CPU (module-wide: opened once)."""
    from harness.modelgen import write_models

    models = write_models(tmp_path_factory.mktemp("serve-models"), image_count=6)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_VISIBLE_DEVICES"))}
    server = start_server(
        [
            (str(models["classifier"]), "classifier"),
            (str(models["detector"]), "det"),
            (str(models["segmenter"]), "seg"),
        ],
        {
            "classifier": str(models["classifier_labels"]),
            "det": str(models["detector_labels"]),
            "seg": str(models["segmenter_labels"]),
        },
        env,
    )
    yield server, models, env
    server.stop(5)


def _images(models) -> list:
    return sorted(models["images"].glob("*.png"))


def _scenes(models) -> list:
    return sorted(models["scenes"].glob("*.png"))


def _local_json(model, labels, path, env, *extra) -> dict:
    done = run_cli(["infer", model, path, "-l", labels, "--json", "-c", "1", *extra], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


_RECORD = ("classes", "objects", "size", "outputs")


def _record(answer: dict) -> dict:
    return {k: v for k, v in answer.items() if k in _RECORD}


# -- TF Serving's API -------------------------------------------------------------------


def test_status_and_metadata_are_tf_servings(served):
    server, models, _ = served
    client = Client(server)
    assert client.json("GET", "/v1/models/classifier") == (
        200,
        {
            "model_version_status": [
                {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
            ]
        },
    )
    assert client.json("GET", "/v1/models/classifier/versions/1")[0] == 200
    status, metadata = client.json("GET", "/v1/models/det/metadata")
    assert status == 200 and metadata["model_spec"] == {"name": "det", "signature_name": "", "version": "1"}
    signature = metadata["metadata"]["signature_def"]["signature_def"]["serving_default"]
    (only,) = signature["inputs"].values()
    with Runner(str(models["detector"])) as runner:
        spec = runner.input_specs[0]
    assert only["dtype"] == "DT_UINT8" and [int(d["size"]) for d in only["tensor_shape"]["dim"]] == list(spec.shape)
    assert len(signature["outputs"]) == 4 and metadata["metadata"]["slurm_tpu"]["task"] == "detect"


def test_predict_rows_columns_and_b64_equal_the_runners_outputs(served):
    server, models, env = served
    client = Client(server)
    with Runner(str(models["classifier"]), environ=env) as runner:
        tensors = [runner.load(str(p))[0] for p in _images(models)[:3]]
        expected = [runner.infer([t])[0][0].tolist() for t in tensors]
    status, rows = client.json("POST", "/v1/models/classifier:predict", {"instances": [t[0].tolist() for t in tensors]})
    assert status == 200 and rows == {"predictions": expected}
    status, columns = client.json("POST", "/v1/models/classifier:predict", {"inputs": [t[0].tolist() for t in tensors]})
    assert status == 200 and columns == {"outputs": expected}
    b64 = [{"b64": base64.b64encode(p.read_bytes()).decode()} for p in _images(models)[:3]]
    assert client.json("POST", "/v1/models/classifier:predict", {"instances": b64}) == (200, {"predictions": expected})


def test_predict_with_plain_urllib_as_a_tf_serving_client_would(served):
    server, models, _ = served
    image = _images(models)[1]
    body = json.dumps({"instances": [{"b64": base64.b64encode(image.read_bytes()).decode()}]}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/v1/models/classifier:predict",
        data=body,
        headers={"Authorization": f"Bearer {server.token}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        predictions = json.load(response)["predictions"]
    assert int(np.argmax(predictions[0])) == 1  # img_00001 is bright in region 1 (modelgen's answer)


# -- task endpoints equal `slurm-tpu infer --json` ---------------------------------------


@pytest.mark.parametrize(
    "kind, model, labels, name, inputs",
    [
        ("classify", "classifier", "classifier_labels", "classifier", _images),
        ("detect", "detector", "detector_labels", "det", _scenes),
        ("segment", "segmenter", "segmenter_labels", "seg", _scenes),
    ],
)
def test_task_endpoints_answer_what_infer_json_prints(served, kind, model, labels, name, inputs):
    server, models, env = served
    client = Client(server)
    for path in inputs(models)[:3]:
        local = _local_json(str(models[model]), str(models[labels]), str(path), env, "-k", "3")
        status, answer = client.json("POST", f"/v1/models/{name}:{kind}?top_k=3", body=path.read_bytes())
        assert status == 200 and answer["task"] == kind, answer
        assert _record(answer) == _record(local)
    scene = _scenes(models)[-1]
    assert client.json("POST", f"/v1/models/{name}:raw", body=scene.read_bytes())[1]["task"] == "raw"


def test_json_task_request_and_npy_body(served):
    server, models, env = served
    client = Client(server)
    image = _images(models)[2]
    status, answer = client.json(
        "POST", "/v1/models/classifier:classify", {"b64": base64.b64encode(image.read_bytes()).decode(), "top_k": 2}
    )
    assert status == 200 and [c["index"] for c in answer["classes"]][:1] == [2] and len(answer["classes"]) == 2
    with Runner(str(models["classifier"]), environ=env) as runner:
        tensor = runner.load(str(image))[0]
    buffer = io.BytesIO()
    np.save(buffer, tensor[0])
    status, answer = client.json("POST", "/v1/models/classifier:classify", body=buffer.getvalue())
    assert status == 200 and answer["classes"][0]["index"] == 2


# -- bad input: the right 4xx, one line, and the server stays up -------------------------


def _npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


BAD_REQUESTS = [
    # (what, method, path, body, headers, status, words in the error)
    ("malformed JSON", "POST", "/v1/models/classifier:predict", b'{"instances": [1, 2', {}, 400, "malformed JSON"),
    ("not an object", "POST", "/v1/models/classifier:predict", b"[1, 2]", {}, 400, "'instances'"),
    (
        "wrong shape",
        "POST",
        "/v1/models/classifier:predict",
        b'{"instances": [[1, 2, 3]]}',
        {},
        400,
        "wants [24, 24, 3]",
    ),
    ("ragged", "POST", "/v1/models/classifier:predict", b'{"instances": [[[1], [1, 2]]]}', {}, 400, "rectangular"),
    (
        "strings",
        "POST",
        "/v1/models/classifier:predict",
        json.dumps({"instances": [[[["a"] * 3] * 24] * 24]}).encode(),
        {},
        400,
        "strings",
    ),
    (
        "fractions for uint8",
        "POST",
        "/v1/models/classifier:predict",
        json.dumps({"instances": [[[[0.5] * 3] * 24] * 24]}).encode(),
        {},
        400,
        "whole numbers",
    ),
    (
        "out of range",
        "POST",
        "/v1/models/classifier:predict",
        json.dumps({"instances": [[[[300] * 3] * 24] * 24]}).encode(),
        {},
        400,
        "0..255",
    ),
    ("bad base64", "POST", "/v1/models/classifier:predict", b'{"instances": [{"b64": "%%%"}]}', {}, 400, "base64"),
    (
        "b64 not an image",
        "POST",
        "/v1/models/classifier:predict",
        json.dumps({"instances": [{"b64": base64.b64encode(b"hello").decode()}]}).encode(),
        {},
        400,
        "not a readable image",
    ),
    (
        "too many instances",
        "POST",
        "/v1/models/classifier:predict",
        json.dumps({"instances": [{"b64": ""}] * 65}).encode(),
        {},
        400,
        "at most 64",
    ),
    (
        "deep JSON",
        "POST",
        "/v1/models/classifier:predict",
        b'{"instances": ' + b"[" * 100000 + b"]" * 100000 + b"}",
        {},
        400,
        "malformed JSON",
    ),
    (
        "non-image bytes",
        "POST",
        "/v1/models/classifier:classify",
        b"GIF89a not really",
        {},
        400,
        "not a readable image",
    ),
    ("empty body", "POST", "/v1/models/classifier:classify", b"", {}, 400, "empty body"),
    ("decompression bomb", "POST", "/v1/models/classifier:classify", None, {}, 400, "pixels"),
    (
        "npy of the wrong shape",
        "POST",
        "/v1/models/classifier:classify",
        _npy(np.zeros((5, 5), np.uint8)),
        {},
        400,
        "shape (5, 5)",
    ),
    ("npy claiming a huge shape", "POST", "/v1/models/classifier:classify", None, {}, 400, "shape (1000000000,"),
    ("bad option", "POST", "/v1/models/classifier:classify?top_k=zero", b"x", {}, 400, "top_k"),
    ("task the model lacks", "POST", "/v1/models/classifier:detect", b"x", {}, 400, "--task detect needs"),
    ("unknown model", "GET", "/v1/models/nope", None, {}, 404, "no model 'nope'"),
    ("unknown version", "GET", "/v1/models/classifier/versions/7", None, {}, 404, "only version 1"),
    ("unknown method", "POST", "/v1/models/classifier:explode", b"{}", {}, 404, "no method"),
    ("unknown path", "GET", "/etc/passwd", None, {}, 404, "no endpoint"),
    ("wrong verb", "GET", "/v1/models/classifier:predict", None, {}, 405, "takes POST"),
    ("missing token", "GET", "/v1/models/classifier", None, {"Authorization": ""}, 401, "token"),
    ("wrong token", "GET", "/v1/models/classifier", None, {"Authorization": "Bearer guess"}, 401, "token"),
    ("wrong scheme", "GET", "/metrics", None, {"Authorization": "Basic Zm9vOmJhcg=="}, 401, "token"),
]


def _body(what: str, body: bytes | None) -> bytes | None:
    if what == "decompression bomb":  # a 30000 x 30000 PNG header: tiny file, 900 megapixels
        from PIL import Image

        buffer = io.BytesIO()
        Image.new("1", (30000, 30000)).save(buffer, format="PNG")
        return buffer.getvalue()
    if what == "npy claiming a huge shape":
        header = b"{'descr': '|u1', 'fortran_order': False, 'shape': (1000000000,), }"
        header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
        return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 16
    return body


@pytest.mark.parametrize(
    "what, method, path, body, headers, status, words", BAD_REQUESTS, ids=[r[0] for r in BAD_REQUESTS]
)
def test_bad_requests_get_the_right_status_and_one_line(served, what, method, path, body, headers, status, words):
    server, _, _ = served
    client = Client(server)
    got, answer_headers, data = client.request(method, path, _body(what, body), headers)
    error = json.loads(data)["error"]
    assert got == status and words in error and "\n" not in error, (got, error)
    if status == 401:
        assert answer_headers.get("WWW-Authenticate", "").startswith("Bearer")
    assert Client(server).json("GET", "/v1/models/classifier")[0] == 200  # still serving


def test_oversized_and_unsized_bodies_are_refused_before_they_are_read(served):
    server, _, _ = served
    limit = server.app.limits.max_body
    head = (
        f"POST /v1/models/classifier:classify HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.token}\r\n"
        f"Content-Length: {limit + 1}\r\n\r\n"
    ).encode()
    answer = raw_exchange(server.port, head)  # no body sent: the answer cannot wait for it
    assert answer.startswith(b"HTTP/1.1 413") and b"Connection: close" in answer
    chunked = (
        f"POST /v1/models/classifier:classify HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.token}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    assert raw_exchange(server.port, chunked).startswith(b"HTTP/1.1 411")
    unauthorized = f"POST /v1/models/classifier:classify HTTP/1.1\r\nHost: x\r\nContent-Length: {limit}\r\n\r\n"
    assert raw_exchange(server.port, unauthorized.encode()).startswith(b"HTTP/1.1 401")
    assert raw_exchange(server.port, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400")
    # A refused POST whose body was not read closes the connection: the body is never taken
    # for the next request (here a pipelined GET that must not be answered).
    pipelined = (
        f"POST /v1/models/nope:predict HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.token}\r\n"
        "Content-Length: 25\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n"
    ).encode()
    answer = raw_exchange(server.port, pipelined)
    assert answer.startswith(b"HTTP/1.1 404") and answer.count(b"HTTP/1.1") == 1 and b"Connection: close" in answer


def test_metrics_are_prometheus_text(served):
    from prometheus_client.parser import text_string_to_metric_families

    server, models, _ = served
    client = Client(server)
    client.request("POST", "/v1/models/classifier:classify", _images(models)[0].read_bytes())
    client.request("GET", "/v1/models/nope")
    status, headers, data = client.request("GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(data.decode())}
    requests = {tuple(sorted(s.labels.items())): s.value for s in families["slurm_tpu_serve_requests"].samples}
    assert requests[(("code", "200"), ("endpoint", "classify"), ("model", "classifier"))] >= 1
    assert requests[(("code", "404"), ("endpoint", "other"), ("model", ""))] >= 1  # the name is not a label
    assert families["slurm_tpu_serve_request_duration_seconds"].type == "histogram"
    inferences = {s.labels["model"]: s.value for s in families["slurm_tpu_serve_inferences"].samples}
    assert inferences["classifier"] >= 1
    assert any(s.value > 0 for s in families["slurm_tpu_serve_device_seconds"].samples)


# -- devices: one inference at a time each, spread, bounded -----------------------------


@pytest.fixture
def tpu_process(tpu_env, monkeypatch) -> dict[str, str]:
    """tpu_env in this very process: the double and the runner read os.environ."""
    for key, value in tpu_env.items():
        monkeypatch.setenv(key, value)
    return tpu_env


@pytest.fixture
def two_tpus(tpu_process, monkeypatch) -> dict[str, str]:
    env = dict(tpu_process, SLURM_TPU_DEVICES="usb-2-1.3,usb-2-1.4", SLURM_TPU_EDGETPU_PATHS=f"usb:{USB_A},usb:{USB_B}")
    for key in ("SLURM_TPU_DEVICES", "SLURM_TPU_EDGETPU_PATHS"):
        monkeypatch.setenv(key, env[key])
    return env


def test_requests_spread_over_devices_never_two_at_once_on_one(models, two_tpus):
    gated: list[GatedEngine] = []

    def wrap(engine):
        gated.append(GatedEngine(engine))
        return gated[-1]

    server = start_server([(str(models["classifier"]), "c")], {}, two_tpus, wrap=wrap)
    try:
        image = (models["images"] / "img_00004.png").read_bytes()
        answers: list[int] = []
        threads = [
            threading.Thread(
                target=lambda: answers.append(Client(server).request("POST", "/v1/models/c:classify", image)[0])
            )
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        # Both devices take one request each and hold it: the other two must wait in the queue.
        for engine in gated:
            assert engine.entered.acquire(timeout=30)
        assert [g.label for g in gated] == ["edgetpu usb-2-1.3", "edgetpu usb-2-1.4"]
        for engine in gated:
            engine.gate.release(4)  # whichever device takes the two queued ones
        for t in threads:
            t.join(30)
        assert answers == [200] * 4
        assert [g.most_at_once for g in gated] == [1, 1]
    finally:
        server.stop(5)


def test_a_full_queue_answers_503_with_retry_after(models, tpu_process):
    gated: list[GatedEngine] = []

    def wrap(engine):
        gated.append(GatedEngine(engine))
        return gated[-1]

    server = start_server([(str(models["classifier"]), "c")], {}, tpu_process, limits=Limits(queue=1), wrap=wrap)
    try:
        image = (models["images"] / "img_00004.png").read_bytes()
        answers: list[int] = []
        first = threading.Thread(
            target=lambda: answers.append(Client(server).request("POST", "/v1/models/c:classify", image)[0])
        )
        first.start()
        assert gated[0].entered.acquire(timeout=30)  # the device holds the first
        second = threading.Thread(
            target=lambda: answers.append(Client(server).request("POST", "/v1/models/c:classify", image)[0])
        )
        second.start()
        wait_for(lambda: server.queue.depth == 1, "the second request to queue")
        status, headers, data = Client(server).request("POST", "/v1/models/c:classify", image)
        assert status == 503 and int(headers["Retry-After"]) >= 1 and "queue" in json.loads(data)["error"]
        gated[0].gate.release(2)
        first.join(30)
        second.join(30)
        assert answers == [200, 200]
    finally:
        server.stop(5)


def test_device_queue_is_all_or_nothing_and_refuses_when_closing():
    class Echo:
        label, inputs, outputs = "echo", [], []

        def run(self, inputs):
            return list(inputs)

    gated = GatedEngine(Echo())
    queue = DeviceQueue([[gated]], capacity=2)
    queue.start()
    running = queue.submit(0, [np.zeros(1)])
    assert gated.entered.acquire(timeout=10)
    with pytest.raises(Overloaded):
        queue.submit_all(0, [[np.ones(1)]] * 3)  # 3 do not fit in 2 places: none is run
    kept = queue.submit_all(0, [[np.full(1, 2.0)]] * 2)
    gated.gate.release(10)
    assert [float(i.wait(10)[0][0]) for i in [running, *kept]] == [0.0, 2.0, 2.0]
    queue.close(10)
    with pytest.raises(Overloaded, match="shutting down"):
        queue.submit(0, [np.zeros(1)])
    assert gated.most_at_once == 1


def test_connections_beyond_the_cap_get_503_and_only_token_holders_count(models, clean_env):
    server = start_server([(str(models["classifier"]), "c")], {}, clean_env, limits=Limits(max_connections=2))
    holders = [Client(server) for _ in range(2)]
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]  # never show the token
    try:
        for client in holders:  # kept alive: each holds one of the two places
            assert client.json("GET", "/v1/models/c")[0] == 200
        wait_for(
            lambda: server.app.connections == 2 and server.app.pending_connections == 4,
            "two authenticated and four pending connections",
        )
        get = f"GET /v1/models/c HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.token}\r\n\r\n".encode()
        answer = raw_exchange(server.port, get)
        assert answer.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in answer and b"too many connections" in answer
        assert raw_exchange(server.port, b"GET /v1/models/c HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 401")
        holders.pop().close()
        wait_for(lambda: server.app.connections == 1, "a place to free up")
        assert raw_exchange(server.port, get.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")).startswith(
            b"HTTP/1.1 200"
        )
    finally:
        for sock in idle:
            sock.close()
        for client in holders:
            client.close()
        server.stop(5)


# -- graceful stop ------------------------------------------------------------------------


def test_stop_finishes_requests_in_flight_refuses_new_ones_and_writes_usage(models, tpu_process, tmp_path):
    box = tmp_path / "box"  # the job's usage box (a private tmpfs in a real job)
    box.mkdir(mode=0o700)
    env = dict(tpu_process, SLURM_TPU_USAGE_DIR=str(box), SLURM_JOB_ID="4343")
    gated: list[GatedEngine] = []

    def wrap(engine):
        gated.append(GatedEngine(engine))
        return gated[-1]

    server = start_server([(str(models["classifier"]), "c")], {}, env, wrap=wrap)
    image = (models["images"] / "img_00003.png").read_bytes()
    client = Client(server)
    answers: list = []
    in_flight = threading.Thread(
        target=lambda: answers.append(client.json("POST", "/v1/models/c:classify", body=image))
    )
    in_flight.start()
    assert gated[0].entered.acquire(timeout=30)
    stopped: list[bool] = []
    stopper = threading.Thread(target=lambda: stopped.append(server.stop(30)))
    stopper.start()
    wait_for(lambda: server.app.draining and server.http.socket.fileno() == -1, "the listening socket to close")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5)
    gated[0].gate.release()
    in_flight.join(30)
    stopper.join(30)
    assert answers[0][0] == 200 and answers[0][1]["classes"][0]["index"] == 3
    assert stopped == [True]
    box_fd = os.open(box, os.O_RDONLY | os.O_DIRECTORY)
    record = read_record(box_fd, "usb-2-1.4", os.getuid())
    os.close(box_fd)
    assert record is not None and record.inferences == 1


# -- the address file -----------------------------------------------------------------------


def test_address_file_is_private_atomic_and_never_follows_links(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home)}
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    os.makedirs(home / ".slurm-tpu" / "serve", mode=0o755)  # too open: tightened, since it is ours
    os.symlink(victim, home / ".slurm-tpu" / "serve" / "12.json")
    address = auth.Address("12", "http://n1:5000", auth.new_token(), "n1", 1)
    path = auth.write_address(address, env)
    assert victim.read_text() == "untouched" and not os.path.islink(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(home / ".slurm-tpu" / "serve").st_mode) == 0o700
    assert auth.read_address("12", env) == address
    assert auth.find_address("n1:5000", env) == address
    os.chmod(path, 0o644)
    with pytest.raises(auth.AddressFileError, match="not trusted"):
        auth.read_address("12", env)
    auth.remove_address(address, env)
    assert os.path.exists(path)  # not removed: no longer a trusted copy of ours
    os.chmod(path, 0o600)
    auth.remove_address(address, env)
    assert not os.path.exists(path)
    with pytest.raises(Exception, match="not a Slurm job id"):
        auth.read_address("../../etc/passwd", env)


def test_address_directory_of_another_owner_or_a_link_is_refused(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, home / ".slurm-tpu")
    address = auth.Address("5", "http://n1:1", "t")
    with pytest.raises(auth.AddressFileError, match="not a symlink"):
        auth.write_address(address, {"HOME": str(home)})
    os.unlink(home / ".slurm-tpu")
    (home / ".slurm-tpu").mkdir(mode=0o700)
    os.chown(home / ".slurm-tpu", 12345, 12345)
    with pytest.raises(auth.AddressFileError, match="belongs to uid 12345"):
        auth.write_address(address, {"HOME": str(home)})


def test_token_comparison():
    token = auth.new_token()
    assert len(token) >= 40 and auth.new_token() != token
    assert auth.token_matches(f"Bearer {token}", token) and auth.token_matches(f"bearer  {token} ", token)
    assert not any(
        auth.token_matches(h, token) for h in (None, "", token, f"Bearer {token}x", f"Basic {token}", "Bearer \udcff")
    )


# -- the client -------------------------------------------------------------------------------


def test_infer_server_writes_what_local_infer_writes(served, tmp_path):
    server, models, env = served
    home = tmp_path / "home"
    home.mkdir()
    auth.write_address(auth.Address("31", server.url, server.token), {"HOME": str(home)})
    client_env = dict(env, HOME=str(home))
    local = tmp_path / "local.jsonl"
    remote = tmp_path / "remote.jsonl"
    assert (
        run_cli(
            [
                "infer",
                models["classifier"],
                models["images"],
                "-l",
                models["classifier_labels"],
                "-k",
                "2",
                "-o",
                local,
                "--no-progress",
            ],
            env,
        ).returncode
        == 0
    )
    done = run_cli(
        [
            "infer",
            "--server",
            "31",
            "classifier",
            models["images"],
            "-k",
            "2",
            "-o",
            remote,
            "--no-progress",
            "--in-flight",
            "3",
        ],
        client_env,
    )
    assert done.returncode == 0, done.stderr
    assert remote.read_text() == local.read_text()
    single = run_cli(
        [
            "infer",
            "--server",
            f"127.0.0.1:{server.port}",
            models["classifier"],
            models["images"] / "img_00002.png",
            "--json",
            "-c",
            "3",
        ],
        client_env,
    )
    record = json.loads(single.stdout)
    assert record["classes"][0]["label"] == "top-right" and len(record["times_ms"]) == 2
    refused = run_cli(["infer", "--server", "32", "classifier", models["images"]], client_env)
    assert refused.returncode == 2 and "no server address for job 32" in refused.stderr
    local_only = run_cli(["infer", "--server", "31", "classifier", models["images"], "--device", "cpu"], client_env)
    assert local_only.returncode == 2 and "--device: set at the server" in local_only.stderr


def wait_for(predicate, what: str, timeout: float = 30) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_several_models_share_the_jobs_tpu_under_one_lock(models, tpu_process):
    from runner_support import double_log

    from slurm_tpu.runner.errors import DeviceBusyError
    from slurm_tpu.runner.lock import DeviceLock

    server = start_server([(str(models["classifier"]), "c"), (str(models["detector"]), "d")], {}, tpu_process)
    try:
        creates = [e for e in double_log(tpu_process) if e["call"] == "create"]
        assert [e["path"] for e in creates] == [USB_B, USB_B]  # one delegate per model, the same device
        with pytest.raises(DeviceBusyError):  # held once, by this process: another process is refused
            DeviceLock("usb-2-1.4", tpu_process)
        client = Client(server)
        assert client.json("POST", "/v1/models/c:classify", body=(models["images"] / "img_00005.png").read_bytes())[1][
            "devices"
        ] == ["edgetpu usb-2-1.4"]
        scene = sorted(models["scenes"].glob("*.png"))[-1]
        assert client.json("POST", "/v1/models/d:detect", body=scene.read_bytes())[0] == 200
    finally:
        server.stop(5)
