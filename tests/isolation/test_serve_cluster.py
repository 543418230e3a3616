"""`slurm-tpu serve` as a real Slurm job on a leased Edge TPU (real slurmctld/slurmd, the
project's hooks, real users stpu_alice and stpu_bob).

The libedgetpu test double stands in for the TPU silicon (the model runs on the CPU
behind a real lease). Every wait is on an observable event: the address file, the job
state, the hooks' audit log.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from support import HARDWARE, audit, finish_cluster, make_cluster, require_root_and_slurm, wait_until

from helpers import double_root

pytestmark = pytest.mark.slurm
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALICE, BOB = "stpu_alice", "stpu_bob"
USB = "/sys/bus/usb/devices/2-1.3"

SERVE_JOB = """#!/bin/sh
export HOME={home} SLURM_TPU_LIBEDGETPU={double} EDGETPU_DOUBLE_DEVICES=usb:{usb} EDGETPU_DOUBLE_ROOT={root}
exec {python} -m slurm_tpu.cli serve {model}=classifier -l {labels} --host 127.0.0.1 --drain-timeout 1
"""

# A job whose server dies (SIGKILL here, the OOM killer in life) while the job goes on.
SERVE_IN_BACKGROUND_JOB = """#!/bin/sh
export HOME={home} SLURM_TPU_LIBEDGETPU={double} EDGETPU_DOUBLE_DEVICES=usb:{usb} EDGETPU_DOUBLE_ROOT={root}
{python} -m slurm_tpu.cli serve {model}=classifier -l {labels} --host 127.0.0.1 --drain-timeout 1 &
wait
sleep 600
"""

# Bob's listener on the dead server's port: records every byte each connection sends (one file per
# connection, written as it arrives) and answers every request with 200 and '{}'. Writes 'ready'
# once listening; on finding 'stop' it drains connections still in its backlog, writes 'done' and
# exits; it exits by itself after 120 s.
SQUATTER = r"""
import os, selectors, socket, sys, time
port, out = int(sys.argv[1]), sys.argv[2]
end = time.monotonic() + 120
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
while True:
    try:
        listener.bind(("127.0.0.1", port))
        break
    except OSError:
        if time.monotonic() > end:
            raise
        time.sleep(0.1)
listener.listen(16)
listener.setblocking(False)
open(os.path.join(out, "ready.tmp"), "w").close()
os.rename(os.path.join(out, "ready.tmp"), os.path.join(out, "ready"))
selector = selectors.DefaultSelector()
selector.register(listener, selectors.EVENT_READ)
count = 0
def accept_all():
    global count
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return
        conn.setblocking(False)
        selector.register(conn, selectors.EVENT_READ, open(os.path.join(out, f"conn{count}"), "wb", buffering=0))
        count += 1
def serve(timeout):
    for key, _ in selector.select(timeout):
        if key.fileobj is listener:
            accept_all()
            continue
        try:
            data = key.fileobj.recv(65536)
        except OSError:
            data = b""
        if not data:
            selector.unregister(key.fileobj)
            key.fileobj.close()
            continue
        key.data.write(data)
        for _ in range(data.count(b"\r\n\r\n")):
            key.fileobj.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
while time.monotonic() < end and not os.path.exists(os.path.join(out, "stop")):
    serve(0.1)
accept_all()
serve(0.5)
open(os.path.join(out, "done"), "w").close()
"""

PREDICT = """
import base64, json, sys, urllib.request
address = json.load(open(sys.argv[1]))
body = json.dumps({"instances": [{"b64": base64.b64encode(open(p, "rb").read()).decode()} for p in sys.argv[2:]]})
request = urllib.request.Request(address["url"] + "/v1/models/classifier:predict", data=body.encode(),
                                 headers={"Authorization": "Bearer " + address["token"]})
