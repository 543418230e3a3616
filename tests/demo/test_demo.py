"""The main job, end to end: ``python -m harness.demo`` on a real local cluster, then
every script in jobs/ against that cluster, then re-run, refusal and stop.

What the demo printed is not trusted: the timeline's properties are checked here
from Slurm's own job records (jobcomp) and the hooks' lease audit, parsed afresh.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness.demo.experiment import sbatch
from harness.demo.layout import JOBS_DIR, Layout
from harness.demo.lifecycle import containers_missing
from harness.demo.provision import job_environment
from helpers import require_slurm
from slurm_tpu.protocol.jobenv import libedgetpu_path

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]
USER = "stpu_demo"
IMAGES = 300
TPUS = {"node-usb": 1, "node-pcie": 2}
NODES = ("node-usb", "node-pcie", "node-gpu", "node-plain", "node-shard")
SHARD_NODE, SHARED_STICK = "node-shard", "usb-1-1.2"


def run_demo(*args: str, timeout: float = 420) -> subprocess.CompletedProcess:
    """What demo.sh runs after scripts/setup.sh."""
    return subprocess.run(
        [sys.executable, "-m", "harness.demo", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


@pytest.fixture(scope="module")
def demo():
    require_slurm()
    if not (shutil.which("gcc") or shutil.which("cc")):
        pytest.skip("no C compiler for the libedgetpu double")
    user_existed = subprocess.run(["id", "-u", USER], capture_output=True).returncode == 0
    base = tempfile.mkdtemp(prefix="slurm-tpu-demo-test-", dir="/tmp")
    started = time.monotonic()
    done = run_demo("run", "--base", base, "--user", USER, "--images", str(IMAGES))
    done.seconds = time.monotonic() - started
    yield done, Layout(base)
    run_demo("stop", "--base", base, "--user", USER, *([] if user_existed else ["--purge"]))
    if not os.environ.get("SLURM_TPU_KEEP_CLUSTER"):
        shutil.rmtree(base, ignore_errors=True)


# -- Slurm's records, parsed here (not with the demo's own parser) ------------------------


def jobcomp(layout: Layout) -> list[dict]:
    with open(layout.jobcomp, encoding="utf-8") as handle:
        return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in handle if line.startswith("JobId=")]


def epoch(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def audit(layout: Layout, node: str) -> list[dict]:
    path = layout.audit_log(node)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def held(layout: Layout) -> list[tuple[str, str, int, float, float]]:
    """(node, identity, job, acquired, released) for every finished lease."""
    leases = []
    for node in NODES:
        acquired = {}
        for event in audit(layout, node):
            key = (event.get("identity"), event.get("job_id"))
            if event["event"] == "acquire":
                acquired[key] = event["t"]
            elif event["event"] in ("revoke", "release", "reclaim", "clear", "rollback") and key in acquired:
                leases.append((node, key[0], key[1], acquired.pop(key), event["t"]))
        assert not acquired, f"leases never released on {node}: {acquired}"
    return leases


def peak(intervals) -> int:
    points = sorted([(e, -1) for s, e in intervals] + [(s, 1) for s, e in intervals])
    best = now = 0
    for _, delta in points:
        now += delta
        best = max(best, now)
    return best


def inventory(layout: Layout, node: str) -> dict[str, list[str]]:
    with open(os.path.join(layout.node_dir(node), "inventory.json"), encoding="utf-8") as handle:
        return {a["identity"]: a["device_nodes"] for a in json.load(handle)["accelerators"]}


def finished(layout: Layout, job_id: int, timeout: float = 120) -> list[dict]:
    """The job's jobcomp records once it (all its array tasks) finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = [r for r in jobcomp(layout) if job_id in (int(r["JobId"]), int(r.get("ArrayJobId") or 0))]
        queued = subprocess.run(
            ["squeue", "-h", "-o", "%F"],
            capture_output=True,
            text=True,
            env=dict(os.environ, SLURM_CONF=layout.slurm_conf),
        ).stdout.split()
        if records and str(job_id) not in queued:
            return records
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not finish within {timeout:g} s")


def read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def expected_label(layout: Layout, image: str) -> str:
    for line in read(os.path.join(layout.images, "expected.csv")).splitlines():
        name, _, label = line.partition(",")
        if name == os.path.basename(image):
            return label
    raise KeyError(image)


# -- the demo run --------------------------------------------------------------------------


