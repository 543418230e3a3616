"""TPU shares end to end (issue 32, item 8): real Slurm, the project's hooks, the node agent, the node's
TPU broker (``python -m slurm_tpu.broker``, started by LocalCluster) and two real unix users.

One cluster for the module: n4 has one USB Edge TPU (tests/isolation/hardware/n4_one_tpu), shared
with 4 shares, so the node offers ``tpu_shard:4`` and no ``tpu``. The broker's libedgetpu is the test
double (tests/edgetpu_double): models run on the CPU twin behind it, so "results equal" means equal to
the same model run in-process with ``--device cpu``. The jobs themselves get no libedgetpu at all: a
shard job reaches the TPU only through its endpoint.

Every wait is on an observable event: a job's state, a file its script or the test creates, the
broker's pid file, a figure the broker reports; a job waits for the test on a file the test creates.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.localcluster import NodeSpec
from helpers import REPO, TESTS, wait_until
from slurm_tpu.protocol import broker_wire
from slurm_tpu.slurm.parse import parse_key_values

pytestmark = pytest.mark.slurm

ALICE, BOB = "stpu_alice", "stpu_bob"
NODE = "n4"
STICK, USB = "usb-2-1.3", "/sys/bus/usb/devices/2-1.3"
IMAGES = 12
PROBE = TESTS / "broker" / "probe.py"
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")

# A job that records what it was given, then waits (bounded) for the test's go file before its body.
JOB = """#!/bin/sh
export HOME={home} PYTHONPATH={repo}
o={dir}
env | grep '^SLURM_TPU_' | sort > $o/$SLURM_JOB_ID.env
{early}
touch $o/$SLURM_JOB_ID.started
i=0
while [ ! -e {go} ] && [ $i -lt 3000 ]; do sleep 0.1; i=$((i+1)); done
[ -e {go} ] || exit 3
{body}
"""


@pytest.fixture(scope="module")
def site(cluster_factory, users):
    """The cluster, the generated models, each user's private directory, the CPU answers."""
    from harness.localcluster.cluster import project_hooks
    from harness.modelgen import write_models

    sys.path.insert(0, str(TESTS))
    from edgetpu_double.build import build_double

    shared = Path(tempfile.mkdtemp(prefix="slurm-tpu-shards-", dir="/tmp"))
    os.chmod(shared, 0o755)  # the jobs' users read the models and reach their own directories
    models = write_models(shared / "models", image_count=IMAGES)
    (shared / "double").mkdir()
    double = build_double(shared / "double")
    dirs = {}
    for user in (ALICE, BOB):
        dirs[user] = shared / user
        dirs[user].mkdir(mode=0o700)
        os.chown(dirs[user], users[user], users[user])
    cluster = cluster_factory(
        [NodeSpec(NODE, str(TESTS / "isolation" / "hardware" / "n4_one_tpu.umockdev"), cpus=8)],
        hooks=project_hooks(),
        node_config_extra={"version": 2, "families": {"edgetpu": {"shared": [STICK], "shares_per_device": 4}}},
        broker_env={
            "SLURM_TPU_LIBEDGETPU": str(double),
            "EDGETPU_DOUBLE_DEVICES": f"usb:{USB}",
            "EDGETPU_DOUBLE_LOG": str(shared / "double.log"),
        },
    )
    spool = cluster.accounting_spool(NODE)
    os.makedirs(spool, mode=0o700, exist_ok=True)  # what the collector's first run makes: the epilog spools
    expected = shared / "cpu.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "slurm_tpu.cli", "infer", "--device", "cpu", str(models["classifier"]),
         str(models["images"]), "-k", "3", "-o", str(expected), "--no-progress"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    yield Site(cluster, models, dirs, shared, results(expected), users)
    shutil.rmtree(shared, ignore_errors=True)


