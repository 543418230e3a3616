"""The node agent (slurm_tpu/hooks/agent.py) and its thin client, on a real cluster with real users.

What the agent design must keep of the Python hooks: the job gets its devices with no
Python start in its hooks; an agent that is down refuses the job and leaves the devices
root's; an agent killed while a job holds a lease loses nothing (the ledger on disk is
the truth, the next agent's epilog releases it); a user cannot use the agent's socket;
and a prolog waiting for nothing on one device never makes a job on another device wait
for a USB stick's power-cycle (docs/security.md: "Revocation on real hardware").
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess

import pytest
from support import (
    PCI,
    REPO,
    USB,
    assert_idle_and_consistent,
    audit,
    finish_cluster,
    inventory,
    kept_in_service,
    leases,
    make_cluster,
    out,
    owner,
    require_root_and_slurm,
    revoking,
    settle,
    state_dir,
    wait_until,
)

pytestmark = pytest.mark.slurm

HOLD = (
    '#!/bin/sh\necho "$SLURM_TPU_DEVICES" > {out}.devices\ntouch {out}.started\n'
    "while [ ! -e {out}.stop ]; do sleep 0.1; done\n"
)


@pytest.fixture(scope="module")
def cluster():
    """n1 (a USB stick and a PCIe card) whose Prolog is a native entry with a marker shim in place of the
    Python prolog beside it: the shim records every run, so the test sees whether the agent did the work."""
    require_root_and_slurm()
    from dataclasses import replace

    from harness.localcluster.cluster import NodeSpec, project_hooks
    from slurm_tpu.ops.hook_client import build, link_native_entries

    hooks_dir = os.path.join("/tmp", f"slurm-tpu-agent-hooks-{os.getpid()}")
    os.makedirs(hooks_dir, mode=0o755)
    client = build(hooks_dir)
    assert client, "no C compiler: the agent's client cannot be built"
    marker = os.path.join(hooks_dir, "python-prolog-runs")
    prolog = os.path.join(hooks_dir, "slurm-tpu-prolog")  # what the native entry runs without an agent
    with open(prolog, "w", encoding="utf-8") as handle:
        real = os.path.join(REPO, "prolog", "slurm-tpu-prolog")
        handle.write(f'#!/bin/sh\necho "$SLURM_JOB_ID" >> {marker}\nexec {real} "$@"\n')
    os.chmod(prolog, 0o755)
    [native] = link_native_entries(client, [prolog])
    started = make_cluster(
        [NodeSpec("n1", os.path.join(REPO, "tests", "isolation", "hardware", "n1_two_tpus.umockdev"))],
        hooks=replace(project_hooks(), prolog=native),
    )
    started.python_prolog_runs = marker
    try:
        yield started
    finally:
        finish_cluster(started)
        shutil.rmtree(hooks_dir, ignore_errors=True)


def python_prolog_runs(cluster) -> list[str]:
    try:
        with open(cluster.python_prolog_runs, encoding="utf-8") as handle:
            return handle.read().split()
    except FileNotFoundError:
        return []


def hold(cluster, user: str, tag: str, gres: str) -> int:
    job = cluster.sbatch(
        ["-w", "n1", f"--gres={gres}", "-o", "/dev/null", "-e", out(cluster, f"{tag}.err")],
        HOLD.format(out=out(cluster, tag)),
        user=user,
    )
    wait_until(
        lambda: os.path.exists(out(cluster, f"{tag}.started")) or cluster.job_state(job) == "FAILED",
        180,
        f"job {job} to start",
    )
    assert os.path.exists(out(cluster, f"{tag}.started")), open(out(cluster, f"{tag}.err")).read()
    return job


def release(cluster, tag: str, job: int) -> str:
    open(out(cluster, f"{tag}.stop"), "w").close()
    return cluster.wait_for_jobs([job], timeout=180)[job]


def agent_pid(cluster, node: str = "n1") -> int:
    return cluster.running_pids()[f"agent-{node}"]


def test_the_agent_leases_and_releases_with_no_python_hook_started(cluster, users):
    with kept_in_service(cluster):
        job = hold(cluster, "stpu_alice", "plain", "tpu:2")
        devices = open(out(cluster, "plain.devices"), encoding="utf-8").read().split()
        assert devices == [f"{USB},{PCI}"] or devices == [f"{PCI},{USB}"]
        held = {row["identity"]: row for row in leases(cluster, "n1", settled=False)}
        assert set(held) == {USB, PCI} and {row["job_id"] for row in held.values()} == {job}
        assert release(cluster, "plain", job) == "COMPLETED"
        assert str(job) not in python_prolog_runs(cluster)  # the agent did it: no interpreter start
        assert_idle_and_consistent(cluster)


def test_a_stopped_agent_leaves_the_work_to_the_python_hooks(cluster, users):
    with kept_in_service(cluster):
        cluster.stop_agent("n1")  # SIGTERM: it removes its socket
        try:
            assert not os.path.exists(cluster.agent_socket("n1"))
            job = hold(cluster, "stpu_bob", "fallback", "tpu:1")
            assert str(job) in python_prolog_runs(cluster)
            assert release(cluster, "fallback", job) == "COMPLETED"
        finally:
            cluster.start_agent("n1")
        assert_idle_and_consistent(cluster)


def test_a_dead_agent_leaves_the_work_to_the_python_hooks(cluster, users):
    """A crashed agent's socket stays behind: the hooks' work is the Python hooks' (same ledger, same
    lock), the job runs and no node is drained."""
    with kept_in_service(cluster):
        os.kill(agent_pid(cluster), signal.SIGKILL)
        wait_until(lambda: "agent-n1" not in cluster.running_pids(), 30, "the agent to die")
        assert os.path.exists(cluster.agent_socket("n1"))
        try:
            job = hold(cluster, "stpu_alice", "dead-agent", "tpu:1")
            assert str(job) in python_prolog_runs(cluster)
            assert [row["job_id"] for row in leases(cluster, "n1", settled=False)] == [job]
            assert release(cluster, "dead-agent", job) == "COMPLETED"
            assert "DRAIN" not in cluster.node_states()["n1"]  # (the client's line: test_agent_client.py)
        finally:
            cluster.start_agent("n1")
        assert_idle_and_consistent(cluster)


def test_an_agent_killed_while_a_job_holds_its_devices_loses_no_lease(cluster, users):
    with kept_in_service(cluster):
        job = hold(cluster, "stpu_alice", "crash", "tpu:edgetpu_pci:1")
        os.kill(agent_pid(cluster), signal.SIGKILL)
        try:
            wait_until(lambda: "agent-n1" not in cluster.running_pids(), 30, "the agent to die")
            held = leases(cluster, "n1", settled=False)
            assert [(row["identity"], row["job_id"]) for row in held] == [(PCI, job)]
            node = inventory(cluster, "n1", settled=False)[PCI][0]
            assert owner(node)[0] == users["stpu_alice"]
        finally:
            cluster.start_agent("n1")  # replaces the dead agent's socket
        assert release(cluster, "crash", job) == "COMPLETED"
        events = [(e["event"], e.get("job_id")) for e in audit(cluster, "n1") if e.get("identity") == PCI]
        # The lease's events; the job's energy figure on the card follows its release (out of the lock).
        assert [event for event in events if event[0] != "energy"][-2:] == [("acquire", job), ("release", job)]
        assert events[-1] == ("energy", job)
        assert_idle_and_consistent(cluster)


def _epilog_clients() -> list[int]:
    """Pids of running hook clients doing an epilog: the native entry slurm.conf names (argv[0]
    slurm-tpu-epilog-native), or the client asked for one (argv: client, "epilog", state dir, ...)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        native = argv[0].endswith(b"slurm-tpu-epilog-native")
        if native or (len(argv) > 1 and argv[0].endswith(b"slurm-tpu-hook-client") and argv[1] == b"epilog"):
            pids.append(int(name))
    return pids


