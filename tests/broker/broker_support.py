"""Helpers for the broker tests: a broker process on a temp state directory, grants, jobs' cgroups, probes.

"In the job" is made real, not mocked: the broker's peer check reads the client's
/proc/PID/cgroup and the cgroup directory's owner, so a probe joins a root-owned cgroup
``.../job_<J>`` (cgroup v1 freezer, or v2) that the test made, before it drops to a user.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurm_tpu.hooks.shards import ask
from slurm_tpu.protocol import broker_wire as wire

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parent / "probe.py"
USB = "/sys/bus/usb/devices/2-1.3"
IDENTITY = "usb-2-1.3"


def device_root(root: Path) -> Path:
    """The double's stand-in / with the one stick's sysfs files and usbfs node (root 0600: the broker's)."""
    directory = root / USB.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "busnum").write_text("2\n")
    (directory / "devnum").write_text("5\n")
    node = root / "dev" / "bus" / "usb" / "002" / "005"
    node.parent.mkdir(parents=True, exist_ok=True)
    node.touch()
    os.chmod(node, 0o600)
    return root


def wait_for(predicate, timeout: float = 60.0, what: str = "a condition"):
    """Poll an observable condition (a file, a figure) until it holds; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class BrokerProcess:
    """``python -m slurm_tpu.broker`` on a private state directory, with the libedgetpu double."""

    def __init__(self, base: Path, double: Path, extra: list[str] | None = None):
        self.base = base
        self.state_dir = base / "state"
        self.state_dir.mkdir(mode=0o755, exist_ok=True)
        os.chmod(self.state_dir, 0o755)
        self.double = double
        self.extra = extra or []
        self.env = dict(
            os.environ,
            SLURM_TPU_LIBEDGETPU=str(double),
            EDGETPU_DOUBLE_DEVICES=f"usb:{USB}",
            EDGETPU_DOUBLE_ROOT=str(device_root(base / "root")),
            EDGETPU_DOUBLE_LOG=str(base / "double.log"),
            PYTHONPATH=str(REPO),
        )
        self.process: subprocess.Popen | None = None
        self.log = base / "broker.log"

    @property
    def broker_dir(self) -> Path:
        return self.state_dir / wire.BROKER_DIR

    def start(self) -> BrokerProcess:
        pidfile = self.broker_dir / wire.PIDFILE
        if pidfile.exists():
            pidfile.unlink()
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "slurm_tpu.broker",
                    "--state-dir",
                    str(self.state_dir),
                    "--device",
                    f"{IDENTITY}=usb:{USB}",
                    *self.extra,
                ],
                env=self.env,
                stdout=log,
                stderr=log,
            )
        wait_for(lambda: pidfile.exists() or self.process.poll() is not None, what="the broker's pid file")
        assert self.process.poll() is None, self.log.read_text()
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def grant(self, job: int, uid: int = 0, gid: int = 0, shares: int = 1) -> None:
        grants = self.broker_dir / wire.GRANTS
        grants.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = grants / str(job)
        path.write_bytes(wire.encode_grant(job, uid, gid, shares))
        os.chmod(path, 0o600)

    def control(self, op: str, **fields) -> dict:
        return ask(str(self.state_dir), {"op": op, **fields}, timeout=30)

    def open(self, job: int, uid: int = 0, gid: int = 0, shares: int = 1) -> str:
        self.grant(job, uid, gid, shares)
        answer = self.control("open", job=job)
        assert answer["ok"], answer
        return answer["endpoint"]


class JobCgroups:
    """Root-owned cgroups named ``job_<J>`` (as slurmstepd makes them) for the test's jobs."""

    def __init__(self):
        candidates = ["/sys/fs/cgroup/freezer", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        self.base = None
        for mount in candidates:
            if not os.path.isdir(mount):
                continue
            base = f"{mount}/slurm-tpu-broker-test-{os.getpid()}"
            try:
                os.makedirs(base, exist_ok=True)
                self._probe(base)
            except OSError:
                shutil.rmtree(base, ignore_errors=True)
                continue
            self.base = base
            break

    @staticmethod
    def _probe(base: str) -> None:
        directory = f"{base}/probe"
        os.makedirs(directory, exist_ok=True)
        done = subprocess.run(["sh", "-c", f"echo $$ > {directory}/cgroup.procs"], capture_output=True, check=False)
        os.rmdir(directory)
        if done.returncode != 0:
            raise OSError("cannot move a process into a test cgroup")

    def path(self, job: int) -> str:
        assert self.base is not None
        directory = f"{self.base}/job_{job}"
        os.makedirs(directory, exist_ok=True)
        return directory

    def command(self, job: int | None, argv: list[str], user: str | None = None) -> list[str]:
        """``argv`` run inside job ``job``'s cgroup (None: in none), as ``user`` (None: root)."""
        drop = ["runuser", "-u", user, "--"] if user else []
        if job is None:
            return [*drop, *argv]
        return ["sh", "-c", f'echo $$ > {self.path(job)}/cgroup.procs && exec "$@"', "sh", *drop, *argv]

    def cleanup(self) -> None:
        if self.base is None:
            return
        for name in os.listdir(self.base):
            directory = f"{self.base}/{name}"
            if os.path.isdir(directory):
                try:
                    os.rmdir(directory)
                except OSError:
                    pass
        try:
            os.rmdir(self.base)
        except OSError:
            pass


def probe(
    cgroups: JobCgroups,
    job: int | None,
    endpoint: str,
    args: list[str],
    user: str | None = None,
    timeout: float = 300,
    env: dict | None = None,
) -> dict:
    """Run probe.py ARGS as a client of ``endpoint`` in job ``job``; its JSON answer."""
    environ = dict(env or os.environ, SLURM_TPU_BROKER=endpoint, PYTHONPATH=str(REPO))
    done = subprocess.run(
        cgroups.command(job, [sys.executable, str(PROBE), *args], user),
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def start_probe(
    cgroups: JobCgroups, job: int, endpoint: str, args: list[str], user: str | None = None
) -> subprocess.Popen:
    environ = dict(os.environ, SLURM_TPU_BROKER=endpoint, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        cgroups.command(job, [sys.executable, str(PROBE), *args], user),
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def temp_base() -> Path:
    base = Path(tempfile.mkdtemp(prefix="stpu-broker-", dir="/tmp"))
    os.chmod(base, 0o755)
    return base
