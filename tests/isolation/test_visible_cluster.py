"""EDGETPU_VISIBLE_DEVICES on a real local Slurm cluster: unmodified Coral code in a job uses the job's TPU.

n1 has two Edge TPUs, a USB stick and a PCIe card (hardware/n1_two_tpus.umockdev). A job runs
the pycoral-style call with no device argument (``load_delegate('libedgetpu.so.1')``, what
``make_interpreter(model)`` does) with the REAL libedgetpu, which enumerates n1's devices
from a umockdev testbed of the same description (the job's processes cannot see the
cluster's own simulated nodes through sysfs); strace records which device node it opens.
Upstream, the default device is the PCIe card (PCIe before USB); the job was given the
stick, so that is the one it must open. The variable itself comes the whole real way:
prolog (leases, env file) -> task prolog -> the job's environment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys

import pytest
from support import HARDWARE, one_node_two_tpus

from helpers import REPO, real_libedgetpu

pytestmark = pytest.mark.slurm

NODE = os.path.join(HARDWARE, "n1_two_tpus.umockdev")
PROBE = REPO / "tests" / "libedgetpu" / "visible_probe.py"
OPEN = re.compile(r'open(?:at)?\((?:AT_FDCWD, )?"[^"]*?(/dev/(?:apex_\d+|bus/usb/\d{3}/\d{3}))"')

# The job: what it was given, then the user's code with no device argument, listing and opening.
JOB = """#!/bin/sh
printf '%s' "${{EDGETPU_VISIBLE_DEVICES-(unset)}}" > {out}/{tag}.visible
for action in list default; do
    umockdev-run --device {node} -- strace -f -qq -e trace=open,openat -o {out}/{tag}.$action.trace \\
        {python} {probe} {library} $action > {out}/{tag}.$action.json 2> {out}/{tag}.$action.err
done
"""


@pytest.fixture(scope="module")
def cluster():
    if not shutil.which("strace"):
        pytest.skip("strace is not installed (scripts/setup.sh installs it)")
    yield from one_node_two_tpus()


def run_job(cluster, user: str, tag: str, args: list[str], library: str) -> dict:
    out = os.path.join(cluster.base, "out")
    script = JOB.format(out=out, tag=tag, node=NODE, python=sys.executable, probe=PROBE, library=library)
    job = cluster.sbatch([*args, "-o", os.path.join(out, f"{tag}.log")], script, user=user)
    assert cluster.wait_for_jobs([job], timeout=120)[job] == "COMPLETED"
    seen = {"visible": open(os.path.join(out, f"{tag}.visible"), encoding="utf-8").read()}
    for action in ("list", "default"):
        with open(os.path.join(out, f"{tag}.{action}.json"), encoding="utf-8") as handle:
            seen[action] = json.load(handle)
        with open(os.path.join(out, f"{tag}.{action}.trace"), encoding="utf-8") as handle:
            seen[action]["opened"] = sorted({m.group(1) for m in OPEN.finditer(handle.read())})
    return seen


def test_job_with_one_tpu_gets_its_own_by_default(cluster, users):
    library = real_libedgetpu()
    # The stick: upstream's default device is the card, so only the variable makes this pass.
    seen = run_job(cluster, "stpu_alice", "v1", ["-w", "n1", "--gres=tpu:edgetpu_usb:1"], library)
    assert seen["visible"] == "/sys/bus/usb/devices/2-1.3"
    assert seen["list"]["listed"] == ["usb:/sys/bus/usb/devices/2-1.3"]  # list_edge_tpus(): its own only
    assert seen["default"]["opened"] == ["/dev/bus/usb/002/005"]  # the stick's node, never /dev/apex_0


def test_job_without_tpu_sees_none(cluster, users):
    """No --gres=tpu on a TPU node, and an EDGETPU_VISIBLE_DEVICES brought from the submitting
    shell: the task prolog overwrites it with an empty list."""
    library = real_libedgetpu()
    seen = run_job(cluster, "stpu_bob", "v2", ["-w", "n1", "--export=ALL,EDGETPU_VISIBLE_DEVICES=/dev/apex_0"], library)
    assert seen["visible"] == ""
    assert seen["list"]["listed"] == [] and seen["list"]["opened"] == []
    assert seen["default"]["ok"] is False and seen["default"]["opened"] == []
