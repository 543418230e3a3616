"""Writers the apex driver counts (gasket's ``write_open_count``) are checked before a PCIe Edge TPU is
handed over, as well as after a job, and the job that left them is the one named.

gasket_core.c gasket_open()/gasket_release() count every writable open file of
/dev/apex_N until its last reference goes, one in flight over SCM_RIGHTS or kept
by a mapping included (slurm_tpu/access/revoke.py). The hooks read that count
from sysfs. The unit tests below write the attribute as plain files; the cluster
tests run against the emulated apex driver (harness/localcluster/apex.py), whose
attribute follows the node's real open files.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
from support import (
    PCI,
    SMUGGLE,
    audit,
    clear_lease,
    drain_reason,
    inventory,
    leases,
    one_node_two_tpus,
    out,
    owner,
    resume,
    wait_until,
)

from slurm_tpu.access.ledger import KEPT, Lease, Ledger
from slurm_tpu.config import Config
from slurm_tpu.hooks import leasing
from slurm_tpu.hooks.context import JobContext
from slurm_tpu.hooks.settings import HookSettings, apply_families
from slurm_tpu.protocol import audit as audit_format
from slurm_tpu.protocol.inventory import KnownDevice

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, chown)")


# ---- which job last held a device, from the audit log's own lines ---------------------


def test_the_last_acquire_of_a_device_is_found_in_the_audit_lines():
    lines = b"".join(
        [
            audit_format.encode("acquire", 1.0, {"identity": PCI, "job_id": 7, "uid": 1001, "nodes": ["/dev/apex_0"]}),
            audit_format.encode("release", 2.0, {"identity": PCI, "job_id": 7, "uid": 1001, "by_job": None}),
            audit_format.encode("acquire", 3.0, {"identity": "usb-2-1.3", "job_id": 8, "uid": 1002}),
            # A string field holding what looks like a newer acquire of the card: escaped, never a field.
            audit_format.encode(
                "usage-rejected",
                4.0,
                {
                    "identity": "usb-2-1.3",
                    "job_id": 8,
                    "uid": 1002,
                    "reason": f'"event": "acquire", "identity": "{PCI}", "job_id": 666',
                },
            ),
            b'{"t": 5.0, "event": "acquire", "identity": "' + PCI.encode(),  # a torn last line
        ]
    )
    assert audit_format.last_acquire(lines, PCI) == (7, 1001)
    assert audit_format.last_acquire(lines, "usb-2-1.3") == (8, 1002)
    assert audit_format.last_acquire(lines, "pci-0000:04:00.0") is None


# ---- the hooks' sequence against a materialized sysfs ------------------------------------


@pytest.fixture()
def card(tmp_path):
    """A PCIe Edge TPU node (idle, root 0600) and its sysfs ``write_open_count``; hook settings that know it."""
    node = tmp_path / "dev" / "apex_0"
    node.parent.mkdir()
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(240, 221))
    count = tmp_path / "sys" / "class" / "apex" / "apex_0" / "write_open_count"
    count.parent.mkdir(parents=True)
    count.write_text("0\n")
    device = KnownDevice(PCI, "edgetpu", "pci", (str(node),))
    settings = HookSettings(str(tmp_path / "state"), devices={PCI: device})
    apply_families(settings, Config())
    settings.sysfs_root = str(tmp_path / "sys")
    settings.holder_scan_s = 120.0  # these tests are about the driver's count, not the scan's budget under load
    return node, count, device, settings


@needs_root
def test_a_writer_left_while_idle_makes_the_prolog_refuse_naming_the_last_job_that_held_it(card):
    node, count, device, settings = card
    with Ledger(settings.state_dir) as ledger:
        leasing.acquire(ledger, JobContext(41, 4321, "alice", "n1"), [device], settings)
        assert leasing.release(ledger, 41, settings) == []
        count.write_text("1\n")  # a root process opened it while idle: gasket_open() counts it
        with pytest.raises(leasing.DeviceNotFree) as refused:
            leasing.acquire(ledger, JobContext(42, 5432, "bob", "n1"), [device], settings)
        message = str(refused.value)
        assert "1 writable fd(s)" in message and "last held by job 41" in message and PCI in message
        kept = ledger.read(PCI)
        assert isinstance(kept, Lease) and (kept.phase, kept.job_id, kept.uid) == (KEPT, 41, 4321)
        assert os.lstat(node).st_uid == 0 and stat.S_IMODE(os.lstat(node).st_mode) == 0o600
        # Bob's next try meets the kept lease: still refused, still naming job 41.
        with pytest.raises(leasing.DeviceNotFree, match="job 41"):
            leasing.acquire(ledger, JobContext(43, 5432, "bob", "n1"), [device], settings, wait_s=0.2)
        assert os.lstat(node).st_uid == 0
        count.write_text("0\n")  # the last reference went: gasket_release()
        assert leasing.clear(ledger, settings) == [(PCI, "cleared")]
        leasing.acquire(ledger, JobContext(44, 5432, "bob", "n1"), [device], settings)
        assert os.lstat(node).st_uid == 5432
    with open(os.path.join(settings.state_dir, "audit.log"), encoding="utf-8") as handle:
        records = [(r["event"], r["job_id"], r.get("by_job")) for r in map(json.loads, handle)]
    assert ("survivor", 41, 42) in records and ("clear", 41, None) in records
    assert not any(job in (42, 43) for event, job, _ in records if event in ("acquire", "survivor", "clear"))


@needs_root
def test_a_writer_left_by_a_job_is_kept_in_its_name_and_the_next_job_is_refused_naming_it(card):
    node, count, device, settings = card
    with Ledger(settings.state_dir) as ledger:
        leasing.acquire(ledger, JobContext(51, 4321, "alice", "n1"), [device], settings)
        count.write_text("1\n")  # alice's fd in flight: no process shows it, the driver counts it
        problems = leasing.release(ledger, 51, settings)
        assert len(problems) == 1 and "after job 51" in problems[0] and "1 writable fd(s)" in problems[0]
        with pytest.raises(leasing.DeviceNotFree) as refused:
            leasing.acquire(ledger, JobContext(52, 5432, "bob", "n1"), [device], settings, wait_s=0.2)
        assert "ended job 51" in str(refused.value) and "job 52" not in str(refused.value).split(":", 1)[1]
        assert os.lstat(node).st_uid == 0 and ledger.read(PCI).job_id == 51


@needs_root
def test_no_writers_hands_the_card_over_as_before(card):
    node, count, device, settings = card
    with Ledger(settings.state_dir) as ledger:
        assert ledger.last_holder(PCI) is None
        leasing.acquire(ledger, JobContext(61, 4321, "alice", "n1"), [device], settings)
        assert os.lstat(node).st_uid == 4321
        assert ledger.last_holder(PCI) == (61, 4321)
        assert leasing.release(ledger, 61, settings) == []


@needs_root
def test_a_card_whose_driver_shows_no_count_is_not_handed_over_nor_given_back(card):
    node, count, device, settings = card
    with Ledger(settings.state_dir) as ledger:
        leasing.acquire(ledger, JobContext(71, 4321, "alice", "n1"), [device], settings)
        count.unlink()  # gasket always shows write_open_count: a missing one says nothing is known
        problems = leasing.release(ledger, 71, settings)
        assert len(problems) == 1 and "no write_open_count" in problems[0] and "after job 71" in problems[0]
        assert os.lstat(node).st_uid == 0 and ledger.read(PCI).job_id == 71
        assert leasing.clear(ledger, settings)[0][1] != "cleared"
        count.write_text("0\n")
        assert leasing.clear(ledger, settings) == [(PCI, "cleared")]
        count.write_text("garbled\n")
        with pytest.raises(leasing.DeviceNotFree, match=r"no write_open_count.*last held by job 71"):
            leasing.acquire(ledger, JobContext(72, 5432, "bob", "n1"), [device], settings)
        assert os.lstat(node).st_uid == 0


# ---- on the cluster, with real users, against the emulated apex driver --------------------
# The card's node is a pty whose write_open_count (a FUSE attribute) follows the node's real open
# files, answered when read (harness/localcluster/apex.py): nothing here sets a count by hand.


@pytest.fixture(scope="module")
def cluster():
    yield from one_node_two_tpus()


def count_file(cluster) -> str:
    node = inventory(cluster, "n1")[PCI][0]
    return os.path.join(cluster.node_dir("n1"), "sys", "class", "apex", os.path.basename(node), "write_open_count")


def count(cluster) -> str:
    with open(count_file(cluster), encoding="ascii") as handle:
        return handle.read()


# Alice's process outside Slurm. "keep": accepts the job's connection but never calls recvmsg, so the
# fd the job sends stays in flight in the socket's queue until it is told to drop it (closes the socket,
# exits). "take": receives the fd, closes it, then tells the job.
RECEIVER = r"""
import array, os, socket, sys, time
sock_path, prefix, mode = sys.argv[1:4]
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(sock_path)
server.listen(1)
open(prefix + ".ready", "w").close()
conn, _ = server.accept()
if mode == "take":
    _, ancillary, _, _ = conn.recvmsg(1, socket.CMSG_LEN(4))
    os.close(array.array("i", ancillary[0][2])[0])
    conn.sendall(b"k")
    conn.recv(1)