def test_demo_runs_to_completion_quickly_with_short_output(demo):
    done, layout = demo
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    lines = done.stdout.replace(layout.base, "/tmp/slurm-tpu-demo").splitlines()
    # 62 before the unmodified-Coral step's line, 2 for the containerised step, 15 for the shard steps,
    # 7 more for Slurm's books and up to 7 for the jobs' energy (grouped by method, wrapped); the
    # timeline's length varies by a line with where jobs ran.
    assert len(lines) <= 98 and max(map(len, lines)) <= 100, [line for line in lines if len(line) > 100]
    assert "test-double libedgetpu" in done.stdout  # it says plainly that there is no real TPU
    assert done.seconds < 120, f"demo took {done.seconds:.0f} s"


def test_slurms_books_show_tpu_hours_a_qos_cap_and_each_jobs_inferences(demo):
    done, layout = demo
    env = dict(os.environ, SLURM_CONF=os.path.join(layout.base, "etc", "slurm.conf"))

    def slurm(*argv: str) -> str:
        result = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    # TPU-hours per user, from sreport: the demo's line says what sacct's allocations add up to.
    tpu_seconds = 0
    for line in slurm(
        "sacct", "-a", "-n", "-P", "-X", f"--user={USER}", "-S", "now-1days", "-o", "ElapsedRaw,AllocTRES"
    ).splitlines():
        elapsed, tres = line.split("|")
        count = dict(item.split("=") for item in tres.split(",") if "=" in item).get("gres/tpu")
        tpu_seconds += int(elapsed) * int(count or 0)
    [line] = [line for line in done.stdout.splitlines() if line.strip().startswith(f"{USER}: ") and "TPU-hours" in line]
    assert tpu_seconds > 0 and line.strip().endswith(f"TPU-hours ({tpu_seconds} TPU-seconds)"), (line, tpu_seconds)
    # The cap held the user's second job: Slurm's record of it says so.
    assert "PENDING (QOSMaxGRESPerUser)" in done.stdout
    capped = slurm("sacct", "-a", "-n", "-P", "-X", "--name=qos-cap", "-S", "now-1days", "-o", "QOS,State")
    assert capped.splitlines() == ["onetpu|CANCELLED by 0"] * 2, capped
    # Every TPU job's inference figures in its AdminComment, where only admins can write.
    for line in slurm(
        "sacct", "-a", "-n", "-P", "-X", "--name=classify-tpu", "-S", "now-1days", "-o", "AdminComment"
    ).splitlines():
        assert re.fullmatch(
            r"slurm-tpu/node-(usb|pcie):devices=1,inferences=[1-9][0-9]*,inference_seconds=[0-9.]+"
            r",energy_j=[0-9.]+,energy_method=self-reported",
            line,
        ), line
    # Each accelerator job's energy in the closing lines, under how it was obtained: an Edge TPU job's
    # estimate with its own busy time (self-reported), a shard job's with the broker's (estimated); each
    # above nothing and within the device's active power (2 W) over the job (Slurm's whole seconds,
    # and one more for the Prolog and Epilog around them).
    shown = closing_energy(done.stdout)
    for line in slurm(
        "sacct", "-a", "-n", "-P", "-X", "-S", "now-1days", "-o", "JobID,JobName,ElapsedRaw,AllocTRES"
    ).splitlines():
        job, name, elapsed, tres = line.split("|")
        if name not in ("classify-tpu", "shard"):
            continue
        method, joules = shown[job]
        assert method == ("self-reported" if name == "classify-tpu" else "estimated"), (job, name, method)
        share = 1.0 if name == "classify-tpu" else 0.25  # one of the shared TPU's 4 shares
        assert joules is not None and 0 < joules <= 2.0 * (int(elapsed) + 1) * share, (job, name, joules, elapsed)


def closing_energy(stdout: str) -> dict[str, tuple[str, float | None]]:
    """job -> (method, joules or None) from the demo's closing energy lines (grouped by method, wrapped)."""
    lines = stdout.splitlines()
    first = lines.index("  by how each figure was obtained (the jobs' AdminComments):") + 1
    groups: list[str] = []
    for line in lines[first:]:
        if line.startswith("      "):
            groups[-1] += " " + line.strip()  # a wrapped group goes on (wrapped at a space)
        elif line.startswith("    "):
            groups.append(line.strip())
        else:
            break
    found: dict[str, tuple[str, float | None]] = {}
    for group in groups:
        method, _, items = group.partition(": ")
        for item in items.split(", "):
            job, _, joules = item.partition(" ")
            found[job] = (method, float(joules.removesuffix(" J")) if joules else None)
    return found


