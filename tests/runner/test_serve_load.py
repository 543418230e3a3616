"""Load and faults on loopback: `slurm-tpu serve` (the real command, in its own process) under
8 concurrent clients sending a fixed number of requests, a fifth of them malformed.

Every valid request must get the right answer, every bad one its 4xx, the server must
still answer afterwards, its peak memory must stay bounded, and SIGTERM must stop it
cleanly (exit 0, every request counted).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from serve_support import raw_exchange

from slurm_tpu.runner import Runner
from slurm_tpu.runner.serve import auth

CLIENTS = 8
REQUESTS_PER_CLIENT = 40
MAX_BODY_MIB = 1
GROWTH_LIMIT = 64 << 20  # peak RSS over the warmed-up server; 8 clients x 16 MiB declared bodies would exceed it


def _kib(status_text: str, field: str) -> int:
    line = next(line for line in status_text.splitlines() if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


@pytest.fixture
def server_process(models, clean_env, tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = dict(clean_env, HOME=str(home), SLURM_JOB_ID="9191")
    log = open(tmp_path / "serve.log", "w+")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slurm_tpu.cli",
            "serve",
            f"{models['classifier']}=c",
            "-l",
            str(models["classifier_labels"]),
            "--host",
            "127.0.0.1",
            "--queue",
            "16",
            "--max-body",
            str(MAX_BODY_MIB),
            "--max-connections",
            str(2 * CLIENTS),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        # The address file appears once the server listens (it is renamed into place whole).
        address = _wait_for_address(process, env, log)
        yield process, address, env, log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        log.close()


def _wait_for_address(process, env, log) -> auth.Address:
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            return auth.read_address("9191", env)
        except auth.AddressFileError:
            if process.poll() is not None:
                log.seek(0)
                raise AssertionError(f"serve exited {process.returncode}: {log.read()}") from None
            time.sleep(0.1)
    raise AssertionError("no address file within 60 s")


def _bad_requests(token: str, image: bytes) -> list[tuple[str, bytes, int]]:
    """(what, raw HTTP request, expected status) for the malformed share of the load."""

    def post(path: str, body: bytes, auth_header: str = f"Bearer {token}", extra: str = "") -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth_header}\r\nContent-Length: {len(body)}\r\n"
            f"{extra}Connection: close\r\n\r\n"
        ).encode() + body

    oversized = (
        f"POST /v1/models/c:classify HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Length: {16 << 20}\r\n\r\n"
    ).encode()
    return [
        ("malformed JSON", post("/v1/models/c:predict", b'{"instances": [[1,'), 400),
        ("wrong shape", post("/v1/models/c:predict", b'{"instances": [[1, 2]]}'), 400),
        ("not an image", post("/v1/models/c:classify", b"\x89PNG but not really"), 400),
        ("wrong token", post("/v1/models/c:classify", image, "Bearer nope"), 401),
        ("no token", post("/v1/models/c:classify", image, "Basic x"), 401),
        ("unknown model", post("/v1/models/other:classify", image), 404),
        ("oversized", oversized, 413),
    ]


def test_concurrent_clients_with_faults(server_process, models, clean_env):
    process, address, env, log = server_process
    images = sorted(models["images"].glob("*.png"))
    with Runner(str(models["classifier"]), labels=str(models["classifier_labels"]), environ=clean_env) as runner:
        expected = {p.name: runner.task.record(runner.run(str(p))) for p in images}
        tensors = {p.name: runner.load(str(p))[0][0].tolist() for p in images}
        outputs = {p.name: runner.infer(runner.load(str(p)))[0][0].tolist() for p in images}
    port = int(address.url.rsplit(":", 1)[1])
    bad = _bad_requests(address.token, images[0].read_bytes())
    # Warm up (first inferences, imports), then take the baseline.
    assert raw_exchange(port, _post(address.token, "/v1/models/c:classify", images[0].read_bytes())).startswith(
        b"HTTP/1.1 200"
    )
    with open(f"/proc/{process.pid}/status") as handle:
        baseline = _kib(handle.read(), "VmRSS")
    failures: list[str] = []
    counts = {"valid": 0, "bad": 0}
    lock = threading.Lock()

    def client(number: int) -> None:
        import http.client

        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for i in range(REQUESTS_PER_CLIENT):
            image = images[(number + i) % len(images)]
            if i % 5 == 4:  # every fifth: malformed, on its own connection (some close it)
                what, request, status = bad[(number + i) % len(bad)]
                answer = raw_exchange(port, request)
                ok = answer.startswith(f"HTTP/1.1 {status}".encode()) and b'"error"' in answer
                with lock:
                    counts["bad"] += 1
                    if not ok:
                        failures.append(f"{what}: {answer[:120]!r}")
                continue
            headers = {"Authorization": f"Bearer {address.token}"}
            if i % 2:
                connection.request("POST", "/v1/models/c:classify", body=image.read_bytes(), headers=headers)
                want = expected[image.name]
            else:
                body = json.dumps(
                    {"instances": [tensors[image.name], {"b64": base64.b64encode(image.read_bytes()).decode()}]}
                ).encode()
                connection.request("POST", "/v1/models/c:predict", body=body, headers=headers)
                want = {"predictions": [outputs[image.name]] * 2}
            response = connection.getresponse()
            answer = json.loads(response.read())
            got = {k: v for k, v in answer.items() if k in want}
            with lock:
                counts["valid"] += 1
                if response.status != 200 or got != want:
                    failures.append(f"{image.name}: {response.status} {answer}")
        connection.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not failures, failures[:5]
    assert counts == {"valid": CLIENTS * REQUESTS_PER_CLIENT * 4 // 5, "bad": CLIENTS * REQUESTS_PER_CLIENT // 5}
    assert process.poll() is None
    assert raw_exchange(port, _get(address.token, "/v1/models/c")).startswith(b"HTTP/1.1 200")
    with open(f"/proc/{process.pid}/status") as handle:
        peak = _kib(handle.read(), "VmHWM")
    assert peak - baseline < GROWTH_LIMIT, f"peak RSS grew by {(peak - baseline) >> 20} MiB"
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0
    log.seek(0)
    text = log.read()
    answered = 1 + CLIENTS * REQUESTS_PER_CLIENT + 1  # warm-up, the load, the status check
    assert "SIGTERM: stopping" in text and f"stopped after {answered} requests; devices released" in text, text
    assert not os.path.exists(auth.address_path("9191", env))


def _post(token: str, path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


def _get(token: str, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n".encode()
