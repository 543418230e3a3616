"""Attacks on usage accounting by a hostile user, on a real local cluster with two real users.

Each job with leased devices gets its own usage box (a tmpfs owned by its user,
see slurm_tpu/hooks/jobusage.py). These tests do what the old shared, world-
writable drop directory allowed (fill it, plant names for other jobs, forge
absurd numbers) and check that it now costs nobody but the attacker anything:
no other job fails, no node drains, the epilog stays quick, every other job's
usage is counted exactly, and report/metrics keep working.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
from support import (
    PCI,
    USB,
    audit,
    inventory,
    leases,
    no_overlaps,
    one_node_two_tpus,
    out,
    owner,
    state_dir,
    wait_until,
)

from slurm_tpu.protocol.usage import BOX_BYTES, BOX_INODES

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def cluster():
    yield from one_node_two_tpus()


def state(cluster) -> str:
    return state_dir(cluster, "n1")


def python_job(cluster, code: str, tag: str) -> str:
    """A job script running ``code`` under Debian's python3 (stdlib only), as the job's user."""
    path = out(cluster, f"{tag}.py")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(code)
    os.chmod(path, 0o644)
    return f"#!/bin/sh\nexec /usr/bin/python3 -I {path}\n"


# Writes the job's record for each of its devices, after an optional wait for a stop file.
RECORD = """
import json, os, time
tag, out = {tag!r}, {out!r}
box = os.environ.get("SLURM_TPU_USAGE_DIR", "")
with open(f"{{out}}/{{tag}}.box", "w") as handle:
    handle.write(box)
while {wait!r} and not os.path.exists(f"{{out}}/{{tag}}.stop"):
    time.sleep(0.05)
for identity in os.environ["SLURM_TPU_DEVICES"].split(","):
    with open(os.path.join(box, identity + ".json"), "w") as handle:
        handle.write({record!r})
"""
GOOD = json.dumps({"version": 1, "inferences": 7, "seconds": 0.25, "energy_j": None})


def record_job(cluster, user: str, tag: str, gres: str, record: str = GOOD, wait: bool = False) -> int:
    code = RECORD.format(tag=tag, out=os.path.join(cluster.base, "out"), wait=wait, record=record)
    return cluster.sbatch(
        ["-w", "n1", f"--gres={gres}", "-o", "/dev/null", "-e", out(cluster, f"{tag}.err")],
        python_job(cluster, code, tag),
        user=user,
    )


# Alice, inside her TPU job: fill her box, flood it with names (400k tries), then try
# to write everywhere else usage lives (the state dir, the box parent, Bob's box).
FLOOD = """
import errno, json, os, sys, time
out, victim_box = {out!r}, open({victim!r}).read()
box = os.environ["SLURM_TPU_USAGE_DIR"]
result = {{"box": box}}
written = 0
try:
    with open(os.path.join(box, "fill"), "wb", buffering=0) as handle:
        while written < 10 * 2**20:
            written += handle.write(b"x" * 4096)
except OSError as exc:
    result["fill_error"] = errno.errorcode[exc.errno]
result["fill_bytes"] = written
names = 0
try:
    while names < 400000:
        os.close(os.open(os.path.join(box, f"{{names}}.usb-2-1.3.{{names}}"), os.O_CREAT | os.O_WRONLY, 0o644))
        names += 1
except OSError as exc:
    result["flood_error"] = errno.errorcode[exc.errno]
result["names"] = names
elsewhere = {{}}
parent = os.path.dirname(box)
for target in [os.path.join(parent, "..", "plant"), os.path.join(parent, "999999"),
               os.path.join(parent, "999999.usb-2-1.3.1"), os.path.join(victim_box, "pci-0000:03:00.0.json")]:
    try:
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
        elsewhere[target] = "CREATED"
    except OSError as exc:
        elsewhere[target] = errno.errorcode[exc.errno]
try:
    os.mkdir(os.path.join(parent, "999999"))
    elsewhere["mkdir"] = "CREATED"
except OSError as exc:
    elsewhere["mkdir"] = errno.errorcode[exc.errno]
result["elsewhere"] = elsewhere
result["ended"] = time.time()
with open(os.path.join(out, "flood.json"), "w") as handle:
    json.dump(result, handle)