def test_seed_experiment_timeline_holds_in_slurms_own_records(demo):
    _, layout = demo
    records = jobcomp(layout)
    by_name: dict[str, list[dict]] = {}
    for record in records:
        by_name.setdefault(record["Name"], []).append(record)
    assert {name: len(rs) for name, rs in by_name.items()} == {
        "classify-tpu": 5,
        "classify-cpu": 8,
        "batch-tpu": 4,
        "step-tpu": 1,
        "serve-tpu": 1,
        "serve-client": 1,
        "classify-coral": 4,  # 2 on node-pcie's whole cards, 2 on node-shard's shares
        "coral-holder": 1,
        "qos-cap": 2,
        "shard": 6,
        **({"containers-tpu": 1} if containers_missing() is None else {}),  # where Pyxis is built
    }
    assert {(r["JobState"], r["ExitCode"]) for r in records if r["Name"] not in ("serve-tpu", "qos-cap")} == {
        ("COMPLETED", "0:0")
    }
    assert by_name["serve-tpu"][0]["JobState"] == "CANCELLED"  # a server runs until scancel
    # The shard steps (node-shard) are two users' jobs; everything else is the demo user's.
    assert all(r["UserId"].startswith(USER + "(") for r in records if r["NodeList"] != SHARD_NODE)
    coral = [r for r in by_name["classify-coral"] if r["NodeList"] != SHARD_NODE]
    tpu_jobs = by_name["classify-tpu"] + by_name["batch-tpu"] + coral + by_name["coral-holder"]
    assert {r["NodeList"] for r in tpu_jobs} <= set(TPUS)  # TPU jobs only on TPU nodes
    leases = held(layout)
    for record in tpu_jobs:  # each on exactly one device of its own node
        mine = [lease for lease in leases if lease[2] == int(record["JobId"])]
        assert len(mine) == 1 and mine[0][0] == record["NodeList"], (record["JobId"], mine)
        assert mine[0][1] in inventory(layout, record["NodeList"])
    for node, count in TPUS.items():  # never more at once than the node has TPUs
        assert peak([(s, e) for n, _, _, s, e in leases if n == node]) <= count
        for identity in inventory(layout, node):  # and never one device for two jobs
            assert peak([(s, e) for n, i, _, s, e in leases if (n, i) == (node, identity)]) <= 1
    assert peak([(epoch(r["StartTime"]), epoch(r["EndTime"])) for r in tpu_jobs if r["NodeList"] == "node-usb"]) <= 1
    plain = by_name["classify-cpu"]
    # Plain jobs hold no device. Where they ran is Slurm's choice, not checked: LLN
    # spreads them only while they overlap, and CPU jobs this short often do not.
    assert not {int(r["JobId"]) for r in plain} & {lease[2] for lease in leases}


def test_detection_step_over_two_nodes_found_every_scene_once_and_drew_them(demo):
    done, layout = demo
    (record,) = [r for r in jobcomp(layout) if r["Name"] == "step-tpu"]
    assert sorted(record["NodeList"].split(",")) == ["node-pcie", "node-usb"], record["NodeList"]
    shares = sorted(glob.glob(os.path.join(layout.results, f"step-{record['JobId']}-*.jsonl")))
    assert len(shares) == 2
    rows = [json.loads(line) for path in shares for line in open(path, encoding="utf-8")]
    expected = json.load(open(os.path.join(layout.models, "scenes", "expected.json"), encoding="utf-8"))
    assert sorted(os.path.basename(r["input"]) for r in rows) == sorted(expected)
    for row in rows:
        assert sorted((o["id"], o["bbox"]) for o in row["objects"]) == sorted(
            (o[0], o[1:]) for o in expected[os.path.basename(row["input"])]["objects"]
        )
    (line,) = [line for line in done.stdout.splitlines() if line.strip().startswith("annotated: ")]
    assert os.path.isfile(line.split()[1])


def test_served_model_answered_another_node_and_stopped_cleanly_on_scancel(demo):
    done, layout = demo
    (server,) = [r for r in jobcomp(layout) if r["Name"] == "serve-tpu"]
    (client,) = [r for r in jobcomp(layout) if r["Name"] == "serve-client"]
    assert (server["NodeList"], client["NodeList"]) == ("node-usb", "node-plain")
    answers = [line.split(": ", 1) for line in done.stdout.splitlines() if re.match(r"\s+img_\d+\.png: ", line)]
    assert [(name.strip(), label.split()[0]) for name, label in answers] == [
        (f"img_{i:05d}.png", expected_label(layout, f"img_{i:05d}.png")) for i in range(3)
    ]
    log = open(os.path.join(layout.out, f"serve-tpu-{server['JobId']}.out"), encoding="utf-8").read()
    assert "SIGTERM: stopping" in log and "devices released" in log and "cut off" not in log, log
    job = int(server["JobId"])
    assert [n for n, _, j, _, _ in held(layout) if j == job] == ["node-usb"]  # its TPU leased, then released
    assert not os.path.exists(os.path.join(os.path.expanduser(f"~{USER}"), ".slurm-tpu", "serve", f"{job}.json"))


