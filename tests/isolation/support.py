"""Helpers for the isolation tests (imported as ``from support import ...``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile

from helpers import (
    USERS,  # noqa: F401  (the users the ``users`` fixture makes)
    wait_until,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARDWARE = os.path.join(REPO, "tests", "isolation", "hardware")
NEEDS = ("slurmctld", "slurmd", "munged", "umockdev-run", "useradd", "runuser")


def require_root_and_slurm() -> None:
    from helpers import require_root_and

    require_root_and(NEEDS, "Slurm daemons, useradd, chown")


def make_cluster(nodes, **kwargs):
    """Configure and start a LocalCluster with the project's hooks; caller stops it."""
    from harness.localcluster.cluster import LocalCluster, project_hooks

    base = tempfile.mkdtemp(prefix="slurm-tpu-iso-", dir="/tmp")
    os.chmod(base, 0o755)
    os.makedirs(os.path.join(base, "out"))
    os.chmod(os.path.join(base, "out"), 0o1777)
    hooks = kwargs.pop("hooks", None) or project_hooks()
    from helpers import first_job_id

    kwargs.setdefault("first_job_id", first_job_id())
    cluster = LocalCluster(base=base, nodes=nodes, hooks=hooks, **kwargs)
    try:
        cluster.configure()
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def one_node_two_tpus():
    """For a module's ``cluster`` fixture (``yield from``): one node, n1, with a USB stick
    and a PCIe card (hardware/n1_two_tpus.umockdev) and the project's hooks."""
    require_root_and_slurm()
    from harness.localcluster.cluster import NodeSpec

    started = make_cluster([NodeSpec("n1", os.path.join(HARDWARE, "n1_two_tpus.umockdev"))])
    try:
        yield started
    finally:
        finish_cluster(started)


def finish_cluster(cluster) -> None:
    cluster.stop()
    if not os.environ.get("SLURM_TPU_KEEP_CLUSTER"):
        shutil.rmtree(cluster.base, ignore_errors=True)


OPEN_PROBE = """
import errno, os, sys
try:
    os.close(os.open(sys.argv[1], os.O_RDWR | os.O_NONBLOCK))
    print("OPENED")
except OSError as exc:
    print(errno.errorcode.get(exc.errno, str(exc.errno)))
"""


def open_as(user: str, path: str) -> str:
    """Try to open a device node as ``user`` from a plain shell: 'EACCES', 'ENXIO', 'OPENED'...

    The simulated nodes use an experimental major with no driver, so a permitted
    open() fails with ENXIO *after* the permission check: EACCES means the kernel
    refused the user, anything else means the user got past the permissions. A PCIe
    Edge TPU's node is the emulated apex driver's pty: a permitted open() succeeds.
    """
    done = subprocess.run(
        ["runuser", "-u", user, "--", "/usr/bin/python3", "-I", "-c", OPEN_PROBE, path],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout.strip() or done.stderr.strip()


PTY_SLAVE_MAJORS = range(136, 144)  # Unix98 pty slaves: 256 minors per major


def node_on(node: str, device: str) -> int:
    """Point a simulated device node at a real driver's numbers (e.g. /dev/null), so a process
    can hold it open or map it (a PCIe card's pty does not map); returns the node's original
    rdev for :func:`restore_node`. A node the emulated apex driver bind-mounted its pty on
    (harness/localcluster/apex.py) is unmounted first; the driver's count then reads 0."""
    rdev = os.lstat(node).st_rdev
    if os.path.ismount(node):
        subprocess.run(["umount", node], check=True, capture_output=True)
    os.unlink(node)
    os.mknod(node, stat.S_IFCHR | 0o600, os.stat(device).st_rdev)
    return rdev


def restore_node(node: str, rdev: int) -> None:
    """Undo :func:`node_on`: the original numbers, or the emulated apex driver's pty bind-mounted again."""
    os.unlink(node)
    if os.major(rdev) not in PTY_SLAVE_MAJORS:
        os.mknod(node, stat.S_IFCHR | 0o600, rdev)
        return
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(240, 0))  # the placeholder the pty is mounted on
    pts = f"/dev/pts/{(os.major(rdev) - PTY_SLAVE_MAJORS[0]) * 256 + os.minor(rdev)}"
    subprocess.run(["mount", "--bind", pts, node], check=True, capture_output=True)


