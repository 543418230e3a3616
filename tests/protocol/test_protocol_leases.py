"""Lease files (slurm_tpu.protocol.leases): round trip, files older code wrote, forged or broken files."""

from __future__ import annotations

import json
import os
import stat

import pytest

from slurm_tpu.access.ledger import Ledger
from slurm_tpu.hooks import leasing
from slurm_tpu.hooks.settings import HookSettings
from slurm_tpu.protocol import FormatError
from slurm_tpu.protocol.inventory import KnownDevice
from slurm_tpu.protocol.leases import (
    DIR,
    FIELDS,
    FREE,
    HELD,
    KEPT,
    PHASES,
    RELEASING,
    REVOKING,
    UNREADABLE,
    VERSION,
    BadLease,
    Lease,
    check_transition,
)

# Written by slurm-tpu before lease phases existed (commit c6d1bca^, Lease.to_bytes): a node
# upgraded while this job ran must still read it as held, and release it.
BEFORE_PHASES = (
    b"identity\tusb-2-1.3\njob_id\t41\nuid\t4321\nkind\tedgetpu\nuser\talice\nstart\t1763776812.123456\n"
    b"device_nodes\t/dev/bus/usb/002/005\nallocation\tusb-2-1.3,pci-0000:03:00.0\nnode\tn1\nprolog_pid\t2345\n"
    b"prolog_start\t987654\nversion\t1\n"
)

# Written before a lease named the process releasing it (releaser_pid/releaser_start, a compatible
# addition): read as "no releaser", which only a lease in phase releasing consults.
BEFORE_RELEASER = (
    b"identity\tusb-2-1.3\njob_id\t41\nuid\t4321\nkind\tedgetpu\nuser\talice\nstart\t1763776812.123456\n"
    b"device_nodes\t/dev/bus/usb/002/005\nallocation\tusb-2-1.3,pci-0000:03:00.0\nnode\tn1\nprolog_pid\t2345\n"
    b"prolog_start\t987654\nversion\t1\nphase\trevoking\nphase_since\t1763776900.5\n"
)

# What this version writes for a revoking lease (the bytes are the format: a change here is a new version).
CURRENT = BEFORE_RELEASER + b"releaser_pid\t0\nreleaser_start\t0\n"


def sample(**changes) -> Lease:
    fields = dict(
        identity="usb-2-1.3",
        job_id=41,
        uid=4321,
        kind="edgetpu",
        user="alice",
        start=1763776812.123456,
        device_nodes=("/dev/bus/usb/002/005",),
        allocation=("usb-2-1.3", "pci-0000:03:00.0"),
        node="n1",
        prolog_pid=2345,
        prolog_start=987654,
        phase=REVOKING,
        phase_since=1763776900.5,
    )
    fields.update(changes)
    return Lease(**fields)


def test_round_trip_and_the_exact_bytes():
    lease = sample()
    assert lease.encode() == CURRENT
    assert Lease.decode("usb-2-1.3", CURRENT) == lease
    nobody = Lease(identity="pci-0000:03:00.0", job_id=-1, uid=-1)  # what an unreadable lease is replaced by
    assert Lease.decode(nobody.identity, nobody.encode()) == nobody
    assert [line.split("\t")[0] for line in CURRENT.decode().splitlines()] == list(FIELDS)


def test_a_lease_written_before_phases_existed_reads_as_held():
    lease = Lease.decode("usb-2-1.3", BEFORE_PHASES)
    assert (lease.job_id, lease.uid, lease.phase, lease.phase_since) == (41, 4321, HELD, 0.0)
    assert lease.allocation == ("usb-2-1.3", "pci-0000:03:00.0") and lease.version == 1
    # Rewritten (a phase change), it becomes a current-format lease.
    lease.phase = KEPT
    assert Lease.decode("usb-2-1.3", lease.encode()).phase == KEPT


def test_a_lease_written_before_releasers_existed_reads_the_same():
    assert Lease.decode("usb-2-1.3", BEFORE_RELEASER) == sample()


def test_a_releasing_lease_names_its_releaser():
    releasing = sample(phase="releasing", releaser_pid=777, releaser_start=123456)
    raw = releasing.encode()
    assert raw.endswith(b"phase\treleasing\nphase_since\t1763776900.5\nreleaser_pid\t777\nreleaser_start\t123456\n")
    assert Lease.decode("usb-2-1.3", raw) == releasing


def test_fields_of_a_compatible_later_addition_are_ignored():
    assert Lease.decode("usb-2-1.3", CURRENT + b"holder_hint\tsomething new\n") == sample()


@pytest.mark.parametrize(
    "raw, why",
    [
        (
            CURRENT.replace(b"identity\tusb-2-1.3", b"identity\tusb-2-1.4"),
            "names device 'usb-2-1.4', not its file name",
        ),
        (CURRENT.replace(b"job_id\t41\n", b""), "field 'job_id' is missing"),
        (CURRENT.replace(b"job_id\t41", b"job_id\t4_1"), "field 'job_id' is not an integer: '4_1'"),
        (CURRENT.replace(b"job_id\t41", b"job_id\t 41"), "field 'job_id' is not an integer"),
        (CURRENT.replace(b"uid\t4321", "uid\t٤٣".encode()), "field 'uid' is not an integer"),  # Arabic-Indic digits
        (CURRENT.replace(b"uid\t4321", b"uid\t" + b"9" * 4000), "field 'uid' is not an integer"),
        (CURRENT.replace(b"start\t1763776812.123456", b"start\tnan"), "field 'start' is not a finite number: 'nan'"),
        (CURRENT.replace(b"phase_since\t1763776900.5", b"phase_since\tinf"), "field 'phase_since' is not a finite"),
        (CURRENT.replace(b"phase\trevoking", b"phase\tstolen"), "unknown phase 'stolen'"),
        (CURRENT.replace(b"version\t1", b"version\t2"), "format version 2; this slurm-tpu reads up to 1"),
        (CURRENT + b"uid\t0\n", "line 17: field 'uid' given twice"),
        (CURRENT + b"no tab here\n", "line 17: no tab in 'no tab here'"),
        (b"\xff\xfe" + CURRENT, "is not UTF-8 text"),
        (json.dumps({"identity": "usb-2-1.3", "job_id": 41, "uid": 4321}).encode(), "no tab in"),
    ],
)
def test_bad_or_forged_files_are_refused_with_one_line_naming_the_file(raw, why):
    with pytest.raises(FormatError) as refused:
        Lease.decode("usb-2-1.3", raw)
    message = str(refused.value)
    assert message.startswith(f"lease file {DIR}/usb-2-1.3") and why in message
    assert "\n" not in message and refused.value.source == f"{DIR}/usb-2-1.3"


