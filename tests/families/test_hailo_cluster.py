"""Hailo-8 next to a Coral card: the real local Slurm cluster, and the CLI on Hailo nodes.

The node is tests/hardware/hailo_node.umockdev: two Hailo-8 cards as Raspberry Pi
OS's hailo_pci driver shows them (class devices under /sys/devices/virtual, tied
to their card only by ``board_location``; ``hailo0`` is the card at 0000:02:00.0)
and a Coral PCIe card. Its device nodes are real character devices under the
node's directory (harness.localcluster.hardware.materialize), with a major no
driver answers, so a permitted open() fails ENXIO *after* the kernel's permission
check and a refused one fails EACCES (the Coral card's node is the emulated apex
driver's pty: a permitted open() succeeds). Jobs are submitted by the real users
stpu_alice and stpu_bob and measure what they can open from inside their job.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from helpers import HARDWARE, detect_json, run_cli

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "isolation"))  # the cluster tests' support.py
from support import (
    SURVIVOR_JOB,
    audit,
    drain_reason,
    finish_cluster,
    inventory,
    leases,
    make_cluster,
    no_overlaps,
    node_on,
    open_as,
    out,
    owner,
    require_root_and_slurm,
    restore_node,
    resume,
    wait_until,
)

NODE = HARDWARE / "hailo_node.umockdev"
HAILO_1, HAILO_2, CORAL = "pci-0000:01:00.0", "pci-0000:02:00.0", "pci-0000:03:00.0"
ADDRESS = {HAILO_1: "0000:01:00.0", HAILO_2: "0000:02:00.0"}  # HailoRT's device id of each card
HAILOS = (HAILO_1, HAILO_2)


# ---- the real cluster ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    require_root_and_slurm()
    from harness.localcluster.cluster import NodeSpec

    started = make_cluster([NodeSpec("n1", str(NODE))])
    yield started
    finish_cluster(started)


# What a job sees: its variables ("unset" when not set at all), then what it can open.
JOB = """#!/bin/sh
echo "${{SLURM_TPU_HAILO_DEVICES-unset}}" > {out}/{tag}.hailo
echo "${{SLURM_TPU_DEVICES-unset}}" > {out}/{tag}.devices
echo "${{SLURM_TPU_EDGETPU_PATHS-unset}}" > {out}/{tag}.paths
/usr/bin/python3 -I -c '
import errno, os, sys
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK)); print(path, "OPENED")
    except OSError as exc:
        print(path, errno.errorcode.get(exc.errno, exc.errno))
' {probes} > {out}/{tag}.probe
touch {out}/{tag}.started
while [ ! -e {out}/{tag}.stop ]; do sleep 0.1; done
"""


class Job:
    """A job of ``user`` holding ``gres`` on n1 until :meth:`finish`; what it saw is read from its files."""

    def __init__(self, cluster, user: str, tag: str, gres: str, probes: tuple[str, ...] = ()):
        self.cluster, self.tag = cluster, tag
        script = JOB.format(out=os.path.join(cluster.base, "out"), tag=tag, probes=" ".join(probes))
        self.id = cluster.sbatch(
            ["-w", "n1", f"--gres={gres}", "-o", "/dev/null", "-e", out(cluster, f"{tag}.err")], script, user=user
        )
        wait_until(
            lambda: (
                os.path.exists(out(cluster, f"{tag}.started"))
                or cluster.job_state(self.id) not in ("PENDING", "CONFIGURING", "RUNNING", "")
            ),
            60,
            f"job {self.id} ({tag}) to start",
        )
        assert os.path.exists(out(cluster, f"{tag}.started")), self.read("err")

    def read(self, what: str) -> str:
        try:
            with open(out(self.cluster, f"{self.tag}.{what}"), encoding="utf-8") as handle:
                return handle.read().strip()
        except FileNotFoundError:
            return ""

    def probes(self) -> dict[str, str]:
        """path -> OPENED / EACCES / ENXIO, as the job's own process found it."""
        return dict(line.split(" ", 1) for line in self.read("probe").splitlines())

    def finish(self) -> str:
        open(out(self.cluster, f"{self.tag}.stop"), "w").close()
        return self.cluster.wait_for_jobs([self.id], timeout=60)[self.id]


