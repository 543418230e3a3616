"""The lease ledger and device ownership on real files (mknod'd nodes, real processes)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import pytest

from slurm_tpu.access import ownership, statedir
from slurm_tpu.access.ledger import BadLease, Lease, Ledger
from slurm_tpu.errors import DeviceError
from slurm_tpu.hooks import leasing
from slurm_tpu.hooks.context import JobContext
from slurm_tpu.hooks.settings import HookSettings
from slurm_tpu.protocol.inventory import KnownDevice
from slurm_tpu.protocol.leases import FREE, HELD, KEPT, REVOKING

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod/chown need root")


@pytest.fixture
def state(tmp_path):
    os.chmod(tmp_path, 0o755)
    return str(tmp_path / "state")


def lease(identity="usb-2-1.3", job=1, uid=1000):
    return Lease(identity=identity, job_id=job, uid=uid, allocation=(identity,), start=1.0)


def test_claim_is_exclusive_and_complete(state):
    with Ledger(state) as ledger:
        assert ledger.claim(lease(job=1))
        assert not ledger.claim(lease(job=2))
        held = ledger.read("usb-2-1.3")
        assert isinstance(held, Lease) and held.job_id == 1
        assert ledger.names() == ["usb-2-1.3"]  # no temp file left behind
        assert ledger.drop("usb-2-1.3") and not ledger.drop("usb-2-1.3")
        assert ledger.read("usb-2-1.3") is None


def _taken_elsewhere(state) -> bool:
    """Whether another open file (as another process's hook would) finds the state lock taken."""
    import fcntl

    fd = os.open(os.path.join(state, ".lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # lets go of it when this took it
    return False


def test_the_state_lock_is_let_go_after_an_exception_and_taken_back_after_unlocked(state):
    with Ledger(state) as ledger:
        with pytest.raises(RuntimeError), ledger.locked():
            assert ledger.held and _taken_elsewhere(state)
            raise RuntimeError("a hook failed while it held the lock")
        assert not ledger.held and not _taken_elsewhere(state)
        with ledger.locked():
            with ledger.locked():  # nested (the epilog holds it, release takes it again): one lock
                with ledger.unlocked():  # a release's holder scan: let go however deep it is held
                    assert not ledger.held and not _taken_elsewhere(state)
                assert ledger.held and _taken_elsewhere(state)
                with pytest.raises(RuntimeError), ledger.unlocked():
                    raise RuntimeError("the scan failed")
                assert ledger.held and _taken_elsewhere(state)  # taken back after an exception too
            assert ledger.held and _taken_elsewhere(state)  # the inner block leaves the outer's lock
        assert not ledger.held and not _taken_elsewhere(state)
        with ledger.locked(when=False):
            assert not ledger.held and not _taken_elsewhere(state)
        with pytest.raises(AssertionError):
            ledger.unlocked()  # nothing to let go of


def test_a_lease_phase_changes_only_under_the_lock_and_as_the_table_allows(state):
    with Ledger(state) as ledger:
        assert ledger.claim(lease(job=1))
        held = ledger.read("usb-2-1.3")
        with pytest.raises(AssertionError):
            leasing._move(ledger, held, KEPT)  # without the lock
        with ledger.locked():
            kept = leasing._move(ledger, held, KEPT)
            with pytest.raises(ValueError, match="'kept' may not become 'held'"):
                leasing._move(ledger, kept, HELD)
            assert ledger.read("usb-2-1.3") == kept and kept.phase == KEPT
            leasing._move(ledger, BadLease("usb-2-1.3", "garbled"), FREE)
        assert ledger.read("usb-2-1.3") is None


def test_an_unreadable_lease_revoked_keeps_the_nodes_it_is_revoked_on(state):
    """end_lease names the nodes a power-cycled stick had, so udev_event tells the old device's events from
    the new one's: an unreadable lease, replaced by nobody's (job -1), must keep them too."""
    with Ledger(state) as ledger, ledger.locked():
        unreadable = BadLease("usb-2-1.3", "garbled")
        unreadable.device_nodes = ("/dev/bus/usb/002/005",)
        revoking = leasing._move(ledger, unreadable, REVOKING)
        assert (revoking.job_id, revoking.device_nodes) == (-1, ("/dev/bus/usb/002/005",))
        assert ledger.read("usb-2-1.3") == revoking


def test_racing_processes_never_share_a_lease(state):
    """Eight real processes race for one device 30 times: exactly one wins each round."""
    Ledger(state).close()
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from slurm_tpu.access.ledger import Lease, Ledger\n"
        "wins = 0\n"
        "with Ledger(sys.argv[2]) as l:\n"
        "    for r in range(30):\n"
        "        wins += l.claim(Lease(identity=f'usb-1-{r}', job_id=int(sys.argv[3]), uid=0))\n"
        "print(wins)\n"
    )
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs = [
        subprocess.Popen([sys.executable, "-c", script, repo, state, str(job)], stdout=subprocess.PIPE, text=True)
        for job in range(1, 9)
    ]
    wins = sum(int(p.communicate()[0]) for p in procs)
    assert wins == 30
    with Ledger(state) as ledger:
        assert len(ledger.names()) == 30


def test_symlinked_state_dir_is_refused(tmp_path):
    os.chmod(tmp_path, 0o755)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "state").symlink_to(target)
    with pytest.raises(statedir.StateDirError, match="symlink"):
        Ledger(str(tmp_path / "state"))
    assert list(target.iterdir()) == []


def test_planted_symlinks_inside_the_state_dir_are_not_followed(state, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    with Ledger(state) as ledger:
        os.symlink(victim, os.path.join(state, "audit.log"))
        os.symlink(victim, os.path.join(state, "leases", "usb-2-1.3"))
        assert not ledger.claim(lease())  # the link occupies the name; it is not written through
        assert isinstance(ledger.read("usb-2-1.3"), BadLease)
        ledger.audit("acquire", identity="usb-2-1.3")  # silently skipped, never written through
        with pytest.raises(statedir.StateDirError):
            statedir.write_atomic(ledger.dir_fd, "inventory.json/..", b"x")
    assert victim.read_text() == "precious\n"


def test_world_writable_state_dir_is_refused(state):
    os.makedirs(state, mode=0o755)
    os.chmod(state, 0o777)
    with pytest.raises(statedir.StateDirError, match="writable"):
        Ledger(state)


@needs_root
def test_set_owner_changes_only_char_devices(tmp_path):
    node = tmp_path / "apex_0"
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(240, 200))
    assert ownership.set_owner(str(node), "pci-x", 1234, -1, 0o600)
    info = os.lstat(node)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (1234, 0o600)
    assert not ownership.set_owner(str(node), "pci-x", 1234, -1, 0o600)  # already right
    plain = tmp_path / "shadow"
    plain.write_text("secret")
    link = tmp_path / "link"
    link.symlink_to(node)
    for bad in (plain, link, tmp_path / "missing"):
        with pytest.raises(DeviceError):
            ownership.set_owner(str(bad), "pci-x", 1234, -1, 0o666)
    assert os.lstat(plain).st_uid == 0 and stat.S_IMODE(os.lstat(plain).st_mode) != 0o666
    assert os.stat(node).st_uid == 1234  # the link's target was not touched through the link


@needs_root
def test_acquire_release_roundtrip_and_idempotent_release(state, tmp_path):
    node = tmp_path / "bus-002-005"
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(240, 201))
    device = KnownDevice("usb-2-1.3", "edgetpu", "usb", (str(node),))
    settings = HookSettings(state, devices={device.identity: device})
    job = JobContext(job_id=41, uid=4321, user="alice", node="n1")
    with Ledger(state) as ledger:
        taken = leasing.acquire(ledger, job, [device], settings)
        assert [t.identity for t in taken] == ["usb-2-1.3"]
        assert os.stat(node).st_uid == 4321
        # Another job is refused while job 41's prolog (this process) is alive.
        other = JobContext(job_id=42, uid=555, user="bob", node="n1")
        with pytest.raises(leasing.HookError, match="held by live job 41"):
            leasing.acquire(ledger, other, [device], settings, wait_s=0.3)
        assert os.stat(node).st_uid == 4321
        assert leasing.release(ledger, 41, settings) == []
        assert os.stat(node).st_uid == 0 and ledger.names() == []
        assert leasing.release(ledger, 41, settings) == []  # second epilog: no-op
    events = [json.loads(line)["event"] for line in open(os.path.join(state, "audit.log"))]
    assert events == ["acquire", "release"]