"""


def test_filling_and_flooding_a_box_costs_no_other_job_anything(cluster, users):
    bob = record_job(cluster, "stpu_bob", "bob1", "tpu:edgetpu_pci:1", wait=True)
    wait_until(lambda: os.path.exists(out(cluster, "bob1.box")), 60, "Bob's job to start")
    assert open(out(cluster, "bob1.box")).read().startswith(os.path.join(state(cluster), "job-usage", ""))
    code = FLOOD.format(out=os.path.join(cluster.base, "out"), victim=out(cluster, "bob1.box"))
    alice = cluster.sbatch(
        ["-w", "n1", "--gres=tpu:edgetpu_usb:1", "-o", "/dev/null", "-e", out(cluster, "flood.err")],
        python_job(cluster, code, "flood"),
        user="stpu_alice",
    )
    assert cluster.wait_for_jobs([alice], timeout=120)[alice] == "COMPLETED", open(out(cluster, "flood.err")).read()
    result = json.load(open(out(cluster, "flood.json")))
    # Her box held what its size allows and no more; the flood of names stopped at its inode limit.
    assert result["fill_error"] == "ENOSPC" and result["fill_bytes"] <= BOX_BYTES
    assert result["flood_error"] == "ENOSPC" and result["names"] < BOX_INODES
    # Nowhere else: not the state dir, not a future job's box, not Bob's running box.
    assert set(result["elsewhere"].values()) == {"EACCES"}, result["elsewhere"]
    # The epilog read one name, whatever she left, and unmounted her box promptly: its end of
    # her lease (a USB lease ends at its revocation; the release follows when the stick is back).
    ended = [e for e in audit(cluster, "n1") if e["event"] in ("revoke", "release") and e["job_id"] == alice]
    assert ended and ended[0]["t"] - result["ended"] < 10
    assert not os.path.lexists(result["box"]) and result["box"] not in open("/proc/self/mounts").read()
    # Bob's job, running all along, records its usage exactly and completes; so does his next
    # job on the stick Alice just flooded from; n1 never drained.
    open(out(cluster, "bob1.stop"), "w").close()
    nxt = record_job(cluster, "stpu_bob", "bob2", "tpu:edgetpu_usb:1")
    assert cluster.wait_for_jobs([bob, nxt], timeout=120) == {bob: "COMPLETED", nxt: "COMPLETED"}
    usage = {(e["job_id"], e["identity"]): e["inferences"] for e in audit(cluster, "n1") if e["event"] == "usage"}
    assert usage[(bob, PCI)] == 7 and usage[(nxt, USB)] == 7 and (alice, USB) not in usage
    assert "DRAIN" not in cluster.node_states()["n1"]
    assert leases(cluster, "n1") == []
    no_overlaps(audit(cluster, "n1"))


def test_no_user_can_create_anything_on_the_ledgers_filesystem(cluster, users):
    """The old attack surface: a world-writable directory in the state dir. Now every
    directory there is root's and not group/world-writable, so a user can plant no name
    for a future job (or fill the ledger's filesystem) at all."""
    top = os.lstat(state(cluster))
    for directory, _subdirs, _ in os.walk(state(cluster)):
        info = os.lstat(directory)
        if info.st_dev != top.st_dev:
            continue  # a running job's own box: another filesystem
        assert info.st_uid == 0 and not info.st_mode & 0o022, (directory, oct(stat.S_IMODE(info.st_mode)))
        probe = subprocess.run(
            [
                "runuser",
                "-u",
                "stpu_alice",
                "--",
                "/usr/bin/python3",
                "-I",
                "-c",
                "import os, sys; os.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644))",
                os.path.join(directory, "424242.usb-2-1.3.1"),
            ],
            capture_output=True,
            text=True,
        )
        assert probe.returncode != 0 and "Permission denied" in probe.stderr, (directory, probe.stderr)


ABSURD = [
    '{"version": 1, "inferences": 1e400, "seconds": 1}',
    '{"version": 1, "inferences": 5, "seconds": NaN, "energy_j": -1000.0}',
]


def test_absurd_numbers_change_only_the_attackers_records(cluster, users):
    alice = [record_job(cluster, "stpu_alice", f"absurd{i}", "tpu:1", record=record) for i, record in enumerate(ABSURD)]
    bob = record_job(cluster, "stpu_bob", "bob3", "tpu:1")
    states = cluster.wait_for_jobs([*alice, bob], timeout=120)
    assert set(states.values()) == {"COMPLETED"}, states
    usage = [e for e in audit(cluster, "n1") if e["event"] == "usage" and e["job_id"] in (*alice, bob)]
    assert [(e["job_id"], e["inferences"], e["seconds"]) for e in usage] == [(bob, 7, 0.25)]
    env = dict(os.environ, SLURM_TPU_CONFIG=cluster.node_config("n1"))
    for argv in (["report", "--by", "job", "--json"], ["report"], ["metrics"]):
        done = subprocess.run([*cluster.slurm_tpu, *argv], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    by_job = json.loads(
        subprocess.run(
            [*cluster.slurm_tpu, "report", "--by", "job", "--json"], capture_output=True, text=True, env=env, timeout=60
        ).stdout
    )
    assert by_job[str(bob)]["inferences"] == 7 and all(by_job[str(j)]["inferences"] == 0 for j in alice)
    assert "DRAIN" not in cluster.node_states()["n1"]


def test_a_prolog_failing_after_the_lease_gives_the_devices_and_the_box_back(cluster, users):
    """The env file is written after the lease: when that fails (here: `jobs` is not a
    directory, as on a broken state filesystem) the lease is rolled back with it."""
    jobs = os.path.join(state(cluster), "jobs")
    os.makedirs(jobs, exist_ok=True)
    os.rename(jobs, jobs + ".away")
    open(jobs, "w").close()
    try:
        job = cluster.sbatch(
            ["-w", "n1", "--gres=tpu:edgetpu_usb:1", "-o", "/dev/null"], "#!/bin/sh\ntrue\n", user="stpu_alice"
        )
        wait_until(
            lambda: any(e["event"] == "rollback" and e["job_id"] == job for e in audit(cluster, "n1")),
            60,
            "the prolog to roll back",
        )
        wait_until(lambda: "DRAIN" in cluster.node_states()["n1"], 60, "Slurm to drain n1 (a failed prolog)")
    finally:
        os.unlink(jobs)
        os.rename(jobs + ".away", jobs)
    assert leases(cluster, "n1") == []
    assert owner(inventory(cluster, "n1")[USB][0]) == (0, 0, 0o600)
    assert os.listdir(os.path.join(state(cluster), "job-usage")) == []
    assert "slurm-tpu" not in [line.split()[0] for line in open("/proc/self/mounts") if state(cluster) in line]
    cluster.command(["scancel", str(job)])
    cluster.command(["scontrol", "update", "NodeName=n1", "State=RESUME"])
    wait_until(lambda: "DRAIN" not in cluster.node_states()["n1"], 60, "n1 to resume")
    no_overlaps(audit(cluster, "n1"))
