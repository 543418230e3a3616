"""Per-job device isolation against a real local Slurm cluster.

One cluster for the module: n1 with two Edge TPUs (a USB stick and a PCIe card,
two GRES types), n2 with a GPU (leased too: devices.isolate_gpus), n3 plain,
n4 with one USB stick. gres.conf and the NodeName lines come from the project's
own gres-conf/node-conf; Prolog/Epilog/TaskProlog are the project's hooks.
"""

from __future__ import annotations

import os

import pytest
from support import (
    HARDWARE,
    audit,
    finish_cluster,
    hook_env,
    inventory,
    leases,
    make_cluster,
    no_overlaps,
    open_as,
    owner,
    require_root_and_slurm,
    run_hook,
    wait_until,
)

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def cluster():
    require_root_and_slurm()
    from harness.localcluster.cluster import NodeSpec

    nodes = [
        NodeSpec("n1", os.path.join(HARDWARE, "n1_two_tpus.umockdev")),
        NodeSpec("n2", os.path.join(HARDWARE, "n2_gpu.umockdev")),
        NodeSpec("n3"),
        NodeSpec("n4", os.path.join(HARDWARE, "n4_one_tpu.umockdev")),
    ]
    # Without our gres/tpu plugin: these hooks ask Slurm for every job's allocation (the fallback the
    # plugin-less sites run; the plugin's path: test_gres_plugin.py and tests/scale).
    started = make_cluster(nodes, node_config_extra={"devices": {"isolate_gpus": True}}, gres_plugin=False)
    yield started
    finish_cluster(started)


def out(cluster, name: str) -> str:
    return os.path.join(cluster.base, "out", name)


def read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


HOLD = """#!/bin/sh
echo "$SLURM_TPU_DEVICES" > {out}/{tag}.devices
echo "$SLURM_TPU_EDGETPU_PATHS" > {out}/{tag}.paths
echo "$SLURM_TPU_GPUS" > {out}/{tag}.gpus
hostname > /dev/null
touch {out}/{tag}.started
i=0
while [ ! -e {out}/{tag}.stop ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
"""

PROBE = """#!/bin/sh
python3 -I -c '
import errno, os, sys
try:
    os.close(os.open(sys.argv[1], os.O_RDWR | os.O_NONBLOCK)); print("OPENED")
except OSError as exc:
    print(errno.errorcode.get(exc.errno, exc.errno))
' "$(cat {target})" > {out}/{tag}.probe
"""


def hold(cluster, user: str, tag: str, args: list[str]) -> int:
    job = cluster.sbatch(
        [*args, "-o", "/dev/null", "-e", out(cluster, f"{tag}.err")],
        HOLD.format(out=os.path.join(cluster.base, "out"), tag=tag),
        user=user,
    )
    wait_until(
        lambda: (
            os.path.exists(out(cluster, f"{tag}.started"))
            or cluster.job_state(job) not in ("PENDING", "RUNNING", "CONFIGURING", "")
        ),
        60,
        f"job {job} to start",
    )
    return job


def release(cluster, tag: str, job: int) -> str:
    open(out(cluster, f"{tag}.stop"), "w").close()
    return cluster.wait_for_jobs([job], timeout=60)[job]