# A job that leaves a daemon (double fork, own session: it escapes Slurm's process
# tracking) keeping {node} open after the job ends; its pid goes to {pidfile}.
SURVIVOR_JOB = """#!/bin/sh
/usr/bin/python3 -I -c '
import os, sys, time
if os.fork(): sys.exit(0)
os.setsid()
if os.fork(): sys.exit(0)
fd = os.open(sys.argv[1], os.O_RDWR)
open(sys.argv[2], "w").write(str(os.getpid()))
time.sleep(120)
' {node} {pidfile}
while [ ! -s {pidfile} ]; do sleep 0.1; done
"""


def owner(path: str) -> tuple[int, int, int]:
    """(uid, gid, mode) of a node, not following links."""
    info = os.lstat(path)
    return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)


# The two Edge TPUs of hardware/n1_two_tpus.umockdev (see one_node_two_tpus).
USB, PCI = "usb-2-1.3", "pci-0000:03:00.0"


def out(cluster, name: str) -> str:
    """A file in the cluster's job output directory (mode 1777: every test user writes there)."""
    return os.path.join(cluster.base, "out", name)


def state_dir(cluster, node: str) -> str:
    return os.path.join(cluster.node_dir(node), "state")


def revoking(cluster, node: str) -> list[str]:
    """Devices whose lease is in phase ``revoking`` (a USB stick re-enumerating after its job)."""
    from slurm_tpu.protocol import FormatError
    from slurm_tpu.protocol.leases import DIR, REVOKING, Lease

    directory = os.path.join(state_dir(cluster, node), DIR)
    found = []
    for name in os.listdir(directory) if os.path.isdir(directory) else ():
        if name.startswith("."):
            continue  # a lease being written (temp file)
        try:
            with open(os.path.join(directory, name), "rb") as handle:
                if Lease.decode(name, handle.read()).phase == REVOKING:
                    found.append(name)
        except (OSError, FormatError):
            continue
    return found


def settle(cluster, node: str, timeout: float = 60) -> None:
    """Wait until every revoked USB stick is back and its release finished (udev_event ends it).

    Slurm reports a job COMPLETED when its epilog has power-cycled the port; the
    stick comes back (and the lease goes) asynchronously, through the emulated
    USB core and the udev hook.
    """
    cluster.wait_for_releases([node], timeout)  # an epilog that answered Slurm first releases under the lock
    wait_until(lambda: not revoking(cluster, node), timeout, f"revoked devices on {node} to come back")


def inventory(cluster, node: str, settled: bool = True) -> dict[str, list[str]]:
    """identity -> device nodes, from the node's state inventory file (after :func:`settle`)."""
    if settled:
        settle(cluster, node)
    with open(os.path.join(state_dir(cluster, node), "inventory.json"), encoding="utf-8") as handle:
        document = json.load(handle)
    return {a["identity"]: a["device_nodes"] for a in document["accelerators"]}