def test_batch_array_classified_every_image_once_with_the_known_answer(demo):
    _, layout = demo
    array = {r["ArrayJobId"] for r in jobcomp(layout) if r["Name"] == "batch-tpu"}
    assert len(array) == 1
    shards = sorted(Path(layout.results).glob(f"batch-{array.pop()}_*.jsonl"))
    assert len(shards) == 4
    rows = [json.loads(line) for shard in shards for line in shard.read_text().splitlines()]
    names = [os.path.basename(r["input"]) for r in rows]
    assert len(names) == IMAGES and len(set(names)) == IMAGES
    assert all(r["classes"][0]["label"] == expected_label(layout, r["input"]) for r in rows)


def test_shard_jobs_of_two_users_shared_the_one_tpu_with_their_device_time_in_the_books(demo):
    """Six classify_shard.sbatch jobs (--gres=tpu_shard:1) of two users on node-shard, whose one stick
    has 4 shares: from Slurm's records, several ran at once and never more than the shares; each
    classified every image right through the broker; each job's AdminComment holds the broker's
    figures (device time, one inference per image); the stick was never leased and is root's."""
    done, layout = demo
    jobs = [r for r in jobcomp(layout) if r["Name"] == "shard"]
    assert len(jobs) == 6 and {(r["JobState"], r["NodeList"]) for r in jobs} == {("COMPLETED", SHARD_NODE)}
    assert {r["UserId"].split("(")[0] for r in jobs} == {USER, f"{USER}2"}
    spans = [(epoch(r["StartTime"]), epoch(r["EndTime"])) for r in jobs]
    assert 2 <= peak(spans) <= 4
    images = sorted(os.listdir(os.path.join(layout.models, "shard-images")))
    env = dict(os.environ, SLURM_CONF=layout.slurm_conf)
    for record in jobs:
        job = record["JobId"]
        rows = read(os.path.join(layout.results, f"shard-{job}.csv")).splitlines()[1:]
        assert sorted(os.path.basename(row.split(",")[0]) for row in rows) == images
        assert all(row.split(",")[1] == expected_label(layout, row.split(",")[0]) for row in rows)
        comment = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-j", job, "-o", "AdminComment"], capture_output=True, text=True, env=env
        ).stdout.strip()
        fields = dict(pair.split("=") for pair in comment.split(f"slurm-tpu/{SHARD_NODE}:")[1].split(";")[0].split(","))
        assert int(fields["shards"]) == 1 and int(fields["shard_inferences"]) == len(images)
        assert float(fields["shard_busy_ms"]) > 0
    assert [e for e in audit(layout, SHARD_NODE) if e["event"] == "acquire"] == []
    info = os.stat(inventory(layout, SHARD_NODE)[SHARED_STICK][0])
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o600)
    at = done.stdout.index("shards: 6 x classify_shard.sbatch")
    assert "ok    up to " in done.stdout[at:] and "ok    each job classified the 60 images" in done.stdout[at:]


def test_unmodified_coral_code_ran_on_shares_through_the_real_libedgetpu(demo):
    """The demo ran jobs/coral_example.sbatch, unmodified, as one --gres=tpu_shard:1 job of each user with
    the real libedgetpu (both of slurm-tpu's patches) and a compiled model: each job saw its shard
    (EDGETPU_VISIBLE_DEVICES=broker:<its endpoint>), and its Edge TPU op ran on the broker: the
    answer is the image's known class, and the broker counted the job's inference in its books."""
    done, layout = demo
    if not (REPO / "build" / "libedgetpu" / "libedgetpu.so.1").exists():
        assert "skipped: unmodified Coral code on a share needs the real libedgetpu" in done.stdout
        pytest.skip("the real libedgetpu is not built (scripts/setup.sh builds it from ../shared/libedgetpu)")
    jobs = [r for r in jobcomp(layout) if r["Name"] == "classify-coral" and r["NodeList"] == SHARD_NODE]
    assert len(jobs) == 2 and {r["JobState"] for r in jobs} == {"COMPLETED"}
    assert {r["UserId"].split("(")[0] for r in jobs} == {USER, f"{USER}2"}
    env = dict(os.environ, SLURM_CONF=layout.slurm_conf)
    for record in jobs:
        job = record["JobId"]
        output = read(os.path.join(layout.out, f"classify-coral-{job}.out")).splitlines()
        endpoint = f"broker:{layout.node_dir(SHARD_NODE)}/state/broker/jobs/{job}.sock"
        assert output[0] == f"job {job} on {SHARD_NODE}: EDGETPU_VISIBLE_DEVICES={endpoint}"
        assert f"Edge TPUs this job sees: usb:{endpoint}" in output
        assert output[-1].endswith(": 0.99609")
        comment = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-j", job, "-o", "AdminComment"], capture_output=True, text=True, env=env
        ).stdout
        assert "shard_inferences=1," in comment, comment
    assert "ok    unmodified Coral code on a share" in done.stdout