def test_the_epilog_answers_slurm_only_once_it_holds_the_state_lock(cluster, users):
    """The agent's epilog answers Slurm before it releases (the release is off the path of the node's
    next job), but only once it holds the node's state lock, which it keeps until the release ends: so
    whoever takes the lock after Slurm ended the job (the next prolog; the harness's
    wait_for_releases) finds the device released. Here the test holds the lock: the job stays
    COMPLETING, its lease in place, until the test lets go."""
    import fcntl

    from slurm_tpu.access.ledger import LOCK

    with kept_in_service(cluster):
        job = hold(cluster, "stpu_alice", "lockorder", "tpu:edgetpu_pci:1")
        lock = os.open(os.path.join(state_dir(cluster, "n1"), LOCK), os.O_RDWR | os.O_NOFOLLOW)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            open(out(cluster, "lockorder.stop"), "w").close()
            wait_until(lambda: cluster.job_state(job) == "COMPLETING" and _epilog_clients(), 120, "the epilog to start")
            assert [(row["identity"], row["job_id"]) for row in leases(cluster, "n1", settled=False)] == [(PCI, job)]
            assert cluster.job_state(job) == "COMPLETING"  # no answer to Slurm without the lock
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            os.close(lock)
        assert cluster.wait_for_jobs([job], timeout=180) == {job: "COMPLETED"}
        events = [(e["event"], e.get("job_id")) for e in audit(cluster, "n1") if e.get("identity") == PCI]
        # The lease's events; the job's energy figure on the card follows its release (out of the lock).
        assert [event for event in events if event[0] != "energy"][-2:] == [("acquire", job), ("release", job)]
        assert events[-1] == ("energy", job)
        assert_idle_and_consistent(cluster)