def _process(pid: int) -> tuple[int, int]:
    from slurm_tpu.access.processes import process_start_time

    return pid, process_start_time(pid)


def _pci_card(state: str, tmp_path, minor: int) -> tuple[str, KnownDevice, HookSettings]:
    """A PCIe Edge TPU's node (root 0600) and the settings that know it."""
    node = tmp_path / "apex_0"
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(240, minor))
    device = KnownDevice("pci-0000:03:00.0", "edgetpu", "pci", (str(node),))
    return str(node), device, HookSettings(state, devices={device.identity: device})


@needs_root
def test_a_lease_names_the_prolog_process_it_is_given_and_lives_as_long(state, tmp_path):
    # The node agent's worker outlives the prolog it serves: it gives its hook client (here: a sleep).
    node, device, settings = _pci_card(state, tmp_path, 203)
    client = subprocess.Popen(["sleep", "60"])
    try:
        with Ledger(state) as ledger:
            leasing.acquire(
                ledger, JobContext(41, 4321, "alice", "n1"), [device], settings, prolog_process=_process(client.pid)
            )
            held = ledger.read(device.identity)
            assert isinstance(held, Lease) and held.prolog_pid == client.pid
            with pytest.raises(leasing.HookError, match="held by live job 41"):
                leasing.acquire(ledger, JobContext(42, 555, "bob", "n1"), [device], settings, wait_s=0.3)
            client.kill()
            client.wait()
            # The prolog process is gone (and job 41 has no slurmstepd): its lease is stale, reclaimed.
            leasing.acquire(ledger, JobContext(42, 555, "bob", "n1"), [device], settings, wait_s=0.3)
            assert ledger.read(device.identity).job_id == 42
        assert os.stat(node).st_uid == 555
    finally:
        client.kill()
        client.wait()