class Site:
    def __init__(self, cluster, models, dirs, shared, expected, uids):
        self.cluster, self.models, self.dirs, self.shared, self.expected, self.uids = (
            cluster, models, dirs, shared, expected, uids,
        )  # fmt: skip
        self.count = 0

    @property
    def state_dir(self) -> str:
        return self.cluster.state_dir(NODE)

    def go(self, name: str) -> Path:
        return self.shared / f"{name}.go"

    def submit(self, user: str, body: str, go: str, early: str = "", gres: str = "tpu_shard:1") -> int:
        directory = self.dirs[user]
        script = JOB.format(home=directory, repo=REPO, dir=directory, go=self.go(go), early=early, body=body)
        log = directory / "%j.log"
        return self.cluster.sbatch(["-w", NODE, f"--gres={gres}", "-o", str(log), "-e", str(log)], script, user=user)

    def infer(self, user: str, output: str = "$o/$SLURM_JOB_ID.jsonl", extra: str = "") -> str:
        """The shell line running ``slurm-tpu infer`` on the images, no device flag (the broker's)."""
        return (
            f"{extra}{sys.executable} -m slurm_tpu.cli infer {self.models['classifier']} {self.models['images']} "
            f"-k 3 -o {output} --no-progress"
        )

    def file(self, user: str, job: int, suffix: str) -> Path:
        return self.dirs[user] / f"{job}{suffix}"

    def log(self, user: str, job: int) -> str:
        path = self.file(user, job, ".log")
        return path.read_text() if path.exists() else ""

    def env(self, user: str, job: int) -> dict[str, str]:
        lines = self.file(user, job, ".env").read_text().splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line)

    def started(self, user: str, jobs: list[int]) -> bool:
        for job in jobs:
            if self.cluster.job_state(job) in FINAL:
                raise AssertionError(f"job {job} ended before it started: {self.log(user, job)}")
        return all(self.file(user, job, ".started").exists() for job in jobs)

    def wait(self, jobs: list[int], timeout: float = 300) -> dict[int, str]:
        return self.cluster.wait_for_jobs(jobs, timeout=timeout)

    def broker_stats(self) -> dict:
        from slurm_tpu.hooks.shards import ask

        answer = ask(self.state_dir, {"op": "stats"}, timeout=30)
        assert answer["ok"], answer
        return answer


def results(path: Path) -> dict[str, dict]:
    """A results file's records by input."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {record["input"]: record for record in records}


def device_node(site: Site) -> os.stat_result:
    """The shared stick's usbfs node on n4 (the simulated /dev the broker's double opens)."""
    root = Path(site.cluster.node_dir(NODE))
    busnum = (root / "sys" / USB.lstrip("/").removeprefix("sys/") / "busnum").read_text().strip()
    devnum = (root / "sys" / USB.lstrip("/").removeprefix("sys/") / "devnum").read_text().strip()
    return os.stat(root / "dev" / "bus" / "usb" / f"{int(busnum):03d}" / f"{int(devnum):03d}")


def audit(site: Site) -> list[dict]:
    """n4's audit log."""
    path = Path(site.state_dir) / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def assert_node_serves(site: Site) -> None:
    """n4 is not drained (sinfo) and the shared stick stays root's, 0600."""
    text = site.cluster.command(["sinfo", "-h", "-N", "-n", NODE, "-o", "%N %T %E"]).stdout.split()
    assert text[1].rstrip("*~#") in ("idle", "mixed", "allocated", "completing"), text
    info = device_node(site)
    assert (info.st_uid, info.st_mode & 0o777) == (0, 0o600), (info.st_uid, oct(info.st_mode))


# ---- 1. scheduling and results -------------------------------------------------------------------