print(urllib.request.urlopen(request, timeout=30).read().decode())
"""


@pytest.fixture(scope="module")
def setup(users):
    require_root_and_slurm()
    from harness.localcluster.cluster import NodeSpec
    from harness.modelgen import write_models

    sys.path.insert(0, TESTS)
    from edgetpu_double.build import build_double

    shared = tempfile.mkdtemp(prefix="slurm-tpu-serve-", dir="/tmp")
    os.chmod(shared, 0o755)
    models = write_models(os.path.join(shared, "models"), image_count=6)
    os.makedirs(os.path.join(shared, "double"))
    double = build_double(os.path.join(shared, "double"))
    homes = {}
    for user in (ALICE, BOB):
        homes[user] = os.path.join(shared, f"home-{user}")
        os.makedirs(homes[user], mode=0o700)
        os.chown(homes[user], users[user], users[user])
    cluster = make_cluster([NodeSpec("n1", os.path.join(HARDWARE, "n4_one_tpu.umockdev"))])
    yield cluster, models, double, homes
    finish_cluster(cluster)
    subprocess.run(["rm", "-rf", shared], check=False)


def as_user(user: str, home: str, argv: list[str], *env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["runuser", "-u", user, "--", "env", f"HOME={home}", *env, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )


def slurm_tpu(*args: str) -> list[str]:
    return [sys.executable, "-m", "slurm_tpu.cli", *map(str, args)]


def _submit_server(cluster, models, double, homes, log: str, script: str) -> int:
    """Submit a serve job ``script`` (SERVE_JOB or a variant) as Alice, its output to ``log``; its id."""
    return cluster.sbatch(
        ["--gres=tpu:1", "-o", log, "-e", log],
        script.format(
            home=homes[ALICE],
            double=double,
            usb=USB,
            root=double_root(cluster),
            python=sys.executable,
            model=models["classifier"],
            labels=models["classifier_labels"],
        ),
        user=ALICE,
    )


def _published_address(cluster, homes, job: int, log: str) -> tuple[str, dict]:
    """Wait for the serve job to publish its address file; (its path, its content)."""
    address_file = os.path.join(homes[ALICE], ".slurm-tpu", "serve", f"{job}.json")
    wait_until(
        lambda: os.path.exists(address_file) or cluster.job_state(job) not in ("PENDING", "RUNNING", "CONFIGURING", ""),
        90,
        f"job {job} to publish its address",
    )
    assert os.path.exists(address_file), open(log).read()
    return address_file, json.load(open(address_file))


def test_served_model_answers_its_owner_only_and_stops_cleanly_on_scancel(setup, users):
    cluster, models, double, homes = setup
    out = os.path.join(cluster.base, "out")
    log = os.path.join(out, "serve.out")
    job = _submit_server(cluster, models, double, homes, log, SERVE_JOB)
    address_file, address = _published_address(cluster, homes, job, log)
    assert os.stat(address_file).st_mode & 0o777 == 0o600 and os.stat(address_file).st_uid == users[ALICE]
    host_port = address["url"].split("://")[1]
    assert address["url"] in open(log).read() and address["token"] not in open(log).read()

    # The owner's client answers as local inference does (same model, same inputs).
    remote, local = os.path.join(out, "remote.jsonl"), os.path.join(out, "local.jsonl")
    done = as_user(
        ALICE,
        homes[ALICE],
        slurm_tpu("infer", "--server", job, "classifier", models["images"], "-k", "2", "-o", remote, "--no-progress"),
    )
    assert done.returncode == 0, done.stderr
    local_run = subprocess.run(
        slurm_tpu(
            "infer",
            models["classifier"],
            models["images"],
            "-k",
            "2",
            "-o",
            local,
            "-l",
            models["classifier_labels"],
            "--no-progress",
        ),
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("SLURM")},
    )
    assert local_run.returncode == 0, local_run.stderr
    assert open(remote).read() == open(local).read()
    image = os.path.join(models["images"], "img_00002.png")
    single = as_user(ALICE, homes[ALICE], slurm_tpu("infer", "--server", job, "classifier", image, "--json", "-c", "1"))
    local_single = subprocess.run(
        slurm_tpu("infer", models["classifier"], image, "-l", models["classifier_labels"], "--json", "-c", "1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(single.stdout)["classes"] == json.loads(local_single.stdout)["classes"]
    assert json.loads(single.stdout)["devices"] == ["edgetpu usb-2-1.3"]

    # TF Serving's :predict from a plain urllib script.
    predicted = as_user(ALICE, homes[ALICE], [sys.executable, "-c", PREDICT, address_file, image])
    assert predicted.returncode == 0, predicted.stderr
    scores = json.loads(predicted.stdout)["predictions"][0]
    assert scores.index(max(scores)) == 2

    # Bob knows host and port: no token, a guessed token, Alice's file, his own client: all refused.
    url = f"http://{host_port}/v1/models/classifier"
    for extra in ([], ["-H", "Authorization: Bearer " + base64.urlsafe_b64encode(os.urandom(32)).decode()]):
        code = as_user(BOB, homes[BOB], ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", *extra, url])
        assert code.stdout == "401"
    assert as_user(BOB, homes[BOB], ["cat", address_file]).returncode != 0
    stolen = as_user(BOB, homes[BOB], slurm_tpu("infer", "--server", job, "classifier", image))
    assert stolen.returncode == 2 and f"no server address for job {job}" in stolen.stderr

    # What the server counted, before it goes.
    metrics = subprocess.run(
        ["curl", "-s", "-H", f"Authorization: Bearer {address['token']}", f"http://{host_port}/metrics"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    from prometheus_client.parser import text_string_to_metric_families

    [inferences] = [
        s.value
        for f in text_string_to_metric_families(metrics)
        for s in f.samples
        if s.name == "slurm_tpu_serve_inferences_total"
    ]
    assert inferences == 6 + 1 + 1  # the batch, the single input, the predict

    cluster.command(["scancel", str(job)], user=ALICE)
    released = wait_until(
        lambda: [e for e in audit(cluster, "n1") if e.get("job_id") == job and e["event"] == "release"],
        60,
        f"the epilog to release job {job}'s TPU",
    )
    assert [e["identity"] for e in released] == ["usb-2-1.3"]
    text = open(log).read()
    assert "SIGTERM: stopping" in text and "devices released" in text and "cut off" not in text, text
    assert not os.path.exists(address_file)
    usage = [e for e in audit(cluster, "n1") if e.get("job_id") == job and e["event"] == "usage"]
    assert [(e["identity"], e["inferences"]) for e in usage] == [("usb-2-1.3", inferences)]
    assert cluster.job_state(job) == "CANCELLED"


# -- a server killed without clean-up: its address file stays, another user takes its port ------


def _start_and_kill(cluster, models, double, homes, script: str) -> tuple[int, dict, str]:
    """Submit ``script`` as Alice, wait for its address file, SIGKILL the server; (job, address, log)."""
    log = os.path.join(cluster.base, "out", f"serve-{time.monotonic_ns()}.out")
    job = _submit_server(cluster, models, double, homes, log, script)
    address_file, address = _published_address(cluster, homes, job, log)
    os.kill(address["pid"], signal.SIGKILL)  # no clean-up: the address file stays
    wait_until(lambda: not os.path.exists(f"/proc/{address['pid']}"), 30, "the server to die")
    assert os.path.exists(address_file)
    return job, address, log


def _squat(homes, port: int) -> tuple[subprocess.Popen, str]:
    """Bob listens on ``port`` (once it is free); his recorder's directory."""
    out = tempfile.mkdtemp(prefix="squatter-", dir=homes[BOB])
    os.chown(out, *(os.stat(homes[BOB]).st_uid,) * 2)
    squatter = subprocess.Popen(["runuser", "-u", BOB, "--", sys.executable, "-c", SQUATTER, str(port), out], cwd="/")
    wait_until(
        lambda: os.path.exists(os.path.join(out, "ready")) or squatter.poll() is not None,
        60,
        "Bob's listener on the port",
    )
    assert squatter.poll() is None
    return squatter, out