def test_user_b_cannot_open_user_a_device_and_env_names_exactly_it(cluster, users):
    alice = users["stpu_alice"]
    nodes = inventory(cluster, "n1")
    job_a = hold(cluster, "stpu_alice", "a1", ["-w", "n1", "--gres=tpu:edgetpu_usb:1"])
    try:
        assert read(out(cluster, "a1.devices")).strip() == "usb-2-1.3"
        assert read(out(cluster, "a1.paths")).strip() == "usb:/sys/bus/usb/devices/2-1.3"
        usb_node = nodes["usb-2-1.3"][0]
        pci_node = nodes["pci-0000:03:00.0"][0]
        assert owner(usb_node) == (alice, 0, 0o600)
        assert owner(pci_node) == (0, 0, 0o600)  # the other TPU stays idle
        held = {row["identity"]: row for row in leases(cluster, "n1")}
        assert held["usb-2-1.3"]["job_id"] == job_a and held["usb-2-1.3"]["uid"] == alice
        # From a plain shell: bob is refused by the kernel, alice gets past the permission check.
        assert open_as("stpu_bob", usb_node) == "EACCES"
        assert open_as("stpu_alice", usb_node) == "ENXIO"  # permitted; no driver behind the fake node
        assert open_as("stpu_alice", pci_node) == "EACCES"  # not hers
        # From bob's own job on the same node (he gets the other TPU).
        target = out(cluster, "target")
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(usb_node)
        job_b = cluster.sbatch(
            ["-w", "n1", "--gres=tpu:1", "-o", "/dev/null"],
            PROBE.format(target=target, out=os.path.join(cluster.base, "out"), tag="b1"),
            user="stpu_bob",
        )
        assert cluster.wait_for_jobs([job_b], timeout=60)[job_b] == "COMPLETED"
        assert read(out(cluster, "b1.probe")).strip() == "EACCES"
    finally:
        state = release(cluster, "a1", job_a)
    assert state == "COMPLETED"
    assert leases(cluster, "n1") == []  # waits for the revoked stick to come back
    assert not os.path.lexists(usb_node)  # revoked: that usb_device and its node are gone
    usb_node = inventory(cluster, "n1")["usb-2-1.3"][0]  # the re-enumerated stick's node
    assert owner(usb_node) == (0, 0, 0o600)  # back to the idle policy
    assert open_as("stpu_alice", usb_node) == "EACCES"
    events = [e for e in audit(cluster, "n1") if e.get("job_id") in (job_a, job_b)]
    assert {(e["event"], e["job_id"], e["identity"]) for e in events} == {
        ("acquire", job_a, "usb-2-1.3"),
        ("revoke", job_a, "usb-2-1.3"),
        ("release", job_a, "usb-2-1.3"),
        ("acquire", job_b, "pci-0000:03:00.0"),
        ("release", job_b, "pci-0000:03:00.0"),
        # Each job's energy on its device (root's estimate: no sensor on an Edge TPU).
        ("energy", job_a, "usb-2-1.3"),
        ("energy", job_b, "pci-0000:03:00.0"),
    }
    assert not os.listdir(os.path.join(cluster.node_dir("n1"), "state", "jobs"))


def test_gpu_is_leased_like_a_tpu_when_configured(cluster, users):
    gpu_nodes = inventory(cluster, "n2")["pci-0000:0a:00.0"]
    job = hold(cluster, "stpu_bob", "g1", ["-w", "n2", "--gres=gpu:1"])
    try:
        assert read(out(cluster, "g1.gpus")).strip() == "pci-0000:0a:00.0"
        assert read(out(cluster, "g1.devices")).strip() == ""  # no TPU: empty, not inherited
        for node in gpu_nodes:
            assert owner(node) == (users["stpu_bob"], 0, 0o600)
            assert open_as("stpu_alice", node) == "EACCES"
    finally:
        assert release(cluster, "g1", job) == "COMPLETED"
    for node in gpu_nodes:
        assert owner(node) == (0, 0, 0o600)


def test_job_without_gres_gets_no_device_and_no_inherited_variables(cluster, users):
    script = '#!/bin/sh\necho "[$SLURM_TPU_DEVICES][${SLURM_TPU_EDGETPU_PATHS-unset}]" > ' + out(cluster, "plain.env")
    job = cluster.sbatch(
        ["-w", "n1", "-o", "/dev/null", "--export=ALL,SLURM_TPU_DEVICES=usb-2-1.3"], script, user="stpu_alice"
    )
    assert cluster.wait_for_jobs([job], timeout=60)[job] == "COMPLETED"
    assert read(out(cluster, "plain.env")).strip() == "[][unset]"
    assert all(owner(n[0]) == (0, 0, 0o600) for n in inventory(cluster, "n1").values())


SEED = """#!/bin/sh
start=$(date +%s.%N)
sleep 1.5
echo "$SLURM_JOB_ID $SLURMD_NODENAME ${{SLURM_TPU_DEVICES:--}} $start $(date +%s.%N)" > {out}/seed.$SLURM_JOB_ID
"""


# A plain job taking a whole node (-c 2 of its 2 CPUs) that waits until all PLAIN of
# them run at once. Slurm never gives one CPU to two jobs, so PLAIN such jobs running
# together are on PLAIN different nodes: a spread Slurm guarantees, not one that
# depends on how fast earlier jobs finished. (If Slurm cannot run them together the
# jobs time out and fail, and the test says so.)
PLAIN = 4  # every node, the plain n3 included (its prolog is checked below)
PLAIN_SEED = """#!/bin/sh
start=$(date +%s.%N)
touch {out}/plain-up.$SLURM_JOB_ID
i=0
while [ $(ls {out} | grep -c '^plain-up\\.') -lt {count} ]; do
    i=$((i+1)); [ $i -lt 1200 ] || exit 3
    sleep 0.1
done
echo "$SLURM_JOB_ID $SLURMD_NODENAME ${{SLURM_TPU_DEVICES:--}} $start $(date +%s.%N)" > {out}/seed.$SLURM_JOB_ID
"""