def audit(cluster, node: str) -> list[dict]:
    path = os.path.join(state_dir(cluster, node), "audit.log")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def leases(cluster, node: str, settled: bool = True) -> list[dict]:
    """`slurm-tpu leases --json` on the node (after :func:`settle`)."""
    if settled:
        settle(cluster, node)
    done = subprocess.run(
        [*cluster.slurm_tpu, "leases", "--json"],
        capture_output=True,
        text=True,
        env=dict(os.environ, SLURM_TPU_CONFIG=cluster.node_config(node)),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def hook_env(cluster, node: str, job_id: int, uid: int | None = None, **extra: str) -> dict[str, str]:
    """The environment slurmd gives a Prolog/Epilog for a job on ``node``."""
    env = {
        "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
        "SLURM_JOB_ID": str(job_id),
        "SLURMD_NODENAME": node,
        "SLURM_CONF": cluster.slurm_conf,
        "SLURM_TPU_CONFIG": cluster.node_config(node),
    }
    # Not run by slurmd, the hook cannot take Slurm from its parent: name the tests' Slurm (if not Debian's).
    env.update({k: v for k, v in os.environ.items() if k in ("SLURM_TPU_SLURM_BIN", "SLURM_TPU_SLURM_SBIN")})
    if uid is not None:
        env["SLURM_JOB_UID"] = str(uid)
    env.update(extra)
    return env


def run_hook(kind: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run prolog/epilog/task-prolog exactly as Slurm would (the executable, this env)."""
    program = {
        "prolog": "prolog/slurm-tpu-prolog",
        "epilog": "epilog/slurm-tpu-epilog",
        "task-prolog": "prolog/slurm-tpu-task-prolog",
    }[kind]
    return subprocess.run([os.path.join(REPO, program)], env=env, capture_output=True, text=True, timeout=60)


def udev_event(cluster, node: str, **env: str) -> subprocess.CompletedProcess:
    """Run `slurm-tpu udev-event` as udev would, for the node's config."""
    full = {
        "PATH": "/usr/bin:/bin",
        "SLURM_TPU_CONFIG": cluster.node_config(node),
        "SLURMD_NODENAME": node,
        "SLURM_CONF": cluster.slurm_conf,
        **env,
    }
    return subprocess.run(
        [*cluster.slurm_tpu, "udev-event"], env=full, capture_output=True, text=True, timeout=60, cwd=REPO
    )


def no_overlaps(records: list[dict]) -> dict[str, int]:
    """Check audit records: per device, acquire/release strictly alternate. Returns leases per device.

    The pairing is the product's own (slurm_tpu.protocol.audit.pair_leases, unit-tested
    on literal logs in tests/protocol): a device acquired while another job's lease on it
    was not freed, or freed by a job that did not hold it, is a conflict.
    """
    from slurm_tpu.protocol.audit import pair_leases

    pairing = pair_leases(sorted(records, key=lambda r: r["t"]))
    assert not pairing.conflicts, pairing.conflicts
    held = [f"{s.identity} by job {s.job_id}" for s in pairing.spans if s.freed is None]
    assert not held, f"leases never released: {held}"
    count: dict[str, int] = {}
    for span in pairing.spans:
        count[span.identity] = count.get(span.identity, 0) + 1
    return count


def drain_reason(cluster, node: str = "n1") -> str:
    """The node's Reason= in `scontrol show node` ('' when none)."""
    for token in cluster.show_node(node).splitlines():
        token = token.strip()
        if token.startswith("Reason="):
            return token[len("Reason=") :]
    return ""


def resume(cluster, node: str = "n1") -> None:
    cluster.command(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
    wait_until(lambda: cluster.node_states()[node] in ("IDLE", "MIXED"), 120, f"{node} to resume")


def holder_pids(text: str) -> list[int]:
    """The pids a drain reason (or a refused clear) names as holders: ``pid 12,34 still holds ...``.

    Every holder on the machine is named, not only the test's own: another test run
    beside this one may hold a node pointed at the same driver (/dev/zero, /dev/full).
    Assert that the test's holder is *among* them.
    """
    found = re.search(r"pid ([0-9,]+) still holds", text)
    return [int(p) for p in found.group(1).split(",")] if found else []


def clear_lease_when_free(
    cluster, identity: str, node: str = "n1", timeout: float = 180
) -> subprocess.CompletedProcess:
    """`leases --clear IDENTITY` once it succeeds: the test's holder is gone, but a holder of another
    test run beside this one (same driver numbers) may still hold the device for a while."""
    done: list[subprocess.CompletedProcess] = []

    def cleared() -> bool:
        done[:] = [clear_lease(cluster, identity, node)]
        return done[0].returncode == 0 and "cleared" in done[0].stdout

    try:
        wait_until(cleared, timeout, f"{identity}'s kept lease to clear")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {done[0].stdout.strip()} {done[0].stderr.strip()}") from None
    return done[0]


@contextlib.contextmanager
def kept_in_service(cluster, node: str = "n1"):
    """Whatever the test in the block did, or where it failed: afterwards the node's device nodes
    have their own numbers again, no lease is kept and the node is in service.

    A test that fails half-way (its holder killed in a ``finally``) would otherwise leave the
    node drained, and every later test of the module would wait for jobs that stay PENDING.
    """
    rdevs = {path: os.lstat(path).st_rdev for paths in inventory(cluster, node).values() for path in paths}
    try:
        yield
    finally:
        for path, rdev in rdevs.items():
            try:
                if os.lstat(path).st_rdev != rdev:
                    restore_node(path, rdev)
            except FileNotFoundError:
                pass  # a USB stick re-enumerated under another name
        for row in leases(cluster, node):
            if row.get("phase") == "kept":
                clear_lease_when_free(cluster, row["identity"], node)
        if "DRAIN" in cluster.node_states()[node]:
            resume(cluster, node)


def clear_lease(cluster, identity: str, node: str = "n1") -> subprocess.CompletedProcess:
    """`slurm-tpu --config NODE_CONFIG leases --clear IDENTITY` on the node, as the admin would run it."""
    environ = {k: v for k, v in os.environ.items() if k != "SLURM_TPU_CONFIG"}
    return subprocess.run(
        [*cluster.slurm_tpu, "--config", cluster.node_config(node), "leases", "--clear", identity],
        capture_output=True,
        text=True,
        env=dict(environ, SLURM_CONF=cluster.slurm_conf),
        timeout=60,
    )


def assert_idle_and_consistent(cluster, node: str = "n1", node_idle: bool = True) -> None:
    """Nothing leased, every device node back to root:root 0600, audit without overlaps (and the node IDLE)."""
    assert leases(cluster, node) == []
    for nodes in inventory(cluster, node).values():
        for path in nodes:
            assert owner(path) == (0, 0, 0o600), path
    no_overlaps(audit(cluster, node))
    if node_idle:
        assert cluster.node_states()[node] == "IDLE"


# In a job: open the job's own device read-write, check it works, hand the fd over the Unix
# socket {sock} (SCM_RIGHTS), close its own copy; with {mode} "take" it ends only once the
# receiver says it closed the fd too (an empty {mode}: it ends at once).
SMUGGLE = """/usr/bin/python3 -I -c '
import array, os, socket, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_NOCTTY)
os.write(fd, b"job")
sender = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sender.connect(sys.argv[2])
sender.sendmsg([b"f"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
os.close(fd)
if sys.argv[3:] == ["take"]:
    sender.recv(1)
' {node} {sock} {mode}"""


def run_hook_in_process(module, env, *args) -> int:
    """Run a hook module's ``run`` (hooks/prolog.py, epilog.py) in this process as its entry point does,
    with ``env`` as Slurm's environment (``args``: the run's own, e.g. the Epilog's early ``answer``); a
    drain it asks for is recorded and fails the test (the hooks' broker and energy paths must never drain
    a node). Returns the hook's exit status."""
    from slurm_tpu.hooks.context import HookRun

    class Run(HookRun):
        """A hook run that records a drain instead of asking Slurm."""

        __slots__ = ("drained",)

        def drain(self, node: str, reason: str) -> bool:
            self.drained.append(reason)
            return True

    hook = Run(module.__name__.rsplit(".", 1)[1], env)
    hook.drained = drained = []
    status = hook.main(module.run, *args)
    assert not drained, drained
    return status