def test_devices_are_idle_again_and_nobody_holds_a_lease(demo):
    _, layout = demo
    for node in TPUS:

        def leases() -> list[dict]:
            done = subprocess.run(
                [sys.executable, "-m", "slurm_tpu.cli", "leases", "--json"],
                capture_output=True,
                text=True,
                env=dict(os.environ, SLURM_TPU_CONFIG=os.path.join(layout.node_dir(node), "config.yaml")),
            )
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout)

        # A USB stick revoked at its last job's end is released once it is back (udev-event).
        deadline = time.monotonic() + 60
        while any(row.get("phase") == "revoking" for row in leases()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert leases() == []
        with open(os.path.join(layout.node_dir(node), "state", "inventory.json"), encoding="utf-8") as handle:
            current = {a["identity"]: a["device_nodes"] for a in json.load(handle)["accelerators"]}
        for identity, nodes in current.items():  # the nodes as they are now (a revoked stick has a new one)
            info = os.stat(nodes[0])
            assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o600), identity


# -- the job scripts in jobs/, against the demo cluster ----------------------------------


def submit(layout: Layout, script: str, *args: str, options: tuple[str, ...] = (), **env: str) -> int:
    devices = read(layout.env_file).split("EDGETPU_DOUBLE_DEVICES=")[1].split()[0]
    return sbatch(layout, USER, {**job_environment(layout, devices, USER), **env}, options, script, args)


def test_classify_tpu_job_runs_on_the_device_it_was_leased(demo):
    _, layout = demo
    image = os.path.join(layout.images, "img_00007.png")
    job = submit(layout, "classify_tpu.sbatch", layout.classifier, image, layout.labels)
    [record] = finished(layout, job)
    assert (record["JobState"], record["NodeList"]) in {("COMPLETED", n) for n in TPUS}
    [lease] = [lease for lease in held(layout) if lease[2] == job]
    output = read(os.path.join(layout.out, f"classify-tpu-{job}.out"))
    assert f"job {job} on {record['NodeList']}: Edge TPU {lease[1]}\n" in output
    assert output.rstrip().endswith(f"{expected_label(layout, image)}: 0.99609")


def test_unmodified_coral_code_got_each_job_its_own_tpu_on_the_two_tpu_node(demo):
    """The demo ran jobs/coral_example.sbatch (no device argument) twice on node-pcie while a holder job
    kept one of its two cards: each job's libedgetpu (the double, honouring EDGETPU_VISIBLE_DEVICES as
    the node's patched one does) listed and used only the card the job was leased, never the busy one
    (whether the two examples overlapped or not)."""
    done, layout = demo
    jobs = [r for r in jobcomp(layout) if r["Name"] == "classify-coral" and r["NodeList"] != SHARD_NODE]
    assert len(jobs) == 2 and {(r["JobState"], r["NodeList"]) for r in jobs} == {("COMPLETED", "node-pcie")}
    cards = inventory(layout, "node-pcie")
    [holder] = [int(r["JobId"]) for r in jobcomp(layout) if r["Name"] == "coral-holder"]
    [busy] = [lease[1] for lease in held(layout) if lease[2] == holder]
    seen = []
    for record in jobs:
        job = int(record["JobId"])
        [lease] = [lease for lease in held(layout) if lease[2] == job]
        output = read(os.path.join(layout.out, f"classify-coral-{job}.out")).splitlines()
        assert output[0] == f"job {job} on node-pcie: EDGETPU_VISIBLE_DEVICES={cards[lease[1]][0]}"
        [sees] = [line for line in output if line.startswith("Edge TPUs this job sees: ")]
        assert sees == f"Edge TPUs this job sees: pci:{cards[lease[1]][0]}"
        seen.append(sees)
        assert output[-1].endswith(": 0.99609")
    assert f"Edge TPUs this job sees: pci:{cards[busy][0]}" not in seen  # never the card another job holds
    lines = done.stdout.splitlines()
    [at] = [i for i, line in enumerate(lines) if "unmodified Coral code, no device argument" in line]
    assert lines[at].startswith("  ok    unmodified Coral code, no device argument: 2 jobs on node-pcie saw pci apex_")
    busy_card = os.path.basename(cards[busy][0])
    assert lines[at + 1].endswith(f"each the card it was leased; {busy_card} was another job's (job {holder})")