def _intervals(cluster, jobs):
    rows = []
    for job in jobs:
        job_id, node, device, start, end = read(out(cluster, f"seed.{job}")).split()
        rows.append((float(start), float(end), node, device))
    return rows


def _max_concurrent(rows, key=lambda row: True) -> int:
    points = sorted(
        [(s, 1) for s, e, *rest in rows if key((s, e, *rest))]
        + [(e, -1) for s, e, *rest in rows if key((s, e, *rest))],
        key=lambda p: (p[0], p[1]),
    )
    best = current = 0
    for _, delta in points:
        current += delta
        best = max(best, current)
    return best


def test_seed_experiment_one_tpu_serial_two_tpus_pairwise_plain_jobs_spread(cluster, users):
    script = SEED.format(out=os.path.join(cluster.base, "out"))
    one = [cluster.sbatch(["-w", "n4", "--gres=tpu:1", "-o", "/dev/null"], script, user="stpu_alice") for _ in range(5)]
    two = [
        cluster.sbatch(["-w", "n1", "--gres=tpu:1", "-o", "/dev/null"], script, user=("stpu_alice", "stpu_bob")[i % 2])
        for i in range(5)
    ]
    plain_script = PLAIN_SEED.format(out=os.path.join(cluster.base, "out"), count=PLAIN)
    plain = [cluster.sbatch(["-c", "2", "-o", "/dev/null"], plain_script, user="stpu_bob") for _ in range(PLAIN)]
    states = cluster.wait_for_jobs(one + two + plain, timeout=180)
    assert set(states.values()) == {"COMPLETED"}, states
    serial = _intervals(cluster, one)
    assert {device for *_, device in serial} == {"usb-2-1.3"}
    assert _max_concurrent(serial) == 1  # one TPU: strictly one after another
    pairs = _intervals(cluster, two)
    assert _max_concurrent(pairs) <= 2
    assert {device for *_, device in pairs} == {"usb-2-1.3", "pci-0000:03:00.0"}
    for device in ("usb-2-1.3", "pci-0000:03:00.0"):
        assert _max_concurrent(pairs, key=lambda row, d=device: row[3] == d) == 1  # never shared
    plain_rows = _intervals(cluster, plain)
    assert len({node for _, _, node, _ in plain_rows}) == PLAIN  # whole-node jobs, all at once
    assert {device for *_, device in plain_rows} == {"-"}  # and no device for any of them
    for node in ("n1", "n4"):
        no_overlaps(audit(cluster, node))
        assert leases(cluster, node) == []
    assert os.path.exists(os.path.join(cluster.node_dir("n3"), "state", "hooks.snapshot"))  # its prolog ran


def test_second_epilog_and_epilog_without_lease_are_no_ops(cluster, users):
    job = hold(cluster, "stpu_alice", "e1", ["-w", "n4", "--gres=tpu:1"])
    assert release(cluster, "e1", job) == "COMPLETED"
    before = audit(cluster, "n4")
    usb = inventory(cluster, "n4")["usb-2-1.3"][0]
    for job_id in (job, 999999):
        done = run_hook("epilog", hook_env(cluster, "n4", job_id, users["stpu_alice"]))
        assert done.returncode == 0 and done.stderr == ""
    assert audit(cluster, "n4") == before
    assert owner(usb) == (0, 0, 0o600)
    assert cluster.node_states()["n4"] == "IDLE"


def test_task_prolog_prints_only_the_jobs_own_lines(cluster, users):
    job = hold(cluster, "stpu_alice", "t1", ["-w", "n1", "--gres=tpu:2"])
    try:
        devices = read(out(cluster, "t1.devices")).strip().split(",")
        assert sorted(devices) == ["pci-0000:03:00.0", "usb-2-1.3"]
        # Allocation order (Slurm's IDX order: slurm.conf Gres= lists edgetpu_usb first).
        assert devices == ["usb-2-1.3", "pci-0000:03:00.0"]
        mine = run_hook("task-prolog", hook_env(cluster, "n1", job))
        other = run_hook("task-prolog", hook_env(cluster, "n1", job + 1000))
        hostile = run_hook("task-prolog", hook_env(cluster, "n1", 0, SLURM_JOB_ID="1;id"))
    finally:
        assert release(cluster, "t1", job) == "COMPLETED"
    assert "export SLURM_TPU_DEVICES=usb-2-1.3,pci-0000:03:00.0\n" in mine.stdout
    pci_node = inventory(cluster, "n1")["pci-0000:03:00.0"][0]
    # The node's libedgetpu shows unmodified Coral code these two, in this order (a job's lines win).
    assert f"\nexport EDGETPU_VISIBLE_DEVICES=/sys/bus/usb/devices/2-1.3,{pci_node}\n" in mine.stdout
    assert other.stdout.startswith("export EDGETPU_VISIBLE_DEVICES=\nunset SLURM_TPU_DEVICES")
    assert hostile.stdout == other.stdout
    assert mine.returncode == other.returncode == hostile.returncode == 0