def hailo_held_by(job: Job) -> str:
    """The one Hailo identity a job's SLURM_TPU_HAILO_DEVICES names."""
    by_address = {address: identity for identity, address in ADDRESS.items()}
    value = job.read("hailo")
    assert value in by_address, f"SLURM_TPU_HAILO_DEVICES={value!r}: not exactly one of this node's Hailo cards"
    return by_address[value]


def assert_idle(cluster) -> None:
    assert leases(cluster, "n1") == []
    for identity, nodes in inventory(cluster, "n1").items():
        for node in nodes:
            assert owner(node) == (0, 0, 0o600), (identity, node)
    no_overlaps(audit(cluster, "n1"))


@pytest.mark.slurm
def test_the_node_offers_two_hailo_npus_and_one_tpu(cluster, users):
    nodes = inventory(cluster, "n1")
    assert sorted(nodes) == [HAILO_1, HAILO_2, CORAL]
    # Paired by board_location, not by index: hailo1 is the card at 0000:01:00.0.
    assert [os.path.basename(n) for n in nodes[HAILO_1]] == ["hailo1"]
    assert [os.path.basename(n) for n in nodes[HAILO_2]] == ["hailo0"]
    node = cluster.show_node("n1")
    assert "npu:hailo8:2" in node and "tpu:edgetpu_pci:1" in node
    features = next(t for t in node.split() if t.startswith("AvailableFeatures="))[len("AvailableFeatures=") :]
    assert {"npu", "hailo", "tpu"} <= set(features.split(","))
    for identity in (HAILO_1, HAILO_2, CORAL):  # idle: out of every user's reach
        assert owner(nodes[identity][0]) == (0, 0, 0o600)
        assert open_as("stpu_alice", nodes[identity][0]) == "EACCES"


@pytest.mark.slurm
def test_npu_and_tpu_jobs_each_get_exactly_their_device_and_nothing_else(cluster, users):
    nodes = inventory(cluster, "n1")
    every = tuple(n for identity in (HAILO_1, HAILO_2, CORAL) for n in nodes[identity])
    alice = Job(cluster, "stpu_alice", "npu-a", "npu:1", probes=every)
    try:
        mine = hailo_held_by(alice)
        (other,) = [h for h in HAILOS if h != mine]
        assert alice.read("devices") in ("", "unset")  # SLURM_TPU_DEVICES names Edge TPUs only
        assert alice.read("paths") in ("", "unset")
        assert owner(nodes[mine][0]) == (users["stpu_alice"], 0, 0o600)
        assert owner(nodes[other][0]) == (0, 0, 0o600) and owner(nodes[CORAL][0]) == (0, 0, 0o600)
        # From her job: her card gets past the permission check; the idle card and the TPU do not.
        assert alice.probes() == {nodes[mine][0]: "ENXIO", nodes[other][0]: "EACCES", nodes[CORAL][0]: "EACCES"}
        held = {row["identity"]: row for row in leases(cluster, "n1")}
        assert set(held) == {mine} and held[mine]["job_id"] == alice.id

        bob = Job(cluster, "stpu_bob", "tpu-b", "tpu:1", probes=(nodes[mine][0], nodes[CORAL][0]))
        try:
            assert bob.read("hailo") == "unset"
            assert bob.read("devices") == CORAL
            assert bob.read("paths") == f"pci:{nodes[CORAL][0]}"
            assert owner(nodes[CORAL][0]) == (users["stpu_bob"], 0, 0o600)
            # Bob, from his own job on the same node: alice's Hailo is refused, his TPU is his (its
            # node is the emulated apex driver's pty, harness/localcluster/apex.py: a permitted open works).
            assert bob.probes() == {nodes[mine][0]: "EACCES", nodes[CORAL][0]: "OPENED"}
        finally:
            assert bob.finish() == "COMPLETED"

        bob = Job(cluster, "stpu_bob", "npu-b", "npu:1", probes=(nodes[mine][0], nodes[other][0]))
        try:
            assert hailo_held_by(bob) == other  # the second card, never alice's
            assert owner(nodes[other][0]) == (users["stpu_bob"], 0, 0o600)
            assert bob.probes() == {nodes[mine][0]: "EACCES", nodes[other][0]: "ENXIO"}
            assert open_as("stpu_alice", nodes[other][0]) == "EACCES"  # and alice, from a login shell, his
        finally:
            assert bob.finish() == "COMPLETED"
    finally:
        assert alice.finish() == "COMPLETED"
    assert_idle(cluster)
    events = {
        (e["event"], e["job_id"], e["identity"])
        for e in audit(cluster, "n1")
        if e.get("job_id") == alice.id and e["event"] in ("acquire", "release")
    }
    assert events == {("acquire", alice.id, mine), ("release", alice.id, mine)}
    assert not os.listdir(os.path.join(cluster.node_dir("n1"), "state", "jobs"))