def test_four_shard_jobs_of_two_users_run_at_once_through_the_broker(site):
    cluster = site.cluster
    users = [ALICE, BOB, ALICE, BOB]
    jobs = [site.submit(user, site.infer(user), go="four") for user in users]
    try:
        wait_until(lambda: all(site.started(u, [j]) for u, j in zip(users, jobs)), 120, "4 shard jobs started")
        # All four RUNNING at once on the one shared stick (only 4 shares exist: they are all taken).
        states = {job: cluster.job_state(job) for job in jobs}
        assert set(states.values()) == {"RUNNING"}, states
        for user, job in zip(users, jobs):
            env = site.env(user, job)
            endpoint = env[broker_wire.ENDPOINT_ENV]
            assert endpoint == broker_wire.endpoint_path(site.state_dir, job), env
            assert env[broker_wire.SHARDS_ENV] == "1", env
            info = os.stat(endpoint)
            assert stat.S_ISSOCK(info.st_mode) and info.st_mode & 0o777 == 0o600, oct(info.st_mode)
            assert info.st_uid == site.uids[user], (info.st_uid, user)
        assert {str(job) for job in jobs} <= set(site.broker_stats()["jobs"])  # the broker holds all four
    finally:
        site.go("four").touch()
    states = site.wait(jobs)
    assert set(states.values()) == {"COMPLETED"}, {j: site.log(u, j) for u, j in zip(users, jobs)}
    for user, job in zip(users, jobs):
        assert results(site.file(user, job, ".jsonl")) == site.expected
        assert spooled(site, job)["shard_inferences"] == IMAGES  # every image ran on the broker
    assert_node_serves(site)


# ---- 4. epilog cleanup and the books -------------------------------------------------------------


def test_a_finished_jobs_endpoint_grant_and_stats_are_gone_and_its_figures_are_spooled(site):
    from slurm_tpu.protocol.job_record import decode_spool

    job = site.submit(ALICE, site.infer(ALICE), go="cleanup")
    wait_until(lambda: site.started(ALICE, [job]), 120, f"job {job} started")
    broker = Path(site.state_dir) / broker_wire.BROKER_DIR
    assert (broker / broker_wire.GRANTS / str(job)).exists()
    assert (broker / broker_wire.ENDPOINTS / f"{job}.sock").exists()
    site.go("cleanup").touch()
    assert site.wait([job]) == {job: "COMPLETED"}, site.log(ALICE, job)
    assert results(site.file(ALICE, job, ".jsonl")) == site.expected
    for path in (
        broker / broker_wire.ENDPOINTS / f"{job}.sock",
        broker / broker_wire.GRANTS / str(job),
        broker / broker_wire.STATS / str(job),
    ):
        assert not os.path.lexists(path), path
    assert str(job) not in site.broker_stats()["jobs"]
    spooled = Path(site.cluster.accounting_spool(NODE)) / str(job)
    entry = decode_spool(spooled.read_bytes(), str(spooled))
    assert entry.job_id == job and entry.shards is not None, entry
    assert entry.shards["shards"] == 1, entry.shards
    assert entry.shards["shard_busy_ms"] > 0, entry.shards
    assert entry.shards["shard_inferences"] == IMAGES, entry.shards


# ---- 2. isolation --------------------------------------------------------------------------------

CONNECT = """
import errno, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    sock.connect(sys.argv[1])
    print("connected")
except OSError as exc:
    print(errno.errorcode.get(exc.errno, exc.errno))
"""

READ = """
import errno, sys
try:
    open(sys.argv[1]).read()
    print("read")
except OSError as exc:
    print(errno.errorcode.get(exc.errno, exc.errno))
"""


