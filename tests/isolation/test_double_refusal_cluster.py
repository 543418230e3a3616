"""The kernel refuses a job another job's Edge TPU: unmodified Coral code meets it through libedgetpu.

n1 has a USB stick and a PCIe card (hardware/n1_two_tpus.umockdev). Alice's job holds the
card; Bob's job was given the stick. Bob runs what users run, unmodified: pycoral's
``make_interpreter(model)`` (``load_delegate('libedgetpu.so.1')``, no device), an explicit
device path, and the runner with ``--device``, against the libedgetpu test double built as
Coral's own library (``-DEDGETPU_DOUBLE_IGNORES_VISIBLE``: it lists every TPU of the node, so
its default device is the first PCIe one, Alice's card). The double opens the device node as
the real library does, so what stops Bob is the hooks' chown of Alice's card to her (0600):
the open fails with EACCES, the library returns NULL with its one stderr line, and the
double's log says so. His own stick opens (a simulated USB node passes the permission check
and finds no driver: ENXIO, which the double counts as opened), and the node's patched
library (which honours EDGETPU_VISIBLE_DEVICES) gives his default call the stick.
"""

from __future__ import annotations

import os
import sys

import pytest
from support import PCI, inventory, one_node_two_tpus, out, owner, wait_until

from helpers import REPO, double_root

pytestmark = pytest.mark.slurm

STICK = "/sys/bus/usb/devices/2-1.3"
PROBE = REPO / "tests" / "libedgetpu" / "visible_probe.py"
# pycoral's make_interpreter(model) with no device: tflite's load_delegate('libedgetpu.so.1').
CORAL = "from ai_edge_litert.interpreter import load_delegate; load_delegate('libedgetpu.so.1')"

# Each action: its stdout, stderr, exit status and the double's log, in {out}/{tag}.<action>.*
RUN = """run() {{
    action=$1; shift
    EDGETPU_DOUBLE_LOG={out}/{tag}.$action.log "$@" > {out}/{tag}.$action.out 2> {out}/{tag}.$action.err
    echo $? > {out}/{tag}.$action.rc
}}
export EDGETPU_DOUBLE_DEVICES=pci:{card},usb:{stick} EDGETPU_DOUBLE_ROOT={root}
"""

# Alice's job: her card, opened by default (it is the first PCIe TPU), then held until told to stop.
HOLDER = (
    "#!/bin/sh\n"
    + RUN
    + """run default {python} {probe} {coral}/libedgetpu.so.1 default
touch {out}/{tag}.started
i=0
while [ ! -e {out}/{tag}.stop ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done
"""
)

# Bob's job: the stick is his; the card is Alice's.
OTHER = (
    "#!/bin/sh\n"
    + RUN
    + """run coral env LD_LIBRARY_PATH={coral} {python} -c "{coral_code}"
run default {python} {probe} {coral}/libedgetpu.so.1 default
run card {python} {probe} {coral}/libedgetpu.so.1 path=pci:{card}
run own {python} {probe} {coral}/libedgetpu.so.1 path=usb:{stick}
run own_usb {python} {probe} {coral}/libedgetpu.so.1 device=usb
run patched {python} {probe} {patched}/libedgetpu.so.1 default
run runner env SLURM_TPU_LIBEDGETPU={coral}/libedgetpu.so.1 \\
    {python} -m slurm_tpu.cli infer {model} {image} --device pci:{card}
"""
)


@pytest.fixture(scope="module")
def setup():
    from edgetpu_double.build import build_double
    from harness.modelgen import write_models

    for cluster in one_node_two_tpus():
        libraries = {}
        for name, ignores in (("coral", True), ("patched", False)):
            directory = os.path.join(cluster.base, name)
            os.makedirs(directory, mode=0o755)
            try:
                build_double(directory, ignores_visible=ignores)
            except RuntimeError as exc:
                pytest.skip(str(exc))
            libraries[name] = directory
        models = write_models(os.path.join(cluster.base, "models"), image_count=1)
        yield cluster, libraries, models


def read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def outcome(cluster, tag: str, action: str) -> dict:
    """What one action of a job left: exit status, stdout, stderr lines, the double's log lines."""
    log = out(cluster, f"{tag}.{action}.log")
    return {
        "rc": int(read(out(cluster, f"{tag}.{action}.rc"))),
        "out": read(out(cluster, f"{tag}.{action}.out")),
        "err": read(out(cluster, f"{tag}.{action}.err")).splitlines(),
        "log": [line.split(" pid=")[0] + _after_pid(line) for line in read(log).splitlines()]
        if os.path.exists(log)
        else [],
    }