def test_containerised_step_ran_each_container_on_its_own_nodes_tpu(demo):
    """The demo ran jobs/containers_across_nodes.sbatch (Pyxis + enroot, where scripts/build-containers.sh
    built them): one container per node on node-usb and node-pcie, Coral's example unmodified in each;
    each listed exactly the Edge TPU its node leased the job (the audit logs) and classified its image."""
    done, layout = demo
    why = containers_missing()
    if why:
        assert f"skip  containers (Pyxis + enroot): {why}" in done.stdout
        pytest.skip(why)
    [record] = [r for r in jobcomp(layout) if r["Name"] == "containers-tpu"]
    job = int(record["JobId"])
    assert record["JobState"] == "COMPLETED" and record["NodeList"] in ("node-[pcie,usb]", "node-pcie,node-usb")
    expected = set()
    for node, identity, lease_job, _, _ in held(layout):
        if lease_job == job:
            path = inventory(layout, node)[identity][0] if identity.startswith("pci-") else None
            kind, where = libedgetpu_path(identity, path)
            expected.add(f"Edge TPUs this job sees: {kind}:{where}")
    assert len(expected) == 2  # one Edge TPU on each node
    output = read(os.path.join(layout.out, f"containers-tpu-{job}.out")).splitlines()
    assert {line.split(": ", 1)[1] for line in output if "Edge TPUs this job sees" in line} == expected
    assert len([line for line in output if line.endswith(": 0.99609")]) == 2  # both classified the image
    assert f"  ok    containers (Pyxis + enroot): job {job}, one per node on node-usb and node-pcie" in done.stdout


def test_classify_gpu_job_fails_cleanly_without_a_gpu_and_falls_back_when_asked(demo):
    _, layout = demo
    image = os.path.join(layout.images, "img_00002.png")
    strict = submit(layout, "classify_gpu.sbatch", layout.classifier, image, layout.labels)
    [record] = finished(layout, strict)
    assert (record["JobState"], record["ExitCode"], record["NodeList"]) == ("FAILED", "2:0", "node-gpu")
    output = read(os.path.join(layout.out, f"classify-gpu-{strict}.out")).splitlines()
    assert output[0] == f"job {strict} on node-gpu: GPU 0"  # Slurm gave it the (simulated) GPU
    errors = [line for line in output if line.startswith("slurm-tpu: error:")]
    assert len(errors) == 1 and "GPU could not be set up" in errors[0] and "--fallback cpu" in errors[0]
    assert errors[0] == output[-1]
    lenient = submit(layout, "classify_gpu.sbatch", layout.classifier, image, layout.labels, GPU_FALLBACK="cpu")
    [record] = finished(layout, lenient)
    assert (record["JobState"], record["NodeList"]) == ("COMPLETED", "node-gpu")
    output = read(os.path.join(layout.out, f"classify-gpu-{lenient}.out"))
    assert "falling back to the CPU" in output
    assert output.rstrip().endswith(f"{expected_label(layout, image)}: 0.99609")


def test_classify_cpu_job_gets_no_device(demo):
    _, layout = demo
    image = os.path.join(layout.images, "img_00003.png")
    job = submit(layout, "classify_cpu.sbatch", layout.classifier, image, layout.labels)
    [record] = finished(layout, job)
    assert record["JobState"] == "COMPLETED"
    assert job not in {lease[2] for lease in held(layout)}
    output = read(os.path.join(layout.out, f"classify-cpu-{job}.out"))
    assert output.rstrip().endswith(f"{expected_label(layout, image)}: 0.99609") and "warning" not in output


def test_batch_array_job_with_another_array_size_covers_every_image(demo, tmp_path):
    _, layout = demo
    results = tempfile.mkdtemp(dir=layout.results)
    os.chmod(results, 0o1777)
    job = submit(
        layout, "batch_array.sbatch", layout.classifier, layout.images, results, layout.labels, options=("--array=0-1",)
    )
    records = finished(layout, job)
    assert sorted(int(r["ArrayTaskId"]) for r in records) == [0, 1]
    assert {r["JobState"] for r in records} == {"COMPLETED"} and {r["NodeList"] for r in records} <= set(TPUS)
    rows = [json.loads(line) for f in Path(results).glob(f"batch-{job}_*.jsonl") for line in f.read_text().splitlines()]
    assert sorted(os.path.basename(r["input"]) for r in rows) == sorted(
        f for f in os.listdir(layout.images) if f.endswith(".png")
    )
    assert all(r["classes"][0]["label"] == expected_label(layout, r["input"]) for r in rows)