def test_another_user_and_another_job_of_the_same_user_cannot_use_a_jobs_endpoint(site):
    a1 = site.submit(ALICE, site.infer(ALICE), go="iso-a1")
    try:
        wait_until(lambda: site.started(ALICE, [a1]), 120, f"job {a1} started")
        endpoint = broker_wire.endpoint_path(site.state_dir, a1)
        # A's results so far (the test's own file in A's private directory, as a finished run leaves it).
        secret = site.file(ALICE, a1, ".secret")
        secret.write_text("A's results\n")
        os.chown(secret, site.uids[ALICE], site.uids[ALICE])
        b = site.submit(
            BOB,
            f"{sys.executable} -c '{CONNECT}' {endpoint} > $o/$SLURM_JOB_ID.connect\n"
            f"{sys.executable} -c '{READ}' {secret} > $o/$SLURM_JOB_ID.read\n"
            f"{sys.executable} -c '{READ}' {site.file(ALICE, a1, '.jsonl')} >> $o/$SLURM_JOB_ID.read\n",
            go="iso-b",
        )
        site.go("iso-b").touch()
        a2 = site.submit(
            ALICE, site.infer(ALICE, extra=f"SLURM_TPU_BROKER={endpoint} ") + " 2> $o/$SLURM_JOB_ID.err", go="iso-a2"
        )
        site.go("iso-a2").touch()
        states = site.wait([b, a2])
        assert states[b] == "COMPLETED", site.log(BOB, b)
        assert site.file(BOB, b, ".connect").read_text().split() == ["EACCES"]
        assert site.file(BOB, b, ".read").read_text().split() == ["EACCES", "EACCES"]
        assert states[a2] == "FAILED", site.log(ALICE, a2)
        said = [line for line in site.file(ALICE, a2, ".err").read_text().splitlines() if line.strip()]
        assert len(said) == 1, said
        assert f"belongs to job {a1}" in said[0] and "not one of its tasks" in said[0], said
        assert not site.file(ALICE, a2, ".jsonl").exists()
    finally:
        site.go("iso-a1").touch()
    assert site.wait([a1]) == {a1: "COMPLETED"}, site.log(ALICE, a1)
    assert results(site.file(ALICE, a1, ".jsonl")) == site.expected  # its job's own use was never disturbed
    assert_node_serves(site)


HOSTILE = f"""
{sys.executable} {PROBE} hostile garbage {{model}} > $o/$SLURM_JOB_ID.garbage
{sys.executable} {PROBE} hostile huge {{model}} > $o/$SLURM_JOB_ID.huge
{sys.executable} {PROBE} flood {{model}} 8 > $o/$SLURM_JOB_ID.flood &
flood=$!
i=0
while [ ! -e {{stop}} ] && [ $i -lt 3000 ]; do sleep 0.1; i=$((i+1)); done
kill $flood
"""


def test_a_hostile_job_harms_no_other_job(site):
    model = site.models["classifier"]
    hostile = site.submit(BOB, HOSTILE.format(model=model, stop=site.go("hostile-stop")), go="hostile")
    site.go("hostile").touch()
    try:
        flooding = site.file(BOB, hostile, ".flood")
        wait_until(lambda: flooding.exists() and flooding.read_text().strip(), 120, "the hostile job's flood")
        for kind in ("garbage", "huge"):
            answer = json.loads(site.file(BOB, hostile, f".{kind}").read_text())
            assert answer["closed"] and [a["ok"] for a in answer["answers"]] == [False], answer
        # Thousands of requests in flight from the hostile job while the good one runs.
        wait_until(
            lambda: site.broker_stats()["jobs"].get(str(hostile), {}).get("inferences", 0) >= 1000,
            300,
            "the hostile job's first thousand requests",
        )
        good = site.submit(ALICE, site.infer(ALICE), go="good")
        site.go("good").touch()
        assert site.wait([good]) == {good: "COMPLETED"}, site.log(ALICE, good)
        assert results(site.file(ALICE, good, ".jsonl")) == site.expected
        assert site.cluster.job_state(hostile) == "RUNNING"  # it flooded all along
        assert_node_serves(site)
    finally:
        site.go("hostile-stop").touch()
    assert site.wait([hostile])[hostile] == "COMPLETED", site.log(BOB, hostile)
    assert_node_serves(site)


FLOOD = f"""
{sys.executable} {PROBE} flood {{model}} 4 > $o/$SLURM_JOB_ID.flood &
flood=$!
i=0
while [ ! -e {{stop}} ] && [ $i -lt 3000 ]; do sleep 0.1; i=$((i+1)); done
kill $flood
"""