@needs_root
def test_a_prolog_whose_process_is_gone_leases_nothing(state, tmp_path):
    node, device, settings = _pci_card(state, tmp_path, 204)
    gone = subprocess.Popen(["true"])
    gone.wait()
    with Ledger(state) as ledger:
        with pytest.raises(leasing.HookError, match=r"prolog process \(pid \d+\) is gone"):
            leasing.acquire(
                ledger, JobContext(43, 4321, "alice", "n1"), [device], settings, prolog_process=_process(gone.pid)
            )
        assert ledger.names() == []
    assert os.stat(node).st_uid == 0


@needs_root
def test_a_roll_back_leaves_a_lease_another_prolog_took_over(state, tmp_path):
    # Job 41's prolog process died mid-prolog; job 42's prolog reclaimed the device. Job 41's worker
    # rolling back afterwards must not take the device from job 42.
    node, device, settings = _pci_card(state, tmp_path, 205)
    client = subprocess.Popen(["sleep", "60"])
    job41 = JobContext(41, 4321, "alice", "n1")
    with Ledger(state) as ledger:
        taken = leasing.acquire(ledger, job41, [device], settings, prolog_process=_process(client.pid))
        client.kill()
        client.wait()
        leasing.acquire(ledger, JobContext(42, 555, "bob", "n1"), [device], settings, wait_s=0.3)
        leasing.roll_back(ledger, taken, settings)
        held = ledger.read(device.identity)
        assert isinstance(held, Lease) and held.job_id == 42
    assert os.stat(node).st_uid == 555
    events = [(e["event"], e["job_id"]) for e in map(json.loads, open(os.path.join(state, "audit.log")))]
    assert ("rollback", 41) not in events


