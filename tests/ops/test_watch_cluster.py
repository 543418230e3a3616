"""slurm-tpu watch against real udev events (umockdev) and a real local cluster."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness import module_command
from harness.localcluster import NodeSpec
from helpers import HARDWARE
from slurm_tpu.slurm.parse import parse_key_values

pytestmark = pytest.mark.slurm
DRIVER = Path(__file__).with_name("uevent_driver.py")
STICK = "/sys/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1.3"
SECOND = "/sys/devices/pci0000:00/0000:00:14.0/usb2/2-2"
SETTLE = 2.0


def debian_python_with_umockdev() -> str:
    python = "/usr/bin/python3"
    probe = subprocess.run([python, "-c", "import gi; gi.require_version('UMockdev', '1.0')"], capture_output=True)
    if probe.returncode != 0 or not shutil.which("umockdev-wrapper"):
        pytest.skip("needs Debian's python3-gi and gir1.2-umockdev-1.0 (installed by scripts/setup.sh)")
    return python


class UeventDriver:
    """The uevent driver, speaking its line protocol."""

    def __init__(self, initial: Path):
        self.process = subprocess.Popen(
            ["umockdev-wrapper", debian_python_with_umockdev(), str(DRIVER), str(initial)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def __call__(self, *words: str) -> None:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(json.dumps(words) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        assert answer == "ok", f"{words}: {answer}"


@pytest.fixture(scope="module")
def setup(cluster_factory, tmp_path_factory):
    cluster = cluster_factory([NodeSpec("n1", str(HARDWARE / "usb_stick_after.umockdev")), NodeSpec("n2")])
    log = tmp_path_factory.mktemp("watch") / "watch.log"
    testbed = UeventDriver(HARDWARE / "usb_stick_after.umockdev")
    env_cmd = ["env", f"SLURM_CONF={cluster.slurm_conf}", f"SLURM_TPU_CONFIG={cluster.node_config('n1')}"]
    manage = shlex.join(module_command(sys.executable, "harness.localcluster"))
    testbed(
        "spawn",
        str(log),
        *env_cmd,
        sys.executable,
        "-m",
        "slurm_tpu.cli",
        "watch",
        "--node",
        "n1",
        "--gres-conf",
        cluster.gres_conf,
        "--node-conf",
        cluster.path("etc", "nodes.conf"),
        "--settle",
        str(SETTLE),
        "--stop-command",
        f"{manage} stop-slurmd {cluster.base} n1",
        "--start-command",
        f"{manage} start-slurmd {cluster.base} n1",
        "--controller-command",
        f"{manage} restart-slurmctld {cluster.base}",
    )
    wait_log(log, "following udev")
    yield cluster, testbed, log
    testbed("stop")


def wait_log(log: Path, text: str, count: int = 1, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    content = ""
    while time.monotonic() < deadline:
        content = log.read_text() if log.exists() else ""
        if content.count(text) >= count:
            return content
        time.sleep(0.2)
    raise AssertionError(f"'{text}' x{count} not in watch log within {timeout:g} s:\n{content}")


def syncs(log: Path) -> int:
    """How many times the watcher has looked at the hardware: each look logs one
    "<N> event(s)" line (before a restart, if it regenerates)."""
    return sum(
        1 for line in log.read_text().splitlines() if line.startswith("slurm-tpu watch: ") and " event(s)" in line
    )


def all_events_handled(testbed, log: Path) -> str:
    """The log once the watcher has handled every event sent before this call.

    Sends a no-op re-enumeration and waits for the next look, twice. The first look
    seen may be one already under way when the first probe was sent; the second
    begins after that one ended, and the watcher reads everything queued before it
    begins: every earlier event is in it or before it, and so is any regeneration
    they cause. An event, not a sleep, says "nothing more happened".
    """
    for _ in range(2):
        seen = syncs(log)
        testbed("reenumerate", STICK, str(HARDWARE / "usb_stick_after.umockdev"), "1")
        deadline = time.monotonic() + 60
        while syncs(log) <= seen:
            assert time.monotonic() < deadline, f"the watcher did not look again within 60 s:\n{log.read_text()}"
            time.sleep(0.1)
    return log.read_text()


def gres_files(cluster) -> list[str]:
    return [
        parse_key_values(line)["File"]
        for line in open(cluster.gres_conf).read().splitlines()
        if line.startswith("NodeName=n1 ")
    ]


def node_field(cluster, field: str) -> str:
    return parse_key_values(cluster.command(["scontrol", "-o", "show", "node", "n1"]).stdout)[field]


def test_reenumeration_changes_nothing(setup):
    cluster, testbed, log = setup
    before = open(cluster.gres_conf).read()
    quiet_lines = log.read_text().count("accelerators unchanged")
    testbed("unplug", STICK)
    testbed("plug", str(HARDWARE / "usb_stick_before.umockdev"))  # firmware mode, new devnum
    wait_log(log, "accelerators unchanged", quiet_lines + 1)
    assert "regenerated" not in all_events_handled(testbed, log)
    assert open(cluster.gres_conf).read() == before
    assert node_field(cluster, "Gres") == "tpu:edgetpu_usb:1"


def test_burst_of_100_events_gives_one_regeneration_and_never_a_missing_path(setup):
    cluster, testbed, log = setup
    problems: list[str] = []
    states: list[str] = []
    unanswered: list[float] = []
    done = threading.Event()

    def sample() -> None:  # what slurmd would see at any moment
        while not done.is_set():
            for path in gres_files(cluster):
                if not os.path.exists(path):
                    problems.append(path)
            try:
                states.append(node_field(cluster, "State"))
            except RuntimeError:
                # slurmctld restarting with the new configuration resets the query's connection
                # (Slurm 25.11): no state to see then; the sampler goes on instead of dying.
                unanswered.append(time.monotonic())
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        # 24 re-enumerations of the first stick, the second stick plugged, 25 more:
        # 24*2 + 1 + 25*2 = 99 events, then one change event on the second stick.
        testbed("reenumerate", STICK, str(HARDWARE / "usb_stick_after.umockdev"), "24")
        testbed("plug", str(HARDWARE / "usb_second_stick.umockdev"))
        testbed("reenumerate", STICK, str(HARDWARE / "usb_stick_before.umockdev"), "25")
        testbed("unplug", SECOND)
        testbed("plug", str(HARDWARE / "usb_second_stick.umockdev"))
        wait_log(log, "restarted with the new configuration and resumed", timeout=120)
        text = all_events_handled(testbed, log)
    finally:
        done.set()
        sampler.join()
    assert text.count("regenerated") == 1, text
    assert "added ['usb-2-2']" in text
    assert not problems, f"gres.conf named missing paths: {sorted(set(problems))}"
    assert not [s for s in states if "DOWN" in s], states
    assert len(states) > len(unanswered), "the node's state was seldom answered while the watcher worked"
    assert len(gres_files(cluster)) == 2
    assert node_field(cluster, "Gres") == "tpu:edgetpu_usb:2"
    assert "DRAIN" not in node_field(cluster, "State")
    job = cluster.sbatch(["--gres=tpu:2", "-w", "n1", "-o", "/dev/null"], "#!/bin/sh\ntrue\n")
    assert cluster.wait_for_jobs([job], timeout=60) == {job: "COMPLETED"}


def test_real_unplug_regenerates_again(setup):
    cluster, testbed, log = setup
    testbed("unplug", SECOND)
    text = wait_log(log, "restarted with the new configuration and resumed", count=2, timeout=120)
    assert "removed ['usb-2-2']" in text
    assert node_field(cluster, "Gres") == "tpu:edgetpu_usb:1"
    # The slot of the unplugged stick stays: nothing may ever name a missing path.
    assert os.path.exists(os.path.join(cluster.node_dir("n1"), "slots", "usb-2-2"))
