"""Rootless Podman for the container tests: a node with real device nodes, real users, real Podman.

The node is tests/hardware/big_node.umockdev (4 PCIe Edge TPUs, 2 USB sticks) detected by the
real ``slurm-tpu detect`` and materialised as the local clusters do it
(harness/localcluster/hardware.py): a real character device per node (:data:`FULL`), root's
0600 when idle, the job user's when leased (what the Prolog's lease does),
and the sticks' sysfs (busnum/devnum) under a sysfs root. ``slurm-tpu cdi --dev-root`` writes
the node's specs for those nodes into a private CDI directory, which each Podman command sees
as /var/run/cdi in a mount namespace of its own (:meth:`Podman.prefix`): never the machine's.

Each user gets a private Podman (storage, runtime dir, containers.conf with what these machines
need: runc, host network, explicit ulimits, cgroupfs) under one folder, and the image from
harness/containers/image.py imported once per module.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from helpers import HARDWARE, REPO

NODE = HARDWARE / "big_node.umockdev"
# The nodes are /dev/full's device (1:7), not the clusters' driverless major 240: an open that
# passes the permission check succeeds and holds an fd, as a real card's does (the holder scan
# finds it), and no process on the machine holds /dev/full itself.
FULL = (1, 7)
# What this machine needs (docs/admin-guide.md "Containers" has the same advice for a site).
CONTAINERS_CONF = """\
[containers]
netns = "host"
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
env = ["EDGETPU_VISIBLE_DEVICES", "SLURM_TPU_*"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
STORAGE_CONF = """\
[storage]
driver = "overlay"
graphroot = "{base}/storage"
runroot = "{base}/run/storage"
"""


def rootless_problem() -> str | None:
    """Why rootless Podman cannot run here, in one line (None: it can)."""
    for program in ("podman", "runc", "newuidmap", "newgidmap", "mmdebstrap", "mksquashfs"):
        if shutil.which(program) is None and not os.path.exists(f"/usr/sbin/{program}"):
            return f"{program} is not installed (scripts/setup.sh installs it)"
    try:
        with open("/proc/sys/user/max_user_namespaces", encoding="ascii") as handle:
            if int(handle.read()) == 0:
                return "user namespaces are disabled (/proc/sys/user/max_user_namespaces is 0)"
    except (OSError, ValueError):
        return "no /proc/sys/user/max_user_namespaces: this kernel has no user namespaces"
    return None


def ensure_subids(user: str) -> None:
    """A subordinate uid/gid range for ``user`` (rootless Podman maps the container's other ids there)."""
    for path, flag in (("/etc/subuid", "--add-subuids"), ("/etc/subgid", "--add-subgids")):
        text = Path(path).read_text() if os.path.exists(path) else ""
        if not any(line.split(":")[0] == user for line in text.splitlines()):
            uid = pwd.getpwnam(user).pw_uid
            start = 1_000_000 + (uid % 1000) * 65536
            subprocess.run(["usermod", flag, f"{start}-{start + 65535}", user], check=True)


@dataclass
class Podman:
    """One user's rootless Podman: ``run(args)`` is ``podman args`` as that user.

    Keep ``base`` short (``/tmp/stp-XXXXXXXX/p0``): with a longer runtime directory (about 40
    characters, e.g. ``/tmp/slurm-tpu-podman-XXXXXXXX/stpu_alice/run``) Podman 4.3's attached
    ``run`` returns only after conmon's 20 s timeout (docs/limits.md).
    """

    user: str
    base: Path
    cdi: Path
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        account = pwd.getpwnam(self.user)
        home = self.base / "home"
        conf = home / ".config" / "containers"
        conf.mkdir(parents=True, exist_ok=True)
        (self.base / "run").mkdir(mode=0o700, exist_ok=True)
        (conf / "containers.conf").write_text(CONTAINERS_CONF)
        (conf / "storage.conf").write_text(STORAGE_CONF.format(base=self.base))
        for path in [self.base, *self.base.rglob("*")]:
            os.chown(path, account.pw_uid, account.pw_gid)
        self.base.chmod(0o700)
        self.env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": str(home),
            "USER": self.user,
            "LOGNAME": self.user,
            "XDG_RUNTIME_DIR": str(self.base / "run"),
        }

    def run(
        self, args: list[str], env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        """``podman ARGS`` as the user, with only the given job variables besides Podman's own."""
        return subprocess.run(
            [
                *self.prefix(),
                "env",
                "-i",
                *[f"{k}={v}" for k, v in {**self.env, **(env or {})}.items()],
                "podman",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
        )

    def prefix(self) -> list[str]:
        """As the user, in a mount namespace of its own where /run/cdi is the node's CDI folder.

        Podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi (containers.conf's
        cdi_spec_dirs came later): the test's specs are bound there for this command alone,
        never on the machine. The user's pause process keeps the first command's namespace,
        and later commands join it: all see the same folder.
        """
        script = 'mkdir -p /run/cdi && mount --bind "$0" /run/cdi && u=$1 && shift && exec runuser -u "$u" -- "$@"'
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(self.cdi), self.user]

    def stop(self) -> None:
        """Remove the user's containers and storage, then end its pause process (``catatonit -P``,
        which outlives ``podman system reset``): no process of this Podman is left."""
        self.run(["rm", "--all", "--force"], timeout=120)
        pause = self.pause_pid()
        self.run(["system", "reset", "--force"], timeout=300)
        if pause is not None:
            try:
                os.kill(pause, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def pause_pid(self) -> int | None:
        """The pid of this Podman's pause process, where it runs (its pause.pid names a catatonit of the user)."""
        try:
            pid = int((self.base / "run" / "libpod" / "tmp" / "pause.pid").read_text())
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            owner = os.stat(f"/proc/{pid}").st_uid
        except (OSError, ValueError):
            return None
        return pid if argv[0].endswith(b"catatonit") and owner == pwd.getpwnam(self.user).pw_uid else None


@dataclass
class Node:
    """The materialised node: its inventory (real nodes under ``dev``), sysfs, CDI specs."""

    base: Path
    dev: Path
    sys: Path
    # /sim in the containers, the double's EDGETPU_DOUBLE_ROOT: sys/ (the node's sysfs), dev/bus ->
    # /dev/bus (the USB nodes where CDI binds them), dev/apex_N -> the card's node (its host path).
    sim: Path
    cdi: Path
    inventory: dict
    library: Path  # the libedgetpu the specs mount (the double, or the real one)

    def nodes(self) -> dict[str, str]:
        """identity -> its device node (host path)."""
        return {a["identity"]: a["device_nodes"][0] for a in self.inventory["accelerators"] if a["device_nodes"]}

    def lease(self, identities: list[str], user: str) -> None:
        """What the Prolog's lease does to the nodes: the job user's, 0600."""
        account = pwd.getpwnam(user)
        for identity in identities:
            node = self.nodes()[identity]
            os.chown(node, account.pw_uid, account.pw_gid)
            os.chmod(node, 0o600)

    def release(self) -> None:
        """Every node back to root's 0600 (idle)."""
        for node in self.nodes().values():
            os.chown(node, 0, 0)
            os.chmod(node, 0o600)

    def double_devices(self) -> str:
        """EDGETPU_DOUBLE_DEVICES: every Edge TPU of the node, as the library enumerates them."""
        entries = []
        for a in self.inventory["accelerators"]:
            if a["kind"] != "edgetpu":
                continue
            if a["bus"] == "usb":
                entries.append(f"usb:/sys/bus/usb/devices/{a['identity'][len('usb-') :]}")
            else:
                entries.append(f"pci:/dev/{os.path.relpath(a['device_nodes'][0], self.dev)}")
        return ",".join(entries)


def make_node(base: Path, library: Path) -> Node:
    """Detect big_node, materialise its nodes and sysfs under ``base``, write its CDI specs."""
    from harness.localcluster.hardware import detect_under_umockdev, materialize, materialize_sysfs

    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)
    detected = detect_under_umockdev(str(NODE), [sys.executable, "-m", "slurm_tpu.cli"], sys.executable)
    dev, sys_root, sim, cdi = base / "dev", base / "sim" / "sys", base / "sim", base / "cdi"
    inventory = materialize(detected, str(dev))
    for accelerator in inventory:
        for path in accelerator.device_nodes:  # openable: see FULL
            os.unlink(path)
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(*FULL))
    materialize_sysfs(inventory, str(sys_root))
    (sim / "dev").mkdir()
    (sim / "dev" / "bus").symlink_to("/dev/bus")
    for card in dev.glob("apex_*"):
        (sim / "dev" / card.name).symlink_to(card)
    for path in [base, *base.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    saved = base / "inventory.json"
    saved.write_text(json.dumps(inventory.to_json()))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_tpu.cli",
            "cdi",
            "--output",
            str(cdi),
            "--inventory",
            str(saved),
            "--dev-root",
            str(dev),
            "--libedgetpu",
            str(library),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return Node(base, dev, sys_root, sim, cdi, inventory.to_json(), library)


def cdi_devices(identities: list[str], kind: str = "edgetpu") -> str:
    """SLURM_TPU_CDI_DEVICES for a job holding these devices (protocol/jobenv.py's names)."""
    from slurm_tpu.protocol.jobenv import cdi_name

    return ",".join(cdi_name(kind, identity) for identity in identities)


def device_flags(variable: str) -> list[str]:
    """What the user guide's line does: one ``--device`` per entry of SLURM_TPU_CDI_DEVICES."""
    return [flag for name in variable.split(",") if name for flag in ("--device", name)]


def scratch(user: str, parent: Path) -> Path:
    """A folder the user's container may write into (the double's log, results)."""
    path = parent / f"out-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o755)
    account = pwd.getpwnam(user)
    os.chown(path, account.pw_uid, account.pw_gid)
    return path