@needs_root
def test_a_prolog_for_a_card_being_released_waits_for_the_release_and_keeps_what_it_gets(state, tmp_path):
    """A PCIe card cannot be revoked: its epilog scans for the job's processes that still hold it,
    and waits for them, without the node's state lock (the other devices' hooks go on meanwhile;
    the lease says ``releasing``). Job 42's prolog for that card waits for the release to end,
    however long that takes, instead of reclaiming the lease under it; and the release, once it
    ends, never touches job 42's lease (it used to: give the card back to root, drop the lease)."""
    import threading

    node, device, settings = _pci_card(state, tmp_path, 206)
    os.unlink(node)
    os.mknod(node, stat.S_IFCHR | 0o600, os.stat("/dev/full").st_rdev)  # openable: a process can hold it
    prolog41 = subprocess.Popen(["sleep", "60"])
    with Ledger(state) as ledger:
        leasing.acquire(
            ledger, JobContext(41, 4321, "alice", "n1"), [device], settings, prolog_process=_process(prolog41.pid)
        )
    prolog41.kill()
    prolog41.wait()  # job 41 is over: its prolog is gone and it has no slurmstepd
    # A process of job 41 (its user's: the scan leaves root's alone) still exiting, the card open.
    survivor = subprocess.Popen(["sleep", "60"], stdin=open(node, "rb"), user=4321, group=4321)
    outcome: dict = {}

    def epilog41() -> None:
        with Ledger(state) as ledger:
            outcome[41] = leasing.release(ledger, 41, settings, wait_s=60)

    def prolog42() -> None:
        with Ledger(state) as ledger:
            try:
                outcome[42] = leasing.acquire(ledger, JobContext(42, 555, "bob", "n1"), [device], settings, wait_s=0.3)
            except leasing.HookError as exc:
                outcome[42] = exc

    hooks = [threading.Thread(target=epilog41)]
    try:
        hooks[0].start()
        with Ledger(state) as ledger:
            deadline = time.monotonic() + 60
            while getattr(ledger.read(device.identity), "phase", None) != "releasing":
                assert time.monotonic() < deadline and hooks[0].is_alive(), f"no release began: {outcome}"
                time.sleep(0.01)
            held = ledger.read(device.identity)
            assert held.job_id == 41 and held.releaser_pid == os.getpid()
            assert os.stat(node).st_uid == 0  # taken away before the scan
            # The release holds no lock while it waits for the survivor.
            with ledger.locked():
                pass
        hooks.append(threading.Thread(target=prolog42))
        hooks[1].start()
    finally:
        survivor.kill()
        survivor.wait()
        for hook in hooks:
            hook.join(60)
    assert not any(hook.is_alive() for hook in hooks)
    assert outcome[41] == [], outcome
    assert [lease.job_id for lease in outcome[42]] == [42], outcome
    with Ledger(state) as ledger:
        held = ledger.read(device.identity)
        assert isinstance(held, Lease) and (held.job_id, held.phase) == (42, "held")
    assert os.stat(node).st_uid == 555
    events = [(e["event"], e["job_id"]) for e in map(json.loads, open(os.path.join(state, "audit.log")))]
    assert events == [("acquire", 41), ("release", 41), ("acquire", 42)]