@pytest.mark.slurm
def test_two_npus_in_one_job_come_in_allocation_order(cluster, users):
    nodes = inventory(cluster, "n1")
    job = Job(cluster, "stpu_alice", "npu-2", "npu:2")
    try:
        addresses = job.read("hailo").split(",")
        assert sorted(addresses) == sorted(ADDRESS.values())
        for identity in HAILOS:
            assert owner(nodes[identity][0]) == (users["stpu_alice"], 0, 0o600)
        held = [row["identity"] for row in leases(cluster, "n1")]
        assert sorted(held) == sorted(HAILOS)
    finally:
        assert job.finish() == "COMPLETED"
    assert_idle(cluster)


@pytest.mark.slurm
def test_a_process_keeping_a_hailo_open_after_its_job_drains_the_node(cluster, users):
    """The hailo_pci driver cannot be unbound safely under open files (see
    slurm_tpu/families/hailo.py: a close after remove frees DMA memory with a NULL
    device), so like the PCIe apex a survivor is found and the node drained."""
    from slurm_tpu.config import load_config
    from slurm_tpu.ops.health_check import clear_kept_leases

    identity = HAILO_1
    assert_idle(cluster)
    node = inventory(cluster, "n1")[identity][0]
    # A real driver's numbers, so a process can hold it open (not /dev/null: every daemon holds that).
    rdev = node_on(node, "/dev/full")
    pidfile = out(cluster, "survivor.pid")
    survivor = None
    try:
        script = SURVIVOR_JOB.format(node=node, pidfile=pidfile)
        # Both cards are free: ask for both so the job surely gets the repointed one.
        held = cluster.sbatch(
            ["-w", "n1", "--gres=npu:2", "-o", "/dev/null", "-e", "/dev/null"], script, user="stpu_alice"
        )
        cluster.wait_for_jobs([held], timeout=60)
        survivor = int(open(pidfile).read())
        wait_until(lambda: "DRAIN" in cluster.node_states()["n1"], 30, "the epilog to drain n1")
        reason = drain_reason(cluster)
        assert reason.startswith("slurm-tpu:") and f"still holds {identity}" in reason, reason
        pids = re.search(r"pid ([0-9,]+) still holds", reason).group(1).split(",")
        assert str(survivor) in pids  # (other tests running beside this one may hold /dev/full too)
        assert owner(node) == (0, 0, 0o600)  # taken away from alice at once, even while drained
        assert open_as("stpu_alice", node) == "EACCES"
    finally:
        if survivor:
            os.kill(survivor, 9)
    wait_until(lambda: not os.path.exists(f"/proc/{survivor}"), 30, "the survivor to die")
    assert clear_kept_leases(load_config(cluster.node_config("n1"))) == [(identity, "cleared")]
    resume(cluster)
    restore_node(node, rdev)
    assert_idle(cluster)


@pytest.mark.slurm
def test_infer_in_a_hailo_job_says_in_one_line_that_hailo_runs_hef_models(cluster, users):
    from harness.modelgen import write_models

    models = write_models(Path(out(cluster, "models")), image_count=1)
    image = sorted(Path(models["images"]).glob("*.png"))[0]
    said, status = out(cluster, "infer.out"), out(cluster, "infer.status")
    job = cluster.sbatch(
        ["-w", "n1", "--gres=npu:1", "-o", "/dev/null", "-e", "/dev/null"],
        f"#!/bin/sh\n{sys.executable} -m slurm_tpu.cli infer {models['classifier']} {image} "
        f"> {said} 2>&1\necho $? > {status}\n",
        user="stpu_bob",
    )
    assert cluster.wait_for_jobs([job], timeout=120)[job] == "COMPLETED"
    lines = [line for line in open(said, encoding="utf-8").read().splitlines() if line.strip()]
    assert int(open(status).read()) != 0
    assert len(lines) == 1, lines
    assert ".hef" in lines[0] and "HailoRT" in lines[0] and "SLURM_TPU_HAILO_DEVICES" in lines[0], lines[0]
    assert_idle(cluster)