def test_the_writer_refuses_values_that_would_change_the_lines():
    for bad in (dict(user="eve\njob_id\t1"), dict(node="n\t1"), dict(device_nodes=("/dev/a,/dev/b",))):
        with pytest.raises(ValueError):
            sample(**bad).encode()
    assert sample(version=7).encode() == CURRENT  # always the current version


def test_the_ledger_reads_a_bad_file_as_a_reclaimable_bad_lease_with_the_reason(tmp_path):
    os.chmod(tmp_path, 0o755)
    with Ledger(str(tmp_path / "state")) as ledger:
        with open(os.path.join(ledger.state_dir, DIR, "usb-2-1.3"), "wb") as handle:
            handle.write(CURRENT.replace(b"version\t1", b"version\t9"))
        bad = ledger.read("usb-2-1.3")
    assert isinstance(bad, BadLease) and "format version 9" in bad.reason and bad.job_id == -1
    assert VERSION == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod/chown need root")
def test_a_lease_the_old_code_wrote_mid_job_is_released_by_this_epilog(tmp_path):
    """Upgraded mid-job: the epilog ends a lease file in the pre-phase format and gives the device back."""
    os.chmod(tmp_path, 0o755)
    state = str(tmp_path / "state")
    node = tmp_path / "bus-002-005"
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(240, 211))
    os.chown(node, 4321, -1)  # the job's, as the old prolog left it
    device = KnownDevice("usb-2-1.3", "edgetpu", "usb", (str(node),))
    settings = HookSettings(state, devices={device.identity: device})
    with Ledger(state) as ledger:
        with open(os.path.join(state, DIR, "usb-2-1.3"), "wb") as handle:
            handle.write(BEFORE_PHASES.replace(b"/dev/bus/usb/002/005", str(node).encode()))
        assert leasing.release(ledger, 41, settings, wait_s=0.2) == []
        assert ledger.names() == []
    assert (os.stat(node).st_uid, stat.S_IMODE(os.stat(node).st_mode)) == (settings.idle_uid, settings.idle_mode)
    with open(os.path.join(state, "audit.log"), encoding="utf-8") as handle:
        events = [json.loads(line) for line in handle]
    assert [(e["event"], e["identity"], e["job_id"], e["uid"]) for e in events] == [("release", "usb-2-1.3", 41, 4321)]


# Every phase change the hooks make (slurm_tpu/hooks/leasing.py, udev_event.py), by who makes it.
ALLOWED = {
    (FREE, HELD),  # a prolog's claim
    (HELD, RELEASING),  # a release scans for holders (a device that cannot be revoked)
    (HELD, REVOKING),  # a release power-cycles a USB stick
    (HELD, KEPT),  # the device could not be taken away; the writers check keeps it for an earlier job
    (HELD, FREE),  # a prolog's roll-back; a release of a vanished device
    (RELEASING, KEPT),  # the scan found a holder, or could not read every open file
    (RELEASING, FREE),  # the scan found none: idle ownership back, the lease goes
    (REVOKING, KEPT),  # the power-cycle failed
    (REVOKING, FREE),  # udev_event: the stick is back
    # Ending a lease again: a kept one cleared or reclaimed, a release or revocation whose hook
    # died (or that took too long), an unreadable file; each may end as any lease ends.
    (KEPT, RELEASING),
    (KEPT, REVOKING),
    (KEPT, KEPT),
    (KEPT, FREE),
    (RELEASING, RELEASING),
    (RELEASING, REVOKING),
    (REVOKING, RELEASING),
    (REVOKING, REVOKING),
    (UNREADABLE, RELEASING),
    (UNREADABLE, REVOKING),
    (UNREADABLE, KEPT),
    (UNREADABLE, FREE),
}


def test_the_phase_table_allows_every_change_the_hooks_make():
    for old, new in sorted(ALLOWED):
        check_transition(old, new)


@pytest.mark.parametrize(
    "old, new",
    [
        (KEPT, HELD),  # nothing makes a lease held again but a new claim
        (RELEASING, HELD),
        (REVOKING, HELD),
        (UNREADABLE, HELD),
        (HELD, HELD),
        (FREE, KEPT),  # a lease is born held, by its claim
        (FREE, RELEASING),
        (FREE, FREE),  # nothing to free
        (HELD, UNREADABLE),  # never written
        ("bogus", FREE),
    ],
)
def test_the_phase_table_refuses_the_rest(old, new):
    with pytest.raises(ValueError, match="may not become"):
        check_transition(old, new)


def test_the_phase_table_is_exactly_what_the_hooks_do():
    every = (FREE, UNREADABLE, *PHASES)
    for old in every:
        for new in every:
            if (old, new) in ALLOWED:
                check_transition(old, new)
            else:
                with pytest.raises(ValueError):
                    check_transition(old, new)