def test_device_time_follows_the_shares_under_saturation(site):
    """Two users' jobs holding 1 and 3 of the TPU's 4 shares, each keeping the broker saturated (4
    connections, requests always in flight): over a window that opens once both run, each job's device
    time (the broker's own figures) splits 1:3, within 10%."""
    model = site.models["mobilenet"]  # milliseconds per inference: device time dominates the window
    one = site.submit(ALICE, FLOOD.format(model=model, stop=site.go("fair-stop")), go="fair", gres="tpu_shard:1")
    three = site.submit(BOB, FLOOD.format(model=model, stop=site.go("fair-stop")), go="fair", gres="tpu_shard:3")
    site.go("fair").touch()

    def busy() -> dict[int, float]:
        jobs = site.broker_stats()["jobs"]
        return {job: float(jobs.get(str(job), {}).get(broker_wire.BUSY_MS, 0.0)) for job in (one, three)}

    try:
        # Both saturating: each has run some requests (their clients keep several in flight from then on).
        wait_until(lambda: all(value > 300 for value in busy().values()), 300, "both jobs running on the TPU")
        start = busy()
        wait_until(lambda: sum(busy().values()) - sum(start.values()) > 6000, 600, "6 s of device time")
        end = busy()
        used = {job: end[job] - start[job] for job in (one, three)}
        assert 2.7 <= used[three] / used[one] <= 3.3, used
        assert site.cluster.job_state(one) == site.cluster.job_state(three) == "RUNNING"  # saturating throughout
    finally:
        site.go("fair-stop").touch()
    assert site.wait([one, three]) == {one: "COMPLETED", three: "COMPLETED"}, site.log(ALICE, one)
    assert_node_serves(site)


# ---- 3. broker crash and restart -----------------------------------------------------------------


def test_the_broker_killed_and_restarted_serves_its_jobs_again(site):
    cluster = site.cluster
    waiting = site.submit(ALICE, site.infer(ALICE), go="crash")
    try:
        wait_until(lambda: site.started(ALICE, [waiting]), 120, f"job {waiting} started")
        endpoint = broker_wire.endpoint_path(site.state_dir, waiting)
        cluster.kill_broker(NODE)
        # A job whose Prolog runs while the broker is down starts anyway; its client says one line.
        down = site.submit(BOB, site.infer(BOB) + " 2> $o/$SLURM_JOB_ID.err", go="crash-down")
        site.go("crash-down").touch()
        assert site.wait([down])[down] == "FAILED", site.log(BOB, down)  # infer failed, the job ran
        said = [line for line in site.file(BOB, down, ".err").read_text().splitlines() if line.strip()]
        assert len(said) == 1 and "broker is not running" in said[0], said
        assert site.env(BOB, down)[broker_wire.ENDPOINT_ENV] == broker_wire.endpoint_path(site.state_dir, down)
        # The node's trail: one record from its Prolog (slurmd logs a successful Prolog's output only at
        # debug2) and one from its Epilog, which could not close it either. Never a drain.
        records = [e for e in audit(site) if e["event"] == "broker-unavailable" and e.get("job_id") == down]
        assert [e["reason"].split(":")[0] for e in records] == ["open", "close"], records
        assert all(e["uid"] == site.uids[BOB] for e in records), records
        assert_node_serves(site)
        cluster.start_broker(NODE)
        wait_until(lambda: os.path.exists(endpoint), 30, "the waiting job's endpoint")
        info = os.stat(endpoint)
        assert info.st_uid == site.uids[ALICE] and info.st_mode & 0o777 == 0o600
    finally:
        site.go("crash").touch()
    assert site.wait([waiting]) == {waiting: "COMPLETED"}, site.log(ALICE, waiting)
    assert results(site.file(ALICE, waiting, ".jsonl")) == site.expected
    assert str(down) not in site.broker_stats()["jobs"]
    assert_node_serves(site)


# ---- 5. whole TPUs refused, the Runner API and serve through the broker ---------------------------