else:
    while not os.path.exists(prefix + ".drop"):
        time.sleep(0.05)
"""

# Alice's job: SMUGGLE (support.py), "keep" or "take".
SEND = "#!/bin/sh\n" + SMUGGLE + "\n"


def receiver(cluster, tag: str, mode: str):
    prefix = out(cluster, tag)
    process = subprocess.Popen(
        ["/usr/bin/python3", "-I", "-c", RECEIVER, prefix + ".sock", prefix, mode],
        user="stpu_alice",
        group="stpu_alice",
        extra_groups=[],
        cwd="/",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    wait_until(lambda: os.path.exists(prefix + ".ready"), 30, f"the {tag} receiver to listen")
    return process, prefix


def gres_args(tag_out: str) -> list[str]:
    return ["-w", "n1", "--gres=tpu:edgetpu_pci:1", "-o", "/dev/null", "-e", tag_out]


def job_reason(cluster, job: int) -> str:
    from slurm_tpu.slurm.parse import parse_key_values

    shown = cluster.command(["scontrol", "-o", "show", "job", str(job)], check=False).stdout
    return parse_key_values(shown).get("Reason", "")


@pytest.mark.slurm
def test_an_fd_in_flight_after_alices_job_drains_the_node_naming_her_job_and_bobs_job_waits(cluster, users):
    node = inventory(cluster, "n1")[PCI][0]
    assert count(cluster) == "0\n"
    sink, prefix = receiver(cluster, "keep", "keep")
    bobs = None
    try:
        job = cluster.sbatch(
            gres_args(out(cluster, "keep.err")),
            SEND.format(node=node, sock=prefix + ".sock", mode="keep"),
            user="stpu_alice",
        )
        assert cluster.wait_for_jobs([job], timeout=120)[job] == "COMPLETED", open(out(cluster, "keep.err")).read()
        # No process holds the card (alice's job is gone, the receiver never took the fd), yet the file lives.
        assert count(cluster) == "1\n"
        wait_until(lambda: "DRAIN" in cluster.node_states()["n1"], 60, "the epilog to drain n1")
        reason = drain_reason(cluster)
        assert f"after job {job}" in reason and "1 writable fd(s)" in reason and PCI in reason, reason
        assert owner(node) == (0, 0, 0o600)
        rows = {r["identity"]: r for r in leases(cluster, "n1")}
        assert rows[PCI]["job_id"] == job
        marker = out(cluster, "bob-owner")
        bobs = cluster.sbatch(gres_args("/dev/null"), f"#!/bin/sh\nstat -c %u {node} > {marker}\n", user="stpu_bob")
        wait_until(lambda: job_reason(cluster, bobs) not in ("", "None"), 60, "bob's job to be held back")
        assert cluster.job_state(bobs) == "PENDING" and not os.path.exists(marker)
        assert owner(node) == (0, 0, 0o600)
        open(prefix + ".drop", "w").close()  # the receiver closes the socket: the fd in flight goes with it
        sink.wait(timeout=60)
        assert count(cluster) == "0\n"  # no sleep: the attribute is the tty's state when read
        cleared = clear_lease(cluster, PCI)
        assert cleared.returncode == 0 and "cleared" in cleared.stdout, cleared.stderr
        resume(cluster)
        assert cluster.wait_for_jobs([bobs], timeout=120)[bobs] == "COMPLETED"
        assert open(marker).read().strip() == str(users["stpu_bob"])  # the card was bob's during his job
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait()
        if bobs is not None:
            cluster.command(["scancel", str(bobs)], check=False)
    assert leases(cluster, "n1") == [] and owner(node) == (0, 0, 0o600) and count(cluster) == "0\n"
    assert "DRAIN" not in cluster.node_states()["n1"]


@pytest.mark.slurm
def test_an_fd_the_receiver_took_and_closed_before_the_job_ended_leaves_the_node_in_service(cluster, users):
    node = inventory(cluster, "n1")[PCI][0]
    taker, prefix = receiver(cluster, "take", "take")
    try:
        job = cluster.sbatch(
            gres_args(out(cluster, "take.err")),
            SEND.format(node=node, sock=prefix + ".sock", mode="take"),
            user="stpu_alice",
        )
        assert cluster.wait_for_jobs([job], timeout=120)[job] == "COMPLETED", open(out(cluster, "take.err")).read()
        # The epilog's own record of the device going back: it drains before it would write it.
        wait_until(
            lambda: any(
                e["event"] == "release" and e.get("job_id") == job and e.get("identity") == PCI
                for e in audit(cluster, "n1")
            ),
            60,
            "the epilog to release the card",
        )
    finally:
        taker.kill()
        taker.wait()
    assert "DRAIN" not in cluster.node_states()["n1"] and drain_reason(cluster) in ("", "none")
    assert leases(cluster, "n1") == [] and owner(node) == (0, 0, 0o600) and count(cluster) == "0\n"
    assert not any(e["event"] == "survivor" and e.get("job_id") == job for e in audit(cluster, "n1"))


@pytest.mark.slurm
def test_the_prolog_refuses_a_card_with_a_writer_and_the_drain_names_the_job_that_held_it(cluster, users):
    node = inventory(cluster, "n1")[PCI][0]
    gres = gres_args("/dev/null")
    first = cluster.sbatch(gres, "#!/bin/sh\ntrue\n", user="stpu_alice")
    assert cluster.wait_for_jobs([first], timeout=120)[first] == "COMPLETED"
    wait_until(
        lambda: any(e["event"] == "release" and e.get("job_id") == first for e in audit(cluster, "n1")),
        60,
        "the first job's release",
    )
    # A writer no lease knows of: a root process opens the idle card (the driver counts it; no job owns it).
    writer = os.open(node, os.O_RDWR | os.O_NOCTTY)
    second = None
    try:
        assert count(cluster) == "1\n"
        marker = out(cluster, "bob-ran")
        second = cluster.sbatch(gres, f"#!/bin/sh\ntouch {marker}\n", user="stpu_bob")
        wait_until(lambda: "DRAIN" in cluster.node_states()["n1"], 120, "the prolog to drain n1")
        reason = drain_reason(cluster)
        assert f"last held by job {first}" in reason and PCI in reason, reason
        assert owner(node) == (0, 0, 0o600) and not os.path.exists(marker)
        rows = {r["identity"]: r for r in leases(cluster, "n1")}
        assert rows[PCI]["job_id"] == first and rows[PCI]["phase"] == "kept"
        assert any(
            r["event"] == "survivor" and r["job_id"] == first and r.get("by_job") == second
            for r in audit(cluster, "n1")
        )
    finally:
        os.close(writer)
        if second is not None:
            cluster.command(["scancel", str(second)], check=False)
    assert count(cluster) == "0\n"
    cleared = clear_lease(cluster, PCI)
    assert cleared.returncode == 0 and "cleared" in cleared.stdout, cleared.stderr
    resume(cluster)
    assert leases(cluster, "n1") == [] and owner(node) == (0, 0, 0o600)