CONNECT_AS_USER = r"""
import socket, struct, sys
path, mode = sys.argv[1], sys.argv[2]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    sock.connect(path)
except PermissionError:
    print("EACCES"); sys.exit(0)
env = b"SLURM_JOB_ID=1\0SLURM_JOB_UID=0\0SLURMD_NODENAME=n1\0"
body = b"STPU1\0epilog\0" + env
fds = [0, 1, 2]
try:
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", *fds))]
    sock.sendmsg([struct.pack("=I", len(body)) + body], rights)
    answer = sock.recv(1)
except (BrokenPipeError, ConnectionResetError):
    answer = b""  # closed unread
print("ANSWER" if answer else "CLOSED")
"""


def _children(pid: int) -> set[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as handle:
        return {int(child) for child in handle.read().split()}


def test_workers_serve_job_after_job_and_a_lease_names_the_prolog_process(cluster, users):
    """A worker serves hook after hook (no fork per hook: the agent's children stay the same over several
    jobs), and a lease names the process Slurm started for its prolog (the hook client), never a worker,
    which lives on after the prolog (leasing.holder_alive would think the prolog still ran)."""
    from slurm_tpu.access.ledger import Ledger
    from slurm_tpu.hooks.agent import IDLE_WORKERS

    cluster.stop_agent("n1")
    cluster.start_agent("n1")  # a fresh pool: its kept workers, and the resident scontrol's helper
    agent = agent_pid(cluster)
    # Its workers, the resident scontrol's helper and the energy sampler (energy is on by default).
    wait_until(lambda: len(_children(agent)) == IDLE_WORKERS + 2, 60, "the agent's workers to be forked")
    before = _children(agent)
    with kept_in_service(cluster):
        # The PCIe card only: a USB stick's power-cycle brings udev events, more hooks at once.
        for number in range(3):
            job = hold(cluster, "stpu_alice", f"serve{number}", "tpu:edgetpu_pci:1")
            with Ledger(state_dir(cluster, "n1")) as ledger:
                lease = ledger.read(PCI)
            assert lease is not None and lease.job_id == job
            assert lease.prolog_pid not in before | {agent}
            assert release(cluster, f"serve{number}", job) == "COMPLETED"
            settle(cluster, "n1")
    assert _children(agent) == before
    assert_idle_and_consistent(cluster)


def test_a_user_cannot_use_the_agents_socket(cluster, users):
    path = cluster.agent_socket("n1")
    info = os.lstat(path)
    assert (info.st_uid, info.st_mode & 0o777) == (0, 0o600)
    as_alice = ["runuser", "-u", "stpu_alice", "--", "/usr/bin/python3", "-I", "-c", CONNECT_AS_USER, path, "x"]
    done = subprocess.run(as_alice, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "EACCES", done.stderr
    # Even with the file opened up (an admin's mistake), the kernel's SO_PEERCRED says who asks.
    os.chmod(path, 0o666)
    try:
        done = subprocess.run(as_alice, capture_output=True, text=True, timeout=60)
    finally:
        os.chmod(path, 0o600)
    assert done.stdout.strip() == "CLOSED", done.stdout + done.stderr
    log = open(cluster.path("log", "agent-n1.out"), encoding="utf-8", errors="replace").read()
    assert f"(uid {users['stpu_alice']}): only root's hooks may ask" in log


def test_a_malformed_request_is_refused_and_the_agent_serves_on(cluster, users):
    body = b"STPU1\0epilog\0SLURM_JOB_ID=1\0"
    for payload, fds in (
        (struct.pack("=I", 1 << 30), False),  # far beyond the bound: never read
        (struct.pack("=I", 11) + b"STPU1\0shell\0", False),  # a hook that does not exist
        (b"\xff" * 16, False),
        (struct.pack("=I", len(body)) + body, True),
    ):  # a valid request, with descriptors
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(cluster.agent_socket("n1"))
        if fds:
            sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))])
        else:
            sock.sendall(payload)
        try:
            answer = sock.recv(1)
        except ConnectionResetError:  # closed with the rest of the request unread
            answer = b""
        assert answer == b""  # closed without a status
        sock.close()
    with kept_in_service(cluster):
        job = hold(cluster, "stpu_bob", "after-bad", "tpu:1")
        assert release(cluster, "after-bad", job) == "COMPLETED"
        assert str(job) not in python_prolog_runs(cluster)
        assert_idle_and_consistent(cluster)