def _squatter_saw(squatter: subprocess.Popen, out: str) -> list[bytes]:
    """Stop Bob's listener (it drains its backlog first); what each connection sent it."""
    open(os.path.join(out, "stop"), "w").close()
    try:
        squatter.wait(60)
    finally:
        if squatter.poll() is None:
            squatter.kill()
            squatter.wait(10)
    assert os.path.exists(os.path.join(out, "done"))
    return [open(os.path.join(out, name), "rb").read() for name in sorted(os.listdir(out)) if name.startswith("conn")]


def _one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurm-tpu: error:") and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_a_squatter_on_a_killed_servers_port_never_gets_the_token(setup, users):
    """The job goes on after its server was SIGKILLed; Bob binds the port. Alice's client asks Bob's
    listener for the proof, gets none, and stops: one line, exit 2, no token sent."""
    cluster, models, double, homes = setup
    job, address, log = _start_and_kill(cluster, models, double, homes, SERVE_IN_BACKGROUND_JOB)
    try:
        port = int(address["url"].rsplit(":", 1)[1])
        squatter, out = _squat(homes, port)
        try:
            assert cluster.job_state(job) == "RUNNING"
            image = os.path.join(models["images"], "img_00002.png")
            done = as_user(
                ALICE,
                homes[ALICE],
                slurm_tpu("infer", "--server", job, "classifier", image),
                f"SLURM_CONF={cluster.slurm_conf}",
            )
            line = _one_line_error(done)
            assert "did not prove" in line and "token was not sent" in line, line
        finally:
            seen = _squatter_saw(squatter, out)
    finally:
        cluster.command(["scancel", str(job)], user=ALICE)
        cluster.wait_for_jobs([job], 60)
    assert seen and all(b"/v1/slurm-tpu/proof" in s for s in seen), seen  # it was asked, and only that
    assert not any(address["token"].encode() in s or b"Authorization" in s for s in seen), seen


