"""The node agent (hooks/agent.py, the shipped systemd/slurm-tpu-agent entry, as root) runs the power
sampler in a child process of its own: it updates a running job's poll file from the NVML double,
is started again when it dies, and never outlives the agent (stopped, or killed).

Each wait is on what the test can see (the poll file's contents, a process gone), with a generous
deadline: nothing here depends on how fast the machine is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import nvml_double
from helpers import wait_until
from slurm_tpu.access import statedir
from slurm_tpu.energy.figures import boot_id, clock_ns
from slurm_tpu.protocol.energy import DIR, StartDevice, StartFile, decode_poll, encode

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "systemd" / "slurm-tpu-agent"
GPU = "00000000:41:00.0"
JOB = 21

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent runs as root")


def _children(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="ascii") as handle:
                    fields = handle.read().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(name))
    return found


def _sampler_of(agent: int) -> int | None:
    """The agent's sampler: the child that watches the agent's pidfd (workers hold no pidfd)."""
    for child in _children(agent):
        try:
            links = [os.readlink(f"/proc/{child}/fd/{fd}") for fd in os.listdir(f"/proc/{child}/fd")]
        except OSError:
            continue
        if "anon_inode:[pidfd]" in links:
            return child
    return None


def _gone(pid: int) -> bool:
    """Exited (a zombie nobody reaped counts: it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


class AgentNode:
    """A node with the NVML double as its libnvidia-ml.so.1, a job's start file, and its agent."""

    def __init__(self, root: Path):
        library = nvml_double.build(root / "lib")
        self.gpus = root / "gpus"
        nvml_double.set_gpu(self.gpus, GPU, power_mw=200_000)
        self.state = root / "state"
        energy = self.state / DIR
        energy.mkdir(parents=True, mode=0o700)
        self.poll_path = energy / f"{JOB}.poll"
        fd = statedir.open_dir(str(energy))
        try:
            device = StartDevice("gpu-41", "gpu", f"nvml-power:{GPU}", None, None)
            start = StartFile(JOB, boot_id(), clock_ns(), [device])
            statedir.write_atomic(fd, str(JOB), encode(start), 0o600)
        finally:
            os.close(fd)
        config = root / "config.yaml"
        config.write_text(f"version: 2\nstate_dir: {self.state}\n")
        self.log = root / "agent.log"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "SLURM_TPU_CONFIG": str(config),
            "SLURMD_NODENAME": "n1",
            # The node's NVML by its soname, as on a GPU node: the double's directory first.
            "LD_LIBRARY_PATH": str(library.parent),
            nvml_double.STATE_VARIABLE: str(self.gpus),
        }
        with open(self.log, "wb") as log:
            self.agent = subprocess.Popen([sys.executable, "-I", "-S", str(AGENT)], env=env, stdout=log, stderr=log)

    def poll(self):
        try:
            return decode_poll(self.poll_path.read_bytes(), str(self.poll_path)).get("gpu-41")
        except FileNotFoundError:
            return None

    def sampler(self) -> int:
        return wait_until(lambda: _sampler_of(self.agent.pid), 60, f"the agent's sampler ({self.log})")

    def end(self) -> None:
        if self.agent.poll() is None:
            self.agent.kill()
            self.agent.wait(60)


@pytest.fixture
def node(tmp_path):
    try:
        made = AgentNode(tmp_path)
    except RuntimeError as exc:
        pytest.skip(str(exc))
    yield made
    made.end()


def test_the_agents_sampler_updates_a_jobs_poll_file_is_restarted_and_ends_with_the_agent(node):
    first = wait_until(node.poll, 60, f"the job's first power sample ({node.log})")
    assert first.last_watts == 200.0 and first.samples >= 1
    nvml_double.set_gpu(node.gpus, GPU, power_mw=300_000)
    later = wait_until(lambda: (p := node.poll()) is not None and p.last_watts == 300.0 and p, 60, "a sample at 300 W")
    assert later.samples > first.samples and later.joules > first.joules
    sampler = node.sampler()
    os.kill(sampler, signal.SIGKILL)  # a sampler that dies (a crash in the driver) is started again
    again = wait_until(lambda: (pid := _sampler_of(node.agent.pid)) not in (None, sampler) and pid, 60, "a new one")
    nvml_double.set_gpu(node.gpus, GPU, power_mw=100_000)
    wait_until(lambda: (p := node.poll()) is not None and p.last_watts == 100.0, 60, "the new sampler's sample")
    node.agent.send_signal(signal.SIGTERM)
    assert node.agent.wait(60) == 0
    assert _gone(again), "the sampler outlived the agent that stopped"
    assert "energy sampler" not in node.log.read_text()  # no problem was met


def test_the_sampler_ends_when_its_agent_is_killed(node):
    sampler = node.sampler()
    node.agent.kill()
    node.agent.wait(60)
    wait_until(lambda: _gone(sampler), 60, "the killed agent's sampler to end")
