"""EDGETPU_VISIBLE_DEVICES in the REAL libedgetpu (our patch, scripts/libedgetpu-visible-devices.patch).

Unmodified Coral code (pycoral's ``make_interpreter(model)``, tflite's ``load_delegate``,
``list_edge_tpus()``, ``device=":1"``) runs as a job's user on a node with 4 PCIe cards and 2
sticks (one awaiting its firmware behind a hub, one flashed): big_node.umockdev. The user owns
only the job's device nodes: every other one is mode 0000 in the testbed, as another job's
device is on a real node. What the library opened is read from a syscall trace (strace; qemu-user's
own log in the arm64 leg): every open(2) of a device node, refused ones included, not the library's log.

No delegate ever comes back here (a testbed device maps no BAR and answers no USB request):
the question is only WHICH node the library goes for, and that it goes for none it must not.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from libedgetpu_support import HERE, attempts_in, in_testbed, require_tracing, trace_of, traced

from helpers import HARDWARE, USERS, merge_umockdev

NODE = HARDWARE / "big_node.umockdev"
VARIABLE = "EDGETPU_VISIBLE_DEVICES"
# Each Edge TPU of big_node as libedgetpu names it, and the device node it opens for it.
NODES = {f"/dev/apex_{n}": f"/dev/apex_{n}" for n in range(4)}
NODES["/sys/bus/usb/devices/2-1"] = "/dev/bus/usb/002/003"  # flashed (18d1:9302), on a root port
NODES["/sys/bus/usb/devices/1-1.4"] = "/dev/bus/usb/001/007"  # awaiting firmware (1a6e:089a), behind hub 1-1
STICK, STICK_IN_DFU = "/sys/bus/usb/devices/2-1", "/sys/bus/usb/devices/1-1.4"
# strace writes 'openat(AT_FDCWD, "/dev/...', qemu-user's log 'openat(AT_FDCWD,"/dev/...'.
OPEN = re.compile(r'open(?:at)?\((?:AT_FDCWD, ?)?"[^"]*?(/dev/(?:apex_\d+|bus/usb/\d{3}/\d{3}))"')


@dataclass
class Seen:
    ok: bool
    listed: list[str]
    attempts: int  # times the library went to open a USB stick (it sleeps 1 s before each)
    opened: set[str]  # device nodes the library tried to open
    stderr: str

    @property
    def at_once(self) -> bool:
        """No retry: at most one attempt per stick opened (a stick it cannot open would be retried 25 times)."""
        return self.attempts == sum(1 for node in self.opened if "/bus/usb/" in node)


@pytest.fixture(scope="module")
def job_user(users) -> str:
    require_tracing()
    return USERS[0]


@pytest.fixture
def traces(job_user):
    """A folder the job's user can write the traces to (pytest's own is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="slurm-tpu-visible-"))
    account = pwd.getpwnam(job_user)
    os.chown(path, account.pw_uid, account.pw_gid)
    yield path
    shutil.rmtree(path)


def typed(path: str) -> str:
    return ("usb:" if path.startswith("/sys/") else "pci:") + path


def run(
    library: str,
    action: str,
    job: list[str] | None,
    user: str,
    traces: Path,
    description: Path = NODE,
    nodes: dict[str, str] = NODES,
) -> Seen:
    """``visible_probe.py ACTION`` as ``user`` owning only ``job``'s device nodes, traced.

    ``job`` is what EDGETPU_VISIBLE_DEVICES lists (None: the variable is unset, as on a node
    whose task prolog does not export it); ``nodes`` are the testbed's Edge TPUs.
    """
    trace = traces / f"trace-{uuid.uuid4().hex}"
    trace.mkdir()
    os.chown(trace, traces.stat().st_uid, traces.stat().st_gid)  # the user's process writes it
    foreign = " ".join(f".{node}" for path, node in nodes.items() if path not in (job or []))
    probe = [sys.executable, str(HERE / "visible_probe.py"), library, action]
    argv, env = traced(probe, trace, "open,openat,clock_nanosleep,nanosleep")
    script = f'cd "$UMOCKDEV_DIR" && {"chmod 000 " + foreign + " && " if foreign else ""}exec "$@"'
    if job is not None:
        env[VARIABLE] = ",".join(job)
    done = in_testbed(description, ["sh", "-c", script, "sh", *argv], env=env, user=user)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    text = trace_of(trace)
    opened = {m.group(1) for m in OPEN.finditer(text)}
    return Seen(answer["ok"], answer["listed"], attempts_in(text), opened, done.stderr)


# name: the job's Edge TPUs, in the order the task prolog exports them
JOBS = {
    "one card, not the first": ["/dev/apex_2"],
    "one stick on a node with cards": [STICK],
    "two cards": ["/dev/apex_3", "/dev/apex_0"],
    "two sticks, both modes": [STICK_IN_DFU, STICK],
    "a stick and a card": [STICK, "/dev/apex_1"],
}


def default_device(job: list[str]) -> str:
    """What the library's default device is among the job's: its first card, else its first stick
    (OpenDeviceInternal tries PCIe before USB, each in enumeration order: the variable's)."""
    return next((p for p in job if p.startswith("/dev/")), job[0])