def test_an_address_file_of_a_job_that_ended_is_not_trusted(setup, users):
    """The server was the job (exec) and was SIGKILLed, so the job ended; Bob binds the port.
    Alice's client learns from Slurm that the job no longer runs and does not connect at all."""
    cluster, models, double, homes = setup
    job, address, log = _start_and_kill(cluster, models, double, homes, SERVE_JOB)
    states = cluster.wait_for_jobs([job], 60)
    assert states[job] != "RUNNING"
    squatter, out = _squat(homes, int(address["url"].rsplit(":", 1)[1]))
    try:
        image = os.path.join(models["images"], "img_00002.png")
        done = as_user(
            ALICE,
            homes[ALICE],
            slurm_tpu("infer", "--server", job, "classifier", image),
            f"SLURM_CONF={cluster.slurm_conf}",
        )
        line = _one_line_error(done)
        assert f"job {job} is not running" in line, line
    finally:
        seen = _squatter_saw(squatter, out)
    assert seen == []


# -- a slow-header flood by another user ----------------------------------------------------------

FLOODER = os.path.join(TESTS, "serve_flooder.py")
FLOOD, TRICKLE, FLOOD_SECONDS = 128, 2.0, 20.0  # the server's head deadline is 10 s, its idle timeout 30 s
OWNER_REQUESTS = 5
SLACK = 4.0


def test_a_slow_header_flood_by_another_user_never_locks_out_the_owner(setup, users):
    """Bob trickles 128 request heads (one line every 2 s) at Alice's server; every one of Alice's curls
    (fresh connections, her token) and her client's request made while the flood goes on is answered,
    and no flood connection outlives the head deadline by much. (How fast she is answered under a flood
    is bench/bench_serve_http.py's to measure.)"""
    cluster, models, double, homes = setup
    log = os.path.join(cluster.base, "out", "serve-flood.out")
    job = _submit_server(cluster, models, double, homes, log, SERVE_JOB)
    try:
        _, address = _published_address(cluster, homes, job, log)
        port = int(address["url"].rsplit(":", 1)[1])
        flood = subprocess.Popen(
            [
                "runuser",
                "-u",
                BOB,
                "--",
                sys.executable,
                FLOODER,
                str(port),
                str(FLOOD),
                str(TRICKLE),
                str(FLOOD_SECONDS),
            ],
            stdin=subprocess.PIPE,  # it floods until this closes (and FLOOD_SECONDS have passed)
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        try:
            curl = [
                "curl",
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{time_total}",
                "-H",
                f"Authorization: Bearer {address['token']}",
                f"{address['url']}/v1/models/classifier",
            ]
            assert json.loads(flood.stdout.readline()) == {"started": FLOOD}  # all open: now Alice comes
            answers = [
                (as_user(ALICE, homes[ALICE], curl).stdout.split() or ["no answer"])[0] for _ in range(OWNER_REQUESTS)
            ]
            image = os.path.join(models["images"], "img_00002.png")
            client = as_user(
                ALICE,
                homes[ALICE],
                slurm_tpu("infer", "--server", job, "classifier", image, "--json"),
                f"SLURM_CONF={cluster.slurm_conf}",
            )
            assert flood.poll() is None  # every one of her requests came while the flood went on
            report = json.loads(flood.communicate(timeout=FLOOD_SECONDS + 30)[0])
        finally:
            if flood.poll() is None:
                flood.kill()
                flood.wait(10)
    finally:
        cluster.command(["scancel", str(job)], user=ALICE)
        cluster.wait_for_jobs([job], 60)
    assert answers == ["200"] * OWNER_REQUESTS, answers
    assert client.returncode == 0 and json.loads(client.stdout)["classes"], client.stderr
    assert report["opened"] > FLOOD and not report["answers"], report["answers"][:5]
    longest = max(report["lifetimes"] + report["still_open"])
    assert longest <= 10 + SLACK, f"a flood connection stayed {longest:.1f} s (head deadline 10 s)"