def test_multi_tpu_job_opens_both_of_its_devices_and_only_those(demo):
    _, layout = demo
    log = os.path.join(layout.out, "double-multi.log")
    open(log, "w").close()
    os.chmod(log, 0o666)
    results = os.path.join(layout.results, "multi.jsonl")
    job = submit(
        layout, "multi_tpu.sbatch", layout.classifier, layout.images, results, layout.labels, EDGETPU_DOUBLE_LOG=log
    )
    [record] = finished(layout, job)
    assert (record["JobState"], record["NodeList"]) == ("COMPLETED", "node-pcie")
    mine = sorted(lease[1] for lease in held(layout) if lease[2] == job)
    assert mine == sorted(inventory(layout, "node-pcie"))
    opened = sorted(line.split()[2] for line in read(log).splitlines() if line.startswith("create "))
    assert opened == sorted(f"path={inventory(layout, 'node-pcie')[i][0]}" for i in mine)
    rows = [json.loads(line) for line in read(results).splitlines()]
    assert len(rows) == IMAGES and all(r["classes"][0]["label"] == expected_label(layout, r["input"]) for r in rows)


def test_interactive_srun_recipe_prints_the_result_to_the_terminal(demo):
    _, layout = demo
    image = os.path.join(layout.images, "img_00005.png")
    devices = read(layout.env_file).split("EDGETPU_DOUBLE_DEVICES=")[1].split()[0]
    env = job_environment(layout, devices, USER)
    done = subprocess.run(
        [
            "runuser",
            "-u",
            USER,
            "--",
            "env",
            "-i",
            *(f"{k}={v}" for k, v in env.items()),
            str(JOBS_DIR / "interactive.sh"),
            layout.classifier,
            image,
            "--labels",
            layout.labels,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(f"{expected_label(layout, image)}: 0.99609")
    deadline = time.monotonic() + 30
    while not [r for r in jobcomp(layout) if r["Name"] == "interactive-tpu"] and time.monotonic() < deadline:
        time.sleep(0.2)
    [record] = [r for r in jobcomp(layout) if r["Name"] == "interactive-tpu"]
    finished(layout, int(record["JobId"]))  # srun returns before the epilog gives the TPU back
    assert record["JobState"] == "COMPLETED" and record["NodeList"] in TPUS
    assert [lease[0] for lease in held(layout) if lease[2] == int(record["JobId"])] == [record["NodeList"]]


@pytest.mark.parametrize("script", sorted(p.name for p in JOBS_DIR.iterdir()))
def test_every_job_script_says_its_usage_in_one_line_without_arguments(script):
    done = subprocess.run(
        ["sh", str(JOBS_DIR / script)], capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"}
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("usage: ")


def guide_block(heading: str) -> str:
    """The first ```sh block after ``heading`` in docs/getting-started.md."""
    text = (REPO / "docs" / "getting-started.md").read_text()
    after = text[text.index(heading) :]
    start = after.index("```sh\n") + len("```sh\n")
    return after[start : after.index("\n```", start)] + "\n"


def test_getting_started_user_walkthrough_works_as_written(demo, tmp_path):
    """A new user's commands from docs/getting-started.md, verbatim (only the demo's directory differs)."""
    _, layout = demo
    script = guide_block("## Try it as a user").replace("/tmp/slurm-tpu-demo", layout.base)
    script = script.replace("\nsqueue ", "\nwhile squeue -h | grep -q .; do sleep 0.5; done; squeue ")
    home = tempfile.mkdtemp(dir=layout.out)
    shutil.chown(home, USER)
    done = subprocess.run(
        ["runuser", "-u", USER, "--", "bash", "-e", "-c", script], capture_output=True, text=True, timeout=180, cwd=home
    )
    assert done.returncode == 0, done.stdout + done.stderr
    mine = read(next(str(p) for p in Path(home).glob("my-job-*.out")))
    assert re.match(r"my Edge TPU: (usb-1-1\.3 on node-usb|pci-0000:0[12]:00\.0 on node-pcie)\n", mine), mine
    assert mine.rstrip().endswith("top-right: 0.99609")  # img_00002: the known answer
    assert "center: 0.99609" in done.stdout  # the srun line, straight to the terminal


# -- re-run, refusal, bad input, stop -------------------------------------------------------


def running(pid: int) -> bool:
    """Whether ``pid`` runs. An exited daemon whose launcher is gone stays a zombie until
    PID 1 reaps it (here PID 1 may be slow to): it has stopped all the same."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] != b"Z"


def daemon_pids(layout: Layout) -> dict[str, str]:
    run = Path(layout.path("run"))
    return {p.name: p.read_text() for p in run.glob("*.launcher.pid")}


def test_rerun_reuses_the_running_cluster_and_passes_again(demo):
    _, layout = demo
    before, last_job = daemon_pids(layout), max(int(r["JobId"]) for r in jobcomp(layout))
    again = run_demo("--base", layout.base, "--user", USER, "--images", str(IMAGES))
    assert again.returncode == 0, again.stdout + again.stderr
    assert daemon_pids(layout) == before  # the same daemons: reused, not restarted
    new = [r for r in jobcomp(layout) if int(r["JobId"]) > last_job]
    # 17 + detection + client + 2 Coral examples and their holder, + 6 shard jobs and 2 Coral examples on shares,
    # + server, + the 2 jobs the QOS cap is shown on, + the containerised step where Pyxis is built
    states = sorted((r["Name"] if r["Name"] in ("serve-tpu", "qos-cap") else "", r["JobState"]) for r in new)
    completed = 30 + (containers_missing() is None)
    assert states == [("", "COMPLETED")] * completed + [("qos-cap", "CANCELLED")] * 2 + [("serve-tpu", "CANCELLED")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_refuses_while_a_slurm_it_did_not_create_runs_and_leaves_it_alone(demo, tmp_path):
    _, layout = demo
    os.chmod(tmp_path, 0o755)
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        f"ClusterName=site\nSlurmctldHost=localhost\nSlurmctldPort={_free_port()}\n"
        f"StateSaveLocation={tmp_path}\nSlurmctldLogFile={tmp_path}/ctld.log\n"
        f"SlurmctldPidFile={tmp_path}/ctld.pid\nProctrackType=proctrack/linuxproc\n"
        # Slurm 25.11's slurmctld needs munge to start (22.05's did not): the demo's own.
        f"AuthInfo=socket={layout.path('munge', 'munge.socket')}\n"
        "NodeName=s1 CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=s1 Default=YES\n"
    )
    site = subprocess.Popen(
        [shutil.which("slurmctld") or "/usr/sbin/slurmctld", "-D", "-f", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30  # up once it says so in its log (and still running then)
        while "Running as primary controller" not in (
            read(f"{tmp_path}/ctld.log") if os.path.exists(f"{tmp_path}/ctld.log") else ""
        ):
            assert site.poll() is None and time.monotonic() < deadline, "the stand-in site slurmctld did not come up"
            time.sleep(0.1)
        assert site.poll() is None, "the stand-in site slurmctld did not stay up"
        before = daemon_pids(layout)
        done = run_demo("--base", layout.base, "--user", USER)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.count("\n") == 1
        assert f"a Slurm this demo did not create is running (slurmctld pid {site.pid}, config {conf})" in done.stderr
        assert site.poll() is None and daemon_pids(layout) == before  # neither touched
    finally:
        site.send_signal(signal.SIGKILL)
        site.wait(timeout=10)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--images", "5"], "--images 5: give 20 to 5000"),
        (["--timeout", "0"], "--timeout 0: give a positive number of seconds"),
        (["--user", "Bad Name!"], "not a valid user name"),
        (["--user", "root"], "is root"),
        (["sideways"], "invalid choice: 'sideways'"),
        (["--base", "relative"], "give an absolute path"),
    ],
)
def test_bad_input_gets_one_line_and_exit_2(demo, args, message):
    _, layout = demo
    if "--base" not in args:
        args = ["--base", layout.base, *args]
    done = run_demo(*args)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_base_that_is_not_the_demos_is_refused(tmp_path):
    require_slurm()
    (tmp_path / "notes.txt").write_text("mine")
    done = run_demo("--base", str(tmp_path))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "was not made by the demo" in done.stderr and (tmp_path / "notes.txt").read_text() == "mine"


def test_stop_stops_every_demo_daemon_and_status_says_so(demo):
    _, layout = demo
    pids = [int(p) for p in daemon_pids(layout).values()]
    assert run_demo("status", "--base", layout.base).returncode == 0
    done = run_demo("stop", "--base", layout.base)
    assert done.returncode == 0 and "stopped" in done.stdout
    assert not [pid for pid in pids if running(pid)]
    status = run_demo("status", "--base", layout.base)
    assert status.returncode == 1 and "not running" in status.stdout