@needs_root
def test_a_release_never_ends_a_lease_a_new_job_took_while_it_scanned(state, tmp_path):
    """Job 41 held two cards. Its epilog scans the first without the state lock (a process of the job
    still has it open); meanwhile job 42's prolog reclaims the second, whose lease the epilog had
    listed, and is given it. The epilog, once at the second, must leave job 42's lease alone."""
    import threading

    first, second = tmp_path / "apex_0", tmp_path / "apex_1"
    os.mknod(first, stat.S_IFCHR | 0o600, os.stat("/dev/full").st_rdev)
    os.mknod(second, stat.S_IFCHR | 0o600, os.makedev(240, 208))
    cards = [
        KnownDevice("pci-0000:03:00.0", "edgetpu", "pci", (str(first),)),
        KnownDevice("pci-0000:04:00.0", "edgetpu", "pci", (str(second),)),
    ]
    settings = HookSettings(state, devices={card.identity: card for card in cards})
    prolog41 = subprocess.Popen(["sleep", "60"])
    with Ledger(state) as ledger:
        leasing.acquire(
            ledger, JobContext(41, 4321, "alice", "n1"), cards, settings, prolog_process=_process(prolog41.pid)
        )
    prolog41.kill()
    prolog41.wait()
    survivor = subprocess.Popen(["sleep", "60"], stdin=open(first, "rb"), user=4321, group=4321)
    outcome: dict = {}

    def epilog41() -> None:
        with Ledger(state) as ledger:
            outcome[41] = leasing.release(ledger, 41, settings, wait_s=60)

    epilog = threading.Thread(target=epilog41)
    try:
        epilog.start()
        with Ledger(state) as ledger:
            deadline = time.monotonic() + 60
            while getattr(ledger.read(cards[0].identity), "phase", None) != "releasing":
                assert time.monotonic() < deadline and epilog.is_alive(), f"no release began: {outcome}"
                time.sleep(0.01)
            # Job 41 is over (no prolog, no slurmstepd): job 42's prolog reclaims the second card.
            leasing.acquire(ledger, JobContext(42, 555, "bob", "n1"), [cards[1]], settings, wait_s=0.3)
    finally:
        survivor.kill()
        survivor.wait()
        epilog.join(60)
    assert not epilog.is_alive() and outcome[41] == [], outcome
    with Ledger(state) as ledger:
        assert ledger.read(cards[0].identity) is None
        held = ledger.read(cards[1].identity)
        assert isinstance(held, Lease) and (held.job_id, held.phase) == (42, "held")
    assert (os.stat(first).st_uid, os.stat(second).st_uid) == (0, 555)
    events = [(e["event"], e["job_id"], e["identity"]) for e in map(json.loads, open(os.path.join(state, "audit.log")))]
    assert events == [
        ("acquire", 41, cards[0].identity),
        ("acquire", 41, cards[1].identity),
        ("reclaim", 41, cards[1].identity),
        ("acquire", 42, cards[1].identity),
        ("release", 41, cards[0].identity),
    ]


@needs_root
def test_a_release_whose_hook_died_is_done_again_by_the_next_prolog(state, tmp_path):
    node, device, settings = _pci_card(state, tmp_path, 207)
    os.chown(node, 777, -1)  # as a release cut short might leave it: still the old job's user's
    with Ledger(state) as ledger:
        # The releasing hook's process (pid 1 never matches start time 5) is gone, as is job 999999.
        cut_short = Lease(
            identity=device.identity,
            job_id=999999,
            uid=777,
            prolog_pid=1,
            prolog_start=5,
            phase="releasing",
            phase_since=1.0,
            releaser_pid=1,
            releaser_start=5,
        )
        assert ledger.claim(cut_short)
        assert leasing.holder_alive(ledger.read(device.identity)) is None
        leasing.acquire(ledger, JobContext(7, 4321, "alice", "n1"), [device], settings, wait_s=0.2)
        held = ledger.read(device.identity)
        assert isinstance(held, Lease) and (held.job_id, held.phase) == (7, "held")
    assert os.stat(node).st_uid == 4321
    events = [(e["event"], e["job_id"]) for e in map(json.loads, open(os.path.join(state, "audit.log")))]
    assert events == [("reclaim", 999999), ("acquire", 7)]


@needs_root
def test_stale_lease_of_a_dead_job_is_reclaimed(state, tmp_path):
    node = tmp_path / "apex_0"
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(240, 202))
    os.chown(node, 777, -1)
    device = KnownDevice("pci-0000:03:00.0", "edgetpu", "pci", (str(node),))
    settings = HookSettings(state, devices={device.identity: device})
    with Ledger(state) as ledger:
        # A lease written by a prolog (pid 1 never matches its recorded start time) of a job with no slurmstepd.
        assert ledger.claim(Lease(identity=device.identity, job_id=999999, uid=777, prolog_pid=1, prolog_start=5))
        leasing.acquire(ledger, JobContext(7, 4321, "alice", "n1"), [device], settings, wait_s=0.2)
        held = ledger.read(device.identity)
        assert isinstance(held, Lease) and held.job_id == 7
    assert os.stat(node).st_uid == 4321
    events = [json.loads(line) for line in open(os.path.join(state, "audit.log"))]
    assert [(e["event"], e["job_id"]) for e in events] == [("reclaim", 999999), ("acquire", 7)]