@pytest.mark.slurm
def test_health_and_metrics_on_the_cluster_node_show_the_hailo_cards(cluster, tmp_path):
    env = cluster.env({"SLURM_TPU_CONFIG": cluster.node_config("n1")})
    healthy = run_cli(["health", "--node", "n1", "--dry-run", "--json"], str(NODE), env=env)
    assert healthy.returncode == 0, healthy.stderr
    report = json.loads(healthy.stdout)
    assert sorted(report["configured"]) == [HAILO_1, HAILO_2, CORAL]
    assert report["problems"] == [] and report["action"] == "nothing"
    # The card at 0000:02:00.0 loses its driver (hailo0 goes with it): health names it and the fix.
    unbound = tmp_path / "unbound.umockdev"
    unbound.write_text(without_driver(NODE.read_text(), "0000:02:00.0", "hailo0"))
    sick = run_cli(["health", "--node", "n1", "--dry-run", "--json"], str(unbound), env=env)
    assert sick.returncode == 0, sick.stderr
    report = json.loads(sick.stdout)
    assert [p["identity"] for p in report["problems"]] == [HAILO_2]
    assert report["action"] == "drain" and report["reason"].startswith(f"slurm-tpu: {HAILO_2} unusable")
    assert "hailo_pci" in report["reason"]

    job = Job(cluster, "stpu_bob", "metrics", "npu:1")
    try:
        mine = hailo_held_by(job)
        scraped = run_cli(["metrics", "--node", "n1"], str(NODE), env=env)
    finally:
        assert job.finish() == "COMPLETED"
    assert scraped.returncode == 0, scraped.stderr
    values = samples(scraped.stdout)
    for identity in HAILOS:
        assert values[("slurm_tpu_device_present", identity)] == 1
        assert values[("slurm_tpu_device_healthy", identity)] == 1
        assert values[("slurm_tpu_device_leased", identity)] == (1 if identity == mine else 0)
        labels = labels_of(scraped.stdout, "slurm_tpu_device_present", identity)
        assert labels["kind"] == "hailo"
        # The held card's series carry its job and user (dcgm-exporter's hpc_job), the others none.
        held = (labels.get("hpc_job"), labels.get("hpc_user"))
        assert held == ((str(job.id), "stpu_bob") if identity == mine else (None, None))
    assert values[("slurm_tpu_device_leased", CORAL)] == 0
    assert_idle(cluster)


# ---- the CLI on Hailo nodes (no cluster) ------------------------------------------------------------------