# The emulated udev's hook for the test below: a stick's "add" (it is back after its power-cycle)
# waits until the test opens the gate, so the stick stays in phase "revoking" for as long as the
# test needs; every other event goes straight to the real hook.
GATED_UDEV = """#!/bin/sh
if [ "$ACTION" = add ]; then
    while [ ! -e {gate} ]; do sleep 0.05; done
fi
exec {python} -I -S {hook}
"""


def test_the_next_job_on_another_device_never_waits_for_a_usb_power_cycle(users):
    """A USB job's end power-cycles its port; a real stick is back about a second later (docs/security.md:
    "Revocation on real hardware"). Only the next job on that stick waits for it, in its prolog; a
    job on the node's other device starts and ends while the stick is still away."""
    require_root_and_slurm()
    import sys

    from harness.localcluster.cluster import NodeSpec

    gate_dir = os.path.join("/tmp", f"slurm-tpu-agent-gate-{os.getpid()}")
    os.makedirs(gate_dir, mode=0o755)
    gate, udev = os.path.join(gate_dir, "open"), os.path.join(gate_dir, "udev")
    with open(udev, "w", encoding="utf-8") as handle:
        handle.write(
            GATED_UDEV.format(gate=gate, python=sys.executable, hook=os.path.join(REPO, "udev", "slurm-tpu-udev-event"))
        )
    os.chmod(udev, 0o755)
    from dataclasses import replace

    from harness.localcluster.cluster import project_hooks

    cluster = make_cluster(
        [NodeSpec("n1", os.path.join(REPO, "tests", "isolation", "hardware", "n1_two_tpus.umockdev"))],
        hooks=replace(project_hooks(), udev=udev),  # the native entries: the agent does the work
    )
    try:
        first = cluster.sbatch(
            ["-w", "n1", "--gres=tpu:edgetpu_usb:1", "-o", "/dev/null"], "#!/bin/sh\ntrue\n", user="stpu_alice"
        )
        assert cluster.wait_for_jobs([first], timeout=180) == {first: "COMPLETED"}
        # Its epilog power-cycled the port; the stick is away until the gate opens.
        assert revoking(cluster, "n1") == [USB]
        other = cluster.sbatch(
            ["-w", "n1", "--gres=tpu:edgetpu_pci:1", "-o", "/dev/null"],
            '#!/bin/sh\ntest -n "$SLURM_TPU_DEVICES"\n',
            user="stpu_bob",
        )
        assert cluster.wait_for_jobs([other], timeout=180) == {other: "COMPLETED"}
        # The other device's job came and went while the stick was still away: it never waited.
        assert revoking(cluster, "n1") == [USB]
        events = [(e["event"], e.get("identity"), e.get("job_id")) for e in audit(cluster, "n1")]
        assert ("release", PCI, other) in events
        assert ("release", USB, first) not in events
        open(gate, "w").close()
        settle(cluster, "n1")
        after = cluster.sbatch(
            ["-w", "n1", "--gres=tpu:edgetpu_usb:1", "-o", "/dev/null"], "#!/bin/sh\ntrue\n", user="stpu_bob"
        )
        assert cluster.wait_for_jobs([after], timeout=180) == {after: "COMPLETED"}
        assert_idle_and_consistent(cluster)
    finally:
        open(gate, "w").close()
        finish_cluster(cluster)
        shutil.rmtree(gate_dir, ignore_errors=True)