# What the runner writes (slurm_tpu/protocol/usage.py's file name and JSON), written by hand
# with Debian's python3 so this tests the prolog/epilog side alone; the real runner's
# path is covered end to end by tests/ops/test_usage_cluster.py.
USAGE_JOB = """#!/bin/sh
/usr/bin/python3 -I -c '
import json, os
box = os.environ["SLURM_TPU_USAGE_DIR"]
for identity in os.environ["SLURM_TPU_DEVICES"].split(","):
    with open(os.path.join(box, identity + ".json"), "w") as handle:
        json.dump({{"version": 1, "inferences": 7, "seconds": 0.25, "energy_j": None}}, handle)
print(os.stat(box).st_uid, oct(os.stat(box).st_mode & 0o7777))
' > {out}
"""


def test_runner_usage_records_reach_the_audit_log(cluster, users):
    job = cluster.sbatch(
        ["-w", "n1", "--gres=tpu:1", "-o", "/dev/null", "-e", out(cluster, "usage.err")],
        USAGE_JOB.format(out=out(cluster, "usage.box")),
        user="stpu_alice",
    )
    assert cluster.wait_for_jobs([job], timeout=60)[job] == "COMPLETED", read(out(cluster, "usage.err"))
    assert read(out(cluster, "usage.box")).split() == [str(users["stpu_alice"]), "0o700"]  # the job's own box
    usage = [e for e in audit(cluster, "n1") if e["event"] == "usage" and e["job_id"] == job]
    assert len(usage) == 1 and usage[0]["inferences"] == 7 and usage[0]["uid"] == users["stpu_alice"]
    box = os.path.join(cluster.node_dir("n1"), "state", "job-usage", str(job))
    assert not os.path.lexists(box) and box not in open("/proc/self/mounts").read()  # unmounted, removed


def test_two_node_job_gets_one_lease_per_node_and_each_task_its_nodes_device(cluster, users):
    result = out(cluster, "multi.txt")
    script = "#!/bin/sh\nsrun -l sh -c 'echo $SLURMD_NODENAME $SLURM_TPU_DEVICES' > " + result + "\n"
    job = cluster.sbatch(
        [
            "-N2",
            "-w",
            "n1,n4",
            "--ntasks-per-node=1",
            "--gres=tpu:edgetpu_usb:1",
            "-o",
            "/dev/null",
            "-e",
            out(cluster, "multi.err"),
        ],
        script,
        user="stpu_bob",
    )
    assert cluster.wait_for_jobs([job], timeout=90)[job] == "COMPLETED", read(out(cluster, "multi.err"))
    lines = sorted(line.split(": ", 1)[1].split() for line in read(result).splitlines())
    assert lines == [["n1", "usb-2-1.3"], ["n4", "usb-2-1.3"]]
    for node in ("n1", "n4"):
        acquired = [e for e in audit(cluster, node) if e["event"] == "acquire" and e["job_id"] == job]
        assert [(e["identity"], e["uid"]) for e in acquired] == [("usb-2-1.3", users["stpu_bob"])]
        assert leases(cluster, node) == []


def test_leases_command_shows_who_holds_what(cluster, users):
    import subprocess

    job = hold(cluster, "stpu_alice", "l1", ["-w", "n1", "--gres=tpu:edgetpu_pci:1"])
    try:
        table = subprocess.run(
            [*cluster.slurm_tpu, "leases"],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, SLURM_TPU_CONFIG=cluster.node_config("n1")),
        ).stdout
        row = [line for line in table.splitlines() if line.startswith("pci-0000:03:00.0")]
        assert len(row) == 1 and str(job) in row[0] and "stpu_alice" in row[0] and "running" in row[0]
        assert "usb-2-1.3" not in table
    finally:
        assert release(cluster, "l1", job) == "COMPLETED"
    idle = subprocess.run(
        [*cluster.slurm_tpu, "leases"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, SLURM_TPU_CONFIG=cluster.node_config("n1")),
    ).stdout
    assert idle.startswith("No accelerator is leased")