def foreign_device(job: list[str]) -> str:
    """A device of another job, of the type the job's first device has where there is one."""
    others = [p for p in NODES if p not in job]
    return next((p for p in others if p[:5] == job[0][:5]), others[0])


@pytest.mark.parametrize("name", JOBS)
def test_list_shows_only_the_jobs_tpus_in_its_order(library, job_user, traces, name):
    job = JOBS[name]
    seen = run(library, "list", job, job_user, traces)
    assert seen.listed == [typed(p) for p in job]
    assert seen.opened == set()  # listing opens no device


@pytest.mark.parametrize("name", JOBS)
def test_default_device_is_the_jobs_own(library, job_user, traces, name):
    """pycoral's make_interpreter(model): no device argument."""
    job = JOBS[name]
    seen = run(library, "default", job, job_user, traces)
    assert seen.opened == {NODES[default_device(job)]}
    assert seen.at_once


@pytest.mark.parametrize("index", [0, 1])
@pytest.mark.parametrize("name", JOBS)
def test_index_counts_in_the_variables_order(library, job_user, traces, name, index):
    """device=":N": the N-th of the job's Edge TPUs; past its last one, nothing is opened."""
    job = JOBS[name]
    seen = run(library, f"device=:{index}", job, job_user, traces)
    assert seen.opened == ({NODES[job[index]]} if index < len(job) else set())
    assert not seen.ok and seen.at_once


@pytest.mark.parametrize("kind", ["usb", "pci"])
def test_typed_index_counts_only_the_jobs_devices_of_that_type(library, job_user, traces, kind):
    job = JOBS["a stick and a card"]
    seen = run(library, f"device={kind}:0", job, job_user, traces)
    assert seen.opened == {NODES[STICK if kind == "usb" else "/dev/apex_1"]}
    seen = run(library, f"device={kind}:1", job, job_user, traces)
    assert seen.opened == set() and not seen.ok


@pytest.mark.parametrize("name", JOBS)
def test_a_foreign_path_is_refused_without_being_opened(library, job_user, traces, name):
    """An explicit path of another job's device: refused at once, in one line, never opened
    (not even the USB stick, which the library would otherwise retry for 25 s)."""
    job = JOBS[name]
    other = foreign_device(job)
    seen = run(library, f"path={typed(other)}", job, job_user, traces)
    assert not seen.ok and seen.opened == set() and seen.at_once
    [line] = [line for line in seen.stderr.splitlines() if VARIABLE in line]
    assert line.endswith(f'] Edge TPU {other} is not in {VARIABLE}="{",".join(job)}": not opening it')


def test_the_jobs_own_path_opens(library, job_user, traces):
    """The runner's way (SLURM_TPU_EDGETPU_PATHS): an explicit path the variable lists."""
    job = JOBS["a stick and a card"]
    seen = run(library, f"path=pci:{job[1]}", job, job_user, traces)
    assert seen.opened == {NODES[job[1]]}


@pytest.mark.parametrize("action", ["list", "default", "device=:0", "device=usb", f"path={typed(STICK)}"])
def test_an_empty_list_shows_nothing_and_fails_at_once(library, job_user, traces, action):
    """A job without an Edge TPU on a TPU node: the task prolog exports the variable empty."""
    seen = run(library, action, [], job_user, traces)
    assert seen.listed == [] and seen.opened == set()
    assert seen.ok is (action == "list") and seen.at_once


def test_unset_is_upstream_behaviour_which_fails_the_job(library, job_user, traces):
    """Why the variable exists. Unset, the default device is the first card enumerated
    (readdir order of /sys/class/apex), another job's here: the open is refused (EACCES)
    and the library does not try the next one. The same job with the variable opens its own."""
    everything = run(library, "list", None, job_user, traces).listed
    assert sorted(everything) == sorted(typed(p) for p in NODES)  # unset: every device, as upstream
    first = everything[0].partition(":")[2]
    job = [next(p for p in NODES if p.startswith("/dev/") and p != first)]
    today = run(library, "default", None, job_user, traces)
    assert today.opened == {NODES[first]} and not today.ok
    fixed = run(library, "default", job, job_user, traces)
    assert fixed.opened == {NODES[job[0]]}


def test_index_is_stable_when_another_stick_changes_mode(library, job_user, traces):
    """The job holds both sticks, 2-2 first. The other (2-1.3) is reset and comes back
    awaiting its firmware: upstream lists it first then, so ":0" would move; in the
    variable's order it does not."""
    job = ["/sys/bus/usb/devices/2-2", "/sys/bus/usb/devices/2-1.3"]
    for files in (("usb_stick_after", "usb_second_stick"), ("usb_stick_before", "usb_second_stick")):
        description = traces / ("+".join(files) + ".umockdev")
        description.write_text(merge_umockdev(*(HARDWARE / f"{f}.umockdev" for f in files)))
        listed = run(library, "list", job, job_user, traces, description, nodes={}).listed
        assert listed == [typed(p) for p in job]