def test_a_whole_tpu_job_is_refused_where_the_only_tpu_is_shared(site):
    refused = site.cluster.command(["sbatch", "-w", NODE, "--gres=tpu:1", "--wrap", "true"], check=False, user=ALICE)
    assert refused.returncode != 0
    assert "Requested node configuration is not available" in refused.stderr, refused.stderr


RUNNER_API = """
import json, sys
from slurm_tpu.runner.api import Runner
with Runner(sys.argv[1]) as runner:
    out = {"devices": runner.device_labels, "bench": runner.benchmark(iterations=20).as_dict()}
    out["classes"] = [[c.index, round(float(c.score), 6)] for c in runner.classify(sys.argv[2], top_k=3)]
print(json.dumps(out))
"""


def test_the_runner_api_runs_through_the_broker(site):
    image = sorted(site.models["images"].glob("*.png"))[0]
    job = site.submit(
        ALICE, f"{sys.executable} -c '{RUNNER_API}' {site.models['classifier']} {image} > $o/$SLURM_JOB_ID.api",
        go="api",
    )  # fmt: skip
    site.go("api").touch()
    assert site.wait([job]) == {job: "COMPLETED"}, site.log(ALICE, job)
    answer = json.loads(site.file(ALICE, job, ".api").read_text())
    expected = site.expected[str(image)]["classes"]
    assert answer["classes"] == [[c["index"], c["score"]] for c in expected], answer
    assert answer["devices"] == ["edgetpu shard"], answer["devices"]
    # Every inference it made ran on the broker: the job's books count them (the benchmark's and the one).
    figures = spooled(site, job)
    assert figures["shard_inferences"] >= 21 and figures["shard_busy_ms"] > 0, figures


SERVE = "exec {python} -m slurm_tpu.cli serve {model}=classifier --host 127.0.0.1 --drain-timeout 1"


def test_serve_in_a_shard_job_answers_through_the_broker(site):
    job = site.submit(ALICE, SERVE.format(python=sys.executable, model=site.models["classifier"]), go="serve")
    site.go("serve").touch()
    address = site.dirs[ALICE] / ".slurm-tpu" / "serve" / f"{job}.json"
    try:
        wait_until(
            lambda: address.exists() or site.cluster.job_state(job) in FINAL, 120, f"job {job} to publish its address"
        )
        assert address.exists(), site.log(ALICE, job)
        remote = site.dirs[ALICE] / f"{job}.remote.jsonl"
        done = subprocess.run(
            ["runuser", "-u", ALICE, "--", "env", f"HOME={site.dirs[ALICE]}", f"PYTHONPATH={REPO}",
             *(f"{k}={v}" for k, v in site.cluster.env().items() if k == "PATH" or k.startswith("SLURM")),
             sys.executable, "-m", "slurm_tpu.cli", "infer", "--server", str(job), "classifier",
             str(site.models["images"]), "-k", "3", "-o", str(remote), "--no-progress"],
            capture_output=True, text=True, timeout=300, cwd="/",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert results(remote) == site.expected
    finally:
        site.cluster.command(["scancel", str(job)])
    state = site.wait([job])[job]
    assert state in ("COMPLETED", "CANCELLED"), (state, site.log(ALICE, job))
    reason = parse_key_values(site.cluster.command(["scontrol", "-o", "show", "job", str(job)]).stdout)
    assert reason.get("ExitCode", "0:0").split(":")[0] == "0", reason
    figures = spooled(site, job)
    assert figures["shard_inferences"] >= IMAGES and figures["shard_busy_ms"] > 0, figures
    assert_node_serves(site)


def spooled(site: Site, job: int) -> dict[str, float]:
    """The job's shard figures in n4's accounting spool (the Epilog's version 2 entry)."""
    from slurm_tpu.protocol.job_record import decode_spool

    path = Path(site.cluster.accounting_spool(NODE)) / str(job)
    entry = decode_spool(path.read_bytes(), str(path))
    assert entry.job_id == job and entry.shards is not None, entry
    return entry.shards
