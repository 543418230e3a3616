"""Faults and hostile input against a real cluster: each case must end consistent.

Consistent means: no device leased twice, none leaked (every node back to
root:root 0600 with no lease once its jobs are gone), nothing outside the
accelerator device nodes changed. One cluster for the module: n1 with a USB
and a PCIe Edge TPU. Its Prolog is a test wrapper around the real prolog that,
when told to by a marker file, SIGKILLs the prolog half-way through.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess

import pytest
from support import (
    HARDWARE,
    REPO,
    SURVIVOR_JOB,
    assert_idle_and_consistent as _assert_idle_and_consistent,
    audit,
    clear_lease,
    clear_lease_when_free,
    drain_reason,
    finish_cluster,
    holder_pids,
    hook_env,
    inventory,
    kept_in_service,
    leases,
    make_cluster,
    node_on,
    open_as,
    owner,
    require_root_and_slurm,
    restore_node,
    resume,
    run_hook,
    udev_event,
    wait_until,
)

pytestmark = pytest.mark.slurm

USB, PCI = "usb-2-1.3", "pci-0000:03:00.0"
USB_DEVPATH = "/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1.3"

KILLER = """#!/bin/sh
# Test-only Prolog: normally the real prolog; with {marker} present, start it, wait
# until it has leased a device for this job, then SIGKILL its process group.
real={real}
if [ -e {marker} ]; then
    rm -f {marker}
    setsid "$real" & pid=$!  # own process group: killed whole, as slurmd kills a prolog
    leases="$(dirname "$SLURM_TPU_CONFIG")/state/leases"
    i=0
    while [ $i -lt 500 ]; do
        if grep -qs "^job_id	$SLURM_JOB_ID\\$" "$leases"/*; then break; fi
        sleep 0.01; i=$((i+1))
    done
    kill -KILL -$pid
    wait $pid
    exit 137
fi
exec "$real"
"""


@pytest.fixture(scope="module")
def cluster():
    require_root_and_slurm()
    import tempfile

    from harness.localcluster.cluster import Hooks, NodeSpec

    scratch = tempfile.mkdtemp(prefix="slurm-tpu-killer-", dir="/tmp")
    os.chmod(scratch, 0o755)
    marker = os.path.join(scratch, "kill-next-prolog")
    killer = os.path.join(scratch, "prolog")
    with open(killer, "w", encoding="utf-8") as handle:
        handle.write(KILLER.format(real=os.path.join(REPO, "prolog", "slurm-tpu-prolog"), marker=marker))
    os.chmod(killer, 0o755)
    hooks = Hooks(
        prolog=killer,
        epilog=os.path.join(REPO, "epilog", "slurm-tpu-epilog"),
        task_prolog=os.path.join(REPO, "prolog", "slurm-tpu-task-prolog"),
    )
    started = make_cluster([NodeSpec("n1", os.path.join(HARDWARE, "n1_two_tpus.umockdev"))], hooks=hooks)
    started.kill_marker = marker
    yield started
    finish_cluster(started)
    subprocess.run(["rm", "-rf", scratch])


@pytest.fixture(autouse=True)
def n1_in_service_after(cluster):
    """One failing test must not leave n1 drained: the next ones' jobs would stay PENDING."""
    with kept_in_service(cluster):
        yield


def outp(cluster, name):
    return os.path.join(cluster.base, "out", name)


HOLD = (
    '#!/bin/sh\necho "$SLURM_TPU_DEVICES" > {o}/{t}.devices\ntouch {o}/{t}.started\n'
    "i=0; while [ ! -e {o}/{t}.stop ] && [ $i -lt 3000 ]; do sleep 0.1; i=$((i+1)); done\n"
)


def hold(cluster, user, tag, args, name=None):
    extra = ["-J", name] if name else []
    job = cluster.sbatch(
        [*args, *extra, "-o", "/dev/null", "-e", "/dev/null"],
        HOLD.format(o=os.path.join(cluster.base, "out"), t=tag),
        user=user,
    )
    wait_until(lambda: os.path.exists(outp(cluster, f"{tag}.started")), 180, f"job {job} to start")
    return job


def stop(cluster, tag, job):
    open(outp(cluster, f"{tag}.stop"), "w").close()
    return cluster.wait_for_jobs([job], timeout=180)[job]


def assert_idle_and_consistent(cluster):
    _assert_idle_and_consistent(cluster, node_idle=False)


def test_prolog_killed_half_way_is_reclaimed_by_the_next_job(cluster, users):
    alice = users["stpu_alice"]
    # A live "holder" of the PCIe TPU (a real process standing in for another job's
    # running prolog) makes the prolog wait after it has leased the USB stick.
    from slurm_tpu.access.ledger import Lease, Ledger
    from slurm_tpu.access.processes import process_start_time

    sleeper = subprocess.Popen(["sleep", "60"])
    state = os.path.join(cluster.node_dir("n1"), "state")
    with Ledger(state) as ledger:
        assert ledger.claim(
            Lease(
                identity=PCI,
                job_id=4242,
                uid=users["stpu_bob"],
                prolog_pid=sleeper.pid,
                prolog_start=process_start_time(sleeper.pid),
            )
        )
    open(cluster.kill_marker, "w").close()
    job = cluster.sbatch(["-w", "n1", "--gres=tpu:2", "-o", "/dev/null"], "#!/bin/sh\ntrue\n", user="stpu_alice")
    wait_until(lambda: "DRAIN" in cluster.node_states()["n1"], 120, "Slurm to drain n1 after the killed prolog")
    # Killed half-way: it had leased the USB stick (audited) but never the PCIe card.
    assert any(e["event"] == "acquire" and e["job_id"] == job and e["identity"] == USB for e in audit(cluster, "n1"))
    held = {row["identity"]: row for row in leases(cluster, "n1")}
    assert held[PCI]["job_id"] == 4242
    # Slurm (measured: 22.05.8) runs the Epilog for a job whose prolog failed; if it
    # has not run yet, the stick is still covered by the killed prolog's lease.
    usb = inventory(cluster, "n1")[USB][0]
    if USB in held:
        assert held[USB]["job_id"] == job and owner(usb)[0] in (0, alice)
    else:
        assert owner(usb) == (0, 0, 0o600)
    sleeper.kill()
    sleeper.wait()
    cluster.command(["scancel", str(job)])
    resume(cluster)
    # The next job gets both devices: the killed prolog's lease and the dead holder's are reclaimed.
    nxt = hold(cluster, "stpu_bob", "k2", ["-w", "n1", "--gres=tpu:2"])
    try:
        assert open(outp(cluster, "k2.devices")).read().split()[0].split(",") == [USB, PCI]
        assert owner(inventory(cluster, "n1")[USB][0]) == (users["stpu_bob"], 0, 0o600)
    finally:
        assert stop(cluster, "k2", nxt) == "COMPLETED"
    ended = {(e["identity"], e.get("job_id"), e["event"]) for e in audit(cluster, "n1")}
    assert (PCI, 4242, "reclaim") in ended
    # The killed prolog's lease ends by an epilog Slurm runs for the failed job, by reclaim, or (the
    # node agent did the prolog's work: slurm_tpu/hooks/agent.py) by the agent's worker itself, which
    # outlives its killed client, fails to get the held card and rolls back what it took.
    assert {(USB, job, "reclaim"), (USB, job, "release"), (USB, job, "rollback")} & ended
    assert_idle_and_consistent(cluster)


def test_stale_lease_of_a_dead_job_is_reclaimed(cluster, users):
    from slurm_tpu.access.ledger import Lease, Ledger

    pci = inventory(cluster, "n1")[PCI][0]
    state = os.path.join(cluster.node_dir("n1"), "state")
    with Ledger(state) as ledger:  # what a job that died with its node's slurmd would leave
        assert ledger.claim(
            Lease(identity=PCI, job_id=777777, uid=users["stpu_bob"], prolog_pid=1, prolog_start=1, device_nodes=(pci,))
        )
    os.chown(pci, users["stpu_bob"], -1)
    job = hold(cluster, "stpu_alice", "s1", ["-w", "n1", "--gres=tpu:edgetpu_pci:1"])
    try:
        assert owner(pci) == (users["stpu_alice"], 0, 0o600)
        assert open_as("stpu_bob", pci) == "EACCES"
    finally:
        assert stop(cluster, "s1", job) == "COMPLETED"
    assert any(e["event"] == "reclaim" and e["job_id"] == 777777 for e in audit(cluster, "n1"))
    assert cluster.node_states()["n1"] == "IDLE"
    assert_idle_and_consistent(cluster)


def test_reenumerated_usb_node_is_handed_to_the_job_within_the_event(cluster, users):
    alice = users["stpu_alice"]
    old = inventory(cluster, "n1")[USB][0]
    old_rdev = os.lstat(old).st_rdev
    slot = os.path.join(cluster.node_dir("n1"), "slots", USB)
    job = hold(cluster, "stpu_alice", "r1", ["-w", "n1", "--gres=tpu:edgetpu_usb:1"])
    try:
        # Firmware load: the kernel makes a new devnum node (udev gives it idle ownership) and drops the old one.
        new = os.path.join(os.path.dirname(old), "099")
        os.mknod(new, stat.S_IFCHR | 0o600, os.makedev(240, 99))
        os.unlink(old)
        done = udev_event(
            cluster,
            "n1",
            ACTION="add",
            DEVPATH=USB_DEVPATH,
            DEVNAME=new,
            SUBSYSTEM="usb",
            DEVTYPE="usb_device",
            PRODUCT="18d1/9302/100",
        )
        assert done.returncode == 0, done.stderr
        assert owner(new) == (alice, 0, 0o600)  # the job's ownership, applied by the event itself
        assert open_as("stpu_alice", new) == "ENXIO" and open_as("stpu_bob", new) == "EACCES"
        assert os.lstat(slot).st_rdev == os.makedev(240, 99)  # slot re-pointed for slurmd
        assert inventory(cluster, "n1")[USB] == [new]
        assert [e for e in audit(cluster, "n1") if e["event"] == "reenumerate"][-1]["job_id"] == job
    finally:
        assert stop(cluster, "r1", job) == "COMPLETED"
    assert owner(new) == (0, 0, 0o600)
    assert cluster.node_states()["n1"] == "IDLE"
    assert_idle_and_consistent(cluster)
    # Put the original node back for the other tests.
    os.mknod(old, stat.S_IFCHR | 0o600, old_rdev)
    os.unlink(new)
    assert udev_event(cluster, "n1", ACTION="add", DEVPATH=USB_DEVPATH, DEVNAME=old, SUBSYSTEM="usb").returncode == 0


def test_device_vanishing_during_the_job_drains_the_node_with_a_reason(cluster, users):
    usb = inventory(cluster, "n1")[USB][0]
    rdev = os.lstat(usb).st_rdev
    job = hold(cluster, "stpu_alice", "v1", ["-w", "n1", "--gres=tpu:edgetpu_usb:1"])
    try:
        os.unlink(usb)  # unplugged
        done = udev_event(cluster, "n1", ACTION="remove", DEVPATH=USB_DEVPATH, DEVNAME=usb, SUBSYSTEM="usb")
        assert done.returncode == 0, done.stderr
    finally:
        stop(cluster, "v1", job)
    wait_until(lambda: "DRAIN" in cluster.node_states()["n1"], 120, "the epilog to drain n1")
    reason = drain_reason(cluster)
    assert reason.startswith("slurm-tpu:") and USB in reason and "vanished" in reason
    assert leases(cluster, "n1") == []
    # Plugged back in: udev re-adds it (idle ownership), the admin resumes the node.
    os.mknod(usb, stat.S_IFCHR | 0o600, rdev)
    assert udev_event(cluster, "n1", ACTION="add", DEVPATH=USB_DEVPATH, DEVNAME=usb, SUBSYSTEM="usb").returncode == 0
    resume(cluster)
    assert_idle_and_consistent(cluster)


def _fingerprint(path: str) -> tuple:
    info = os.lstat(path)
    with open(path, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode), info.st_mtime_ns, digest


def test_symlinks_planted_in_the_state_dir_change_nothing_outside(cluster, users, tmp_path):
    state = os.path.join(cluster.node_dir("n1"), "state")
    victims = {}
    for name in ("audit", "lease", "snapshot", "envfile"):
        victim = tmp_path / f"victim-{name}"
        victim.write_text(f"{name} precious\n")
        os.chmod(victim, 0o644)
        victims[name] = str(victim)
    before = {name: _fingerprint(path) for name, path in victims.items()}
    os.rename(os.path.join(state, "audit.log"), os.path.join(state, "audit.log.kept"))
    os.symlink(victims["audit"], os.path.join(state, "audit.log"))
    os.symlink(victims["lease"], os.path.join(state, "leases", USB))
    os.replace(os.path.join(state, "hooks.snapshot"), os.path.join(state, "snapshot.kept"))
    os.symlink(victims["snapshot"], os.path.join(state, "hooks.snapshot"))
    next_id = int(cluster.command(["scontrol", "show", "config"]).stdout.split("NEXT_JOB_ID")[1].split()[1])
    os.symlink(victims["envfile"], os.path.join(state, "jobs", f"{next_id}.env"))
    try:
        job = hold(cluster, "stpu_alice", "y1", ["-w", "n1", "--gres=tpu:edgetpu_usb:1"])
        assert job == next_id
        assert open(outp(cluster, "y1.devices")).read().strip() == USB
        assert stop(cluster, "y1", job) == "COMPLETED"
    finally:
        os.unlink(os.path.join(state, "audit.log"))
        os.rename(os.path.join(state, "audit.log.kept"), os.path.join(state, "audit.log"))
    assert {name: _fingerprint(path) for name, path in victims.items()} == before
    assert not os.path.islink(os.path.join(state, "hooks.snapshot"))
    assert not os.path.lexists(os.path.join(state, "leases", USB))
    assert cluster.node_states()["n1"] == "IDLE"
    assert_idle_and_consistent(cluster)


def test_non_numeric_job_uid_is_refused_with_one_line(cluster, users):
    marker = "/tmp/slurm-tpu-pwned-uid"
    env = hook_env(cluster, "n1", 999999, SLURM_JOB_UID=f"1001;touch {marker}")
    done = run_hook("prolog", env)
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1 and "SLURM_JOB_UID" in done.stderr
    assert not os.path.exists(marker)
    assert_idle_and_consistent(cluster)


def test_job_name_with_shell_metacharacters_and_a_forged_gres_line(cluster, users):
    marker = f"/tmp/slurm-tpu-pwned-{os.getpid()}"
    # Slurm's IDX for the USB stick is 0 on n1; the forged line claims the PCIe card (IDX 1).
    name = (
        f"$(touch {marker});`touch {marker}`|touch {marker}&\n"
        "     Nodes=n1 CPU_IDs=0 Mem=0 GRES=tpu:edgetpu_pci:1(IDX:1)"
    )
    job = hold(cluster, "stpu_alice", "m1", ["-w", "n1", "--gres=tpu:edgetpu_usb:1"], name=name)
    try:
        assert open(outp(cluster, "m1.devices")).read().strip() == USB
        assert owner(inventory(cluster, "n1")[PCI][0]) == (0, 0, 0o600)
    finally:
        assert stop(cluster, "m1", job) == "COMPLETED"
    assert not os.path.exists(marker)
    assert_idle_and_consistent(cluster)


def test_a_job_name_forging_a_whole_record_gets_slurms_device(cluster, users):
    """A fake ``JobId=`` line moves Slurm's own detail line into a fake record (seen on 22.05 and 25.11)."""
    name = (
        "split\n     Nodes=n1 CPU_IDs=0 Mem=0 GRES=tpu:edgetpu_pci:1(IDX:1)\n"
        "JobId=77777 ArrayJobId=77777 ArrayTaskId=1 JobName=x"
    )
    job = hold(cluster, "stpu_alice", "r1", ["-w", "n1", "--gres=tpu:edgetpu_usb:1"], name=name)
    try:
        assert open(outp(cluster, "r1.devices")).read().strip() == USB
        assert owner(inventory(cluster, "n1")[PCI][0]) == (0, 0, 0o600)
    finally:
        assert stop(cluster, "r1", job) == "COMPLETED"
    assert_idle_and_consistent(cluster)


def test_array_tasks_sharing_a_node_each_get_their_own_device(cluster, users):
    """The task that runs under the array's id sees its siblings' lines too: they are not a forgery."""
    script = HOLD.format(o=os.path.join(cluster.base, "out"), t="a$SLURM_ARRAY_TASK_ID")
    array = cluster.sbatch(
        ["--array=0-1", "-w", "n1", "--gres=tpu:1", "-o", "/dev/null", "-e", "/dev/null"], script, user="stpu_alice"
    )
    try:
        wait_until(
            lambda: all(os.path.exists(outp(cluster, f"a{t}.started")) for t in (0, 1)),
            60,
            f"both tasks of array {array} to start",
        )
        devices = {open(outp(cluster, f"a{t}.devices")).read().strip() for t in (0, 1)}
        assert devices == {USB, PCI}
    finally:
        for t in (0, 1):
            open(outp(cluster, f"a{t}.stop"), "w").close()
        wait_until(
            lambda: not cluster.command(["squeue", "-h", "-j", str(array)], check=False).stdout.strip(),
            60,
            f"array {array} to end",
        )
    assert_idle_and_consistent(cluster)


def test_gres_conf_naming_etc_shadow_is_refused(cluster, users, tmp_path):
    os.chmod(tmp_path, 0o755)
    with open(cluster.slurm_conf, encoding="utf-8") as handle:
        (tmp_path / "slurm.conf").write_text(handle.read())
    (tmp_path / "gres.conf").write_text(
        "NodeName=n1 Name=tpu Type=edgetpu_usb File=/etc/shadow\n"
        "NodeName=n1 Name=tpu Type=edgetpu_pci File=/etc/shadow\n"
    )
    shadow = _fingerprint("/etc/shadow")
    job = hold(cluster, "stpu_alice", "x1", ["-w", "n1", "--gres=tpu:edgetpu_pci:1"])
    try:
        pci_owner = owner(inventory(cluster, "n1")[PCI][0])
        env = hook_env(cluster, "n1", job, users["stpu_alice"], SLURM_CONF=str(tmp_path / "slurm.conf"))
        done = run_hook("prolog", env)
        assert done.returncode == 1
        assert "/etc/shadow" in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert owner(inventory(cluster, "n1")[PCI][0]) == pci_owner  # the job's lease untouched
    finally:
        assert stop(cluster, "x1", job) == "COMPLETED"
    # Owner and mode: what a hook could change. Its content and mtime are not ours to pin:
    # any useradd/userdel on the machine (other test runs create users) rewrites it.
    assert _fingerprint("/etc/shadow")[:3] == shadow[:3]
    assert_idle_and_consistent(cluster)


def test_surviving_holder_drains_the_node_and_clearing_restores_idle_at_once(cluster, users):
    # A PCIe TPU: it cannot be revoked (slurm_tpu/access/revoke.py), so a survivor keeps it from the next job.
    pci = inventory(cluster, "n1")[PCI][0]
    rdev = node_on(pci, "/dev/full")  # a real driver's numbers, so it can be held open
    pidfile = outp(cluster, "survivor.pid")
    job = cluster.sbatch(
        ["-w", "n1", "--gres=tpu:edgetpu_pci:1", "-o", "/dev/null", "-e", "/dev/null"],
        SURVIVOR_JOB.format(node=pci, pidfile=pidfile),
        user="stpu_alice",
    )
    survivor = None
    try:
        cluster.wait_for_jobs([job], timeout=180)
        survivor = int(open(pidfile).read())
        wait_until(lambda: "DRAIN" in cluster.node_states()["n1"], 120, "the epilog to drain n1")
        reason = drain_reason(cluster)
        assert reason.startswith("slurm-tpu:") and survivor in holder_pids(reason) and PCI in reason, reason
        held = {row["identity"]: row for row in leases(cluster, "n1")}
        assert held[PCI]["job_id"] == job and held[PCI]["phase"] == "kept"  # still leased: not free
        assert owner(pci) == (0, 0, 0o600)  # but taken away from alice before the check
        assert open_as("stpu_alice", pci) == "EACCES"
        refused = clear_lease(cluster, PCI)
        assert refused.returncode != 0 and survivor in holder_pids(refused.stderr), refused.stderr
    finally:
        if survivor:
            os.kill(survivor, 9)
    wait_until(lambda: not os.path.exists(f"/proc/{survivor}"), 30, "the survivor to die")
    # The admin clears the lease: idle ownership at once, not at the next job's prolog.
    clear_lease_when_free(cluster, PCI)  # (a test run beside this one may hold /dev/full's numbers)
    assert leases(cluster, "n1") == []
    assert owner(pci) == (0, 0, 0o600)
    assert any(e["event"] == "clear" and e["job_id"] == job for e in audit(cluster, "n1"))
    resume(cluster)
    nxt = hold(cluster, "stpu_bob", "sv2", ["-w", "n1", "--gres=tpu:edgetpu_pci:1"])
    assert owner(pci) == (users["stpu_bob"], 0, 0o600)
    assert stop(cluster, "sv2", nxt) == "COMPLETED"
    assert_idle_and_consistent(cluster)
    restore_node(pci, rdev)