@needs_root
def test_epilog_keeps_the_lease_while_a_process_holds_the_device(state, tmp_path):
    node = tmp_path / "null-like"
    os.mknod(node, stat.S_IFCHR | 0o600, os.stat("/dev/full").st_rdev)  # openable, rarely held
    # A PCIe TPU: it cannot be revoked (see access/revoke.py), so a holder keeps the lease.
    device = KnownDevice("pci-0000:09:00.0", "edgetpu", "pci", (str(node),))
    settings = HookSettings(state, devices={device.identity: device})
    with Ledger(state) as ledger:
        leasing.acquire(ledger, JobContext(8, 0, "root", "n1"), [device], settings)
        holder = subprocess.Popen(["sleep", "30"], stdin=open(node, "rb"))
        try:
            problems = leasing.release(ledger, 8, settings, wait_s=0.3)
            assert problems and str(holder.pid) in problems[0]
            assert ledger.names() == [device.identity]
            assert ledger.read(device.identity).phase == "kept"
            assert os.stat(node).st_uid == 0  # taken away even though it is kept
        finally:
            holder.kill()
            holder.wait()
        assert leasing.release(ledger, 8, settings) == []
        assert ledger.names() == []


@needs_root
def test_a_survivors_reason_names_its_uid_and_the_earlier_job_it_came_from(state):
    """A holder found after job 9 (uid 1000) that runs as another uid got its fd elsewhere: the reason names
    that uid's last job on the device (the one that leaked it), not only the job that just ended."""
    identity = "pci-0000:03:00.0"
    other = subprocess.Popen(["sleep", "600"], user=65534)
    mine = subprocess.Popen(["sleep", "600"])  # root's: the ended job's uid below is 0
    try:
        with Ledger(state) as ledger:
            ledger.audit("acquire", identity=identity, job_id=7, uid=65534, nodes=["/dev/apex_0"])
            ledger.audit("acquire", identity=identity, job_id=9, uid=0, nodes=["/dev/apex_0"])
            ended = lease(identity, job=9, uid=0)
            assert leasing._owners(ledger, ended, {other.pid: "fd"}) == "uid 65534, whose job 7 held it before"
            assert leasing._owners(ledger, ended, {mine.pid: "fd"}) == "uid 0"
            no_such_pid = 2**22 + 1  # above the largest pid_max (PID_MAX_LIMIT): never a process
            assert leasing._owners(ledger, ended, {no_such_pid: "mmap"}) == "a holder that exited since"
    finally:
        for process in (other, mine):
            process.kill()
            process.wait()


@needs_root
def test_a_node_with_a_leased_devices_numbers_that_the_suite_does_not_manage_is_found(tmp_path):
    """An admin's copy of a device node (same numbers, its own owner and mode) would let anyone it allows
    open the device whichever job holds it: doctor names it. The managed nodes and other devices are not."""
    root = tmp_path / "dev"
    (root / "bus" / "usb" / "002").mkdir(parents=True)
    managed = str(root / "apex_0")
    copy = str(root / "bus" / "usb" / "002" / "copy")
    other = str(root / "null-like")
    os.mknod(managed, stat.S_IFCHR | 0o600, os.makedev(240, 31))
    os.mknod(copy, stat.S_IFCHR | 0o666, os.makedev(240, 31))
    os.mknod(other, stat.S_IFCHR | 0o666, os.makedev(240, 32))
    os.chmod(copy, 0o666)  # mknod's mode passes through the umask
    os.symlink(managed, str(root / "link"))  # a symlink to a node is not a node
    from slurm_tpu.ops.doctor import unmanaged_nodes

    found = unmanaged_nodes({os.makedev(240, 31): "pci-0000:03:00.0"}, {managed}, str(root))
    assert [(state.path, state.mode) for state in found] == [(copy, 0o666)]