def without_driver(text: str, address: str, class_device: str) -> str:
    """A umockdev description in which the card at ``address`` has no driver (and so no class device)."""
    blocks = []
    for block in text.split("\n\n"):
        lines = block.strip().splitlines()
        if not lines or lines[0] == f"P: /devices/virtual/hailo_chardev/{class_device}":
            continue
        if lines[0].endswith(f"/{address}"):
            lines = [line for line in lines if not line.startswith(("E: DRIVER=", "L: driver="))]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def samples(text: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, s.labels.get("identity", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def labels_of(text: str, name: str, identity: str) -> dict[str, str]:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("identity") == identity:
                return sample.labels
    raise AssertionError(f"no {name} sample for {identity}")


def hailo_rows(document: dict) -> dict[str, dict]:
    return {a["identity"]: a for a in document["accelerators"] if a["kind"] == "hailo"}


@pytest.mark.parametrize("hardware", ["hailo_node", "hailo_node_child_layout"])
def test_detect_pairs_each_card_with_its_node_in_both_driver_layouts(hardware):
    document = detect_json(hardware)
    cards = hailo_rows(document)
    assert sorted(cards) == [HAILO_1, HAILO_2]
    assert cards[HAILO_1]["device_nodes"] == ["/dev/hailo1"]
    assert cards[HAILO_2]["device_nodes"] == ["/dev/hailo0"]
    assert all(card["usable"] for card in cards.values())
    assert [a["identity"] for a in document["accelerators"] if a["kind"] == "edgetpu"] == [CORAL]
    table = run_cli(["detect"], hardware)
    assert table.returncode == 0, table.stderr
    lines = {line.split()[0]: line for line in table.stdout.splitlines() if line.startswith("pci-")}
    assert "hailo" in lines[HAILO_1].split() and "/dev/hailo1" in lines[HAILO_1].split()
    assert "/dev/hailo0" in lines[HAILO_2].split() and "UNUSABLE" not in lines[HAILO_2]
    assert "3 accelerator(s), 3 usable, 0 unusable" in table.stdout


def test_a_hailo_without_driver_is_listed_unusable_with_the_fix():
    (card,) = detect_json("hailo_no_driver")["accelerators"]
    assert card["identity"] == "pci-0000:01:00.0" and card["kind"] == "hailo" and not card["usable"]
    assert card["device_nodes"] == []
    reason = card["reason"]
    assert "0000:01:00.0" in reason and "hailo_pci" in reason and "hailo-all" in reason
    table = run_cli(["detect"], "hailo_no_driver").stdout
    assert "1 accelerator(s), 0 usable, 1 unusable" in table
    gres = run_cli(["gres-conf", "--node", "n1"], "hailo_no_driver")
    assert gres.returncode == 0, gres.stderr
    assert "Name=npu" not in gres.stdout and "# not configured: pci-0000:01:00.0" in gres.stdout


def test_a_bound_hailo_without_its_class_device_is_unusable_for_its_own_reason():
    (card,) = detect_json("hailo_bound_no_chardev")["accelerators"]
    assert card["identity"] == "pci-0000:01:00.0" and not card["usable"]
    assert "0000:01:00.0" in card["reason"] and "hailo_chardev" in card["reason"]
    assert "hailo-all" not in card["reason"]  # the driver is there: installing it is not the fix


def test_gres_and_node_lines_name_the_hailo_npus():
    gres = run_cli(["gres-conf", "--node", "n1"], "hailo_node")
    assert gres.returncode == 0, gres.stderr
    lines = [line for line in gres.stdout.splitlines() if line.startswith("NodeName=")]
    assert sorted(lines) == [
        "NodeName=n1 Name=npu Type=hailo8 File=/dev/slurm-tpu/pci-0000:01:00.0",
        "NodeName=n1 Name=npu Type=hailo8 File=/dev/slurm-tpu/pci-0000:02:00.0",
        "NodeName=n1 Name=tpu Type=edgetpu_pci File=/dev/slurm-tpu/pci-0000:03:00.0",
    ]
    node = run_cli(["node-conf", "--node", "n1", "--no-hardware"], "hailo_node")
    assert node.returncode == 0, node.stderr
    (line,) = [line for line in node.stdout.splitlines() if line.startswith("NodeName=")]
    fields = dict(token.split("=", 1) for token in line.split())
    assert sorted(fields["Gres"].split(",")) == ["npu:hailo8:2", "tpu:edgetpu_pci:1"]
    assert {"npu", "hailo"} <= set(fields["Feature"].split(","))


def test_udev_rules_take_hailo_nodes_from_the_upstream_world_writable_rule():
    rules = run_cli(["udev-rules"], "hailo_node")
    assert rules.returncode == 0, rules.stderr
    hailo = [
        line for line in rules.stdout.splitlines() if not line.startswith("#") and 'SUBSYSTEM=="hailo_chardev"' in line
    ]
    assert hailo, rules.stdout
    # Upstream's 51-hailo-udev.rules sets MODE="0666"; ours (60-...) must override it with := .
    adding = [line for line in hailo if 'ACTION=="remove"' not in line]
    assert adding and all('MODE:="0600"' in line and 'OWNER:="root"' in line for line in adding)
    (name,) = re.findall(r"/etc/udev/rules\.d/(\S+\.rules)", rules.stdout)
    assert name > "51-hailo-udev.rules", f"{name} would run before upstream's rule and lose to its MODE 0666"