def _after_pid(line: str) -> str:
    """A log line's fields after pid=<n> (node=, errno=), so lines compare without the pid."""
    rest = line.split(" pid=", 1)[1].split(" ", 1)
    return " " + rest[1] if len(rest) > 1 else ""


def test_another_jobs_tpu_is_refused_by_the_kernel_and_the_own_one_opens(setup, users):
    cluster, libraries, models = setup
    card = inventory(cluster, "n1")[PCI][0]
    fields = {
        "out": os.path.join(cluster.base, "out"),
        "card": card,
        "stick": STICK,
        "root": double_root(cluster),
        "python": sys.executable,
        "probe": PROBE,
        "coral": libraries["coral"],
        "patched": libraries["patched"],
    }
    alice = cluster.sbatch(
        ["-w", "n1", "--gres=tpu:edgetpu_pci:1", "-o", "/dev/null", "-e", out(cluster, "alice.job.err")],
        HOLDER.format(tag="alice", **fields),
        user="stpu_alice",
    )
    try:
        wait_until(
            lambda: (
                os.path.exists(out(cluster, "alice.started"))
                or cluster.job_state(alice) not in ("PENDING", "RUNNING", "CONFIGURING", "")
            ),
            120,
            f"Alice's job {alice} to start",
        )
        assert os.path.exists(out(cluster, "alice.started")), read(out(cluster, "alice.job.err"))
        # Alice's own card: her default device, opened.
        mine = outcome(cluster, "alice", "default")
        assert mine["rc"] == 0 and '"ok": true' in mine["out"], mine
        assert mine["log"][0] == f"create type=pci path={card} options=-"  # then destroy, at exit
        assert owner(card) == (users["stpu_alice"], 0, 0o600)  # hers while her job runs

        bob = cluster.sbatch(
            ["-w", "n1", "--gres=tpu:edgetpu_usb:1", "-o", "/dev/null", "-e", out(cluster, "bob.job.err")],
            OTHER.format(
                tag="bob",
                coral_code=CORAL,
                model=models["classifier"],
                image=models["images"] / "img_00000.png",
                **fields,
            ),
            user="stpu_bob",
        )
        assert cluster.wait_for_jobs([bob], timeout=240)[bob] == "COMPLETED", read(out(cluster, "bob.job.err"))
    finally:
        open(out(cluster, "alice.stop"), "w").close()
    assert cluster.wait_for_jobs([alice], timeout=60)[alice] == "COMPLETED"

    refused = f"open-failed type=pci path={card} options=- node={card} errno=EACCES"
    line = (
        f"E edgetpu_double.c] Failed to open device [Apex (PCIe)] at [{card}]: "
        "Failed precondition: Device open failed : -1 (Permission denied)"
    )
    # pycoral's make_interpreter(model): Coral's library opens the first PCIe TPU, Alice's card.
    coral = outcome(cluster, "bob", "coral")
    assert coral["rc"] == 1
    assert line in coral["err"] and "ValueError: Failed to load delegate from libedgetpu.so.1" in coral["err"]
    assert coral["log"] == [refused]
    default = outcome(cluster, "bob", "default")
    assert default["rc"] == 0 and '"ok": false' in default["out"]
    assert [e for e in default["err"] if "edgetpu_double.c]" in e] == [line]
    assert default["log"] == [refused]
    # The card named by its path (edgetpu_create_delegate).
    named = outcome(cluster, "bob", "card")
    assert named["rc"] == 0 and '"ok": false' in named["out"]
    assert named["err"] == [line] and named["log"] == [refused]
    # The runner, told to use the card: its one-line error carries libedgetpu's reason.
    runner = outcome(cluster, "bob", "runner")
    assert runner["rc"] != 0 and len(runner["err"]) == 1, runner
    assert runner["err"][0].startswith("slurm-tpu: error: libedgetpu cannot open Edge TPU ")
    assert "libedgetpu says: Failed precondition: Device open failed : -1 (Permission denied)" in runner["err"][0]
    assert runner["log"] == [refused]

    # His own stick: by path, by type, and the patched library's default.
    own = outcome(cluster, "bob", "own")
    assert own["rc"] == 0 and '"ok": true' in own["out"] and own["err"] == []
    assert own["log"] == [f"create type=usb path={STICK} options=-"]
    own_usb = outcome(cluster, "bob", "own_usb")
    assert own_usb["rc"] == 0 and '"ok": true' in own_usb["out"]
    assert own_usb["log"][0] == f"create type=usb path={STICK} options=device=usb"
    patched = outcome(cluster, "bob", "patched")
    assert patched["rc"] == 0 and '"ok": true' in patched["out"]
    assert patched["log"][0] == f"create type=usb path={STICK} options=-"
