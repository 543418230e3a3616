"""``srun --container-image`` (Pyxis + enroot) on a real local Slurm cluster keeps the job's Edge TPU.

Two nodes, n1 and n2, each with one USB Edge TPU (isolation/hardware/n4_one_tpu.umockdev);
enroot and Pyxis built from ../shared/containers (scripts/build-containers.sh), Pyxis for the
Slurm release the cluster runs (Debian's 22.05, or 25.11 with SLURM_TPU_TEST_SLURM); the image
is the suite's offline one (harness/containers/image.py: bookworm + LiteRT, no libedgetpu). The
only fake is the silicon: each node's libedgetpu is the test double (tests/edgetpu_double), which
enumerates the node's simulated sysfs and opens the stick's usbfs node as the real library does,
so the kernel's permissions decide. slurm-tpu's enroot hook (enroot/98-slurm-tpu.sh, rendered
per node as ``slurm-tpu install`` renders it) must bring the node's /dev/bus/usb and libedgetpu
into the container, whose /dev is enroot's restricted one, and the job's variables.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from pyxis_support import HARDWARE, finish, image, require_pyxis, srun_probe, start_cluster

from helpers import REPO, wait_until

pytestmark = pytest.mark.slurm

NODE = str(HARDWARE / "n4_one_tpu.umockdev")
STICK = "usb:/sys/bus/usb/devices/2-1.3"  # the stick of n4_one_tpu.umockdev, on each node
LIBRARY_IN_IMAGE = "/usr/lib/x86_64-linux-gnu/libedgetpu.so.1"  # Coral's Debian package's path


@pytest.fixture(scope="module")
def cluster(users):
    from harness.localcluster.cluster import NodeSpec

    require_pyxis(os.environ.get("SLURM_TPU_TEST_SLURM"))
    started = start_cluster([NodeSpec("n1", NODE), NodeSpec("n2", NODE)])
    try:
        yield started
    finally:
        finish(started)


@pytest.fixture(scope="module")
def sqsh():
    return image()


def stick(cluster, node: str) -> tuple[str, int]:
    """The node's stick's usbfs node now (``/dev/bus/usb/BBB/DDD`` as a container sees it) and its
    numbers. The devnum changes whenever the emulated USB core re-enumerates it (a job's end
    revokes its handles so), so the tests look it up rather than assume one."""
    top = os.path.join(cluster.node_dir(node), "dev")
    [path] = glob.glob(os.path.join(top, "bus", "usb", "*", "*"))
    return "/dev" + path[len(top) :], os.stat(path).st_rdev


def double_log(cluster, tag: str) -> list[str]:
    try:
        with open(cluster.path("out", f"{tag}.double.log"), encoding="utf-8") as handle:
            return handle.read().splitlines()
    except FileNotFoundError:
        return []


def test_container_job_runs_on_its_tpu_with_the_nodes_libedgetpu(cluster, sqsh, users):
    done, [seen] = srun_probe(cluster, "stpu_alice", "own", ["-w", "n1", "--gres=tpu:1"], sqsh, STICK)
    assert done.returncode == 0, done.stderr
    assert seen["uid"] == users["stpu_alice"]  # rootless: the container runs as the job's user
    assert seen["EDGETPU_VISIBLE_DEVICES"] == "/sys/bus/usb/devices/2-1.3"
    assert seen["SLURM_TPU_DEVICES"] == "usb-2-1.3"
    assert seen["library"] == LIBRARY_IN_IMAGE  # the image has none: the node's, bound by the hook
    assert seen["nodes"] == [stick(cluster, "n1")[0]]  # enroot's restricted /dev + the hook's bind
    assert seen["listed"] == [STICK]
    assert seen["default_ok"] is True  # load_delegate('libedgetpu.so.1'): the job's stick, opened
    [created] = [line for line in double_log(cluster, "own") if line.startswith("create ")]
    assert "path=/sys/bus/usb/devices/2-1.3" in created


def test_container_without_tpu_sees_none_whatever_its_shell_says(cluster, sqsh, users):
    """No --gres=tpu, and the submitting shell's EDGETPU_VISIBLE_DEVICES / SLURM_TPU_DEVICES: the
    hook writes the job's (none) over them, and binds no device."""
    done, [seen] = srun_probe(
        cluster,
        "stpu_bob",
        "none",
        ["-w", "n1"],
        sqsh,
        STICK,
        env=("EDGETPU_VISIBLE_DEVICES=/sys/bus/usb/devices/2-1.3", "SLURM_TPU_DEVICES=usb-2-1.3"),
    )
    assert done.returncode == 0, done.stderr
    assert seen["EDGETPU_VISIBLE_DEVICES"] == "" and not seen["SLURM_TPU_DEVICES"]
    assert seen["nodes"] == [] and seen["library"] == LIBRARY_IN_IMAGE  # the node's library, no device
    assert seen["listed"] == [] and seen["default_ok"] is False


def test_another_users_container_cannot_open_the_tpu_even_when_it_mounts_it(cluster, sqsh, users):
    """alice's job holds n1's stick; bob's container on n1 names it (his command sets
    EDGETPU_VISIBLE_DEVICES itself, after the hook and the TaskProlog) and bind-mounts the node's
    /dev/bus/usb himself: the open still fails,
    because the node is alice's (the Prolog chowned it) and the container runs as bob."""
    holder = cluster.sbatch(
        ["-w", "n1", "--gres=tpu:1", "-o", "/dev/null"], "#!/bin/sh\nsleep 120\n", user="stpu_alice"
    )
    try:

        def alices() -> bool:
            path = os.path.join(cluster.node_dir("n1"), stick(cluster, "n1")[0][1:])
            return os.stat(path).st_uid == users["stpu_alice"] and stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0

        wait_until(alices, 60, "the prolog giving alice n1's stick, hers alone")
        usb = os.path.join(cluster.node_dir("n1"), "dev", "bus", "usb")
        done, [seen] = srun_probe(
            cluster,
            "stpu_bob",
            "steal",
            [
                "-w",
                "n1",
                f"--container-mounts={cluster.path('out')}:{cluster.path('out')},{usb}:/dev/bus/usb",
            ],
            sqsh,
            STICK,
            prefix=("env", "EDGETPU_VISIBLE_DEVICES=/sys/bus/usb/devices/2-1.3"),
        )
        assert done.returncode == 0, done.stderr
        assert seen["EDGETPU_VISIBLE_DEVICES"] == "/sys/bus/usb/devices/2-1.3"  # what bob insisted on
        assert seen["nodes"] == [stick(cluster, "n1")[0]]  # what he mounted: visible...
        assert seen["default_ok"] is False  # ...and not his to open
        assert any("errno=EACCES" in line for line in double_log(cluster, "steal"))
    finally:
        cluster.command(["scancel", str(holder)], check=False)
        cluster.wait_for_jobs([holder], timeout=120)


def test_two_node_step_each_container_on_its_own_nodes_tpu(cluster, sqsh, users):
    """jobs/containers_across_nodes.sbatch: one task per node, each in its container on that node's
    stick; the audit log of each node (slurm-tpu's record of who held what) names this job."""
    out = cluster.path("out")
    sticks = {node: stick(cluster, node) for node in ("n1", "n2")}  # before the job; its end re-enumerates
    env = ",".join(
        [
            "ALL",
            "EDGETPU_DOUBLE_ROOT=/opt/stpu-double",
            f"EDGETPU_DOUBLE_DEVICES={STICK}",
            f"EDGETPU_DOUBLE_LOG={out}/pair.double.log",
            f"PYXIS_CONTAINER_MOUNTS={out}:{out}",
        ]
    )
    script = str(REPO / "jobs" / "containers_across_nodes.sbatch")
    probe = str(REPO / "tests" / "containers" / "pyxis_probe.py")
    submitted = cluster.command(
        [
            "sbatch",
            "--parsable",
            "--chdir=/tmp",
            f"--export={env}",
            "-o",
            f"{out}/pair.out",
            script,
            sqsh,
            "python3",
            probe,
        ],
        user="stpu_alice",
    )
    job = int(submitted.stdout.strip().split(";")[0])
    assert cluster.wait_for_jobs([job], timeout=300)[job] == "COMPLETED", open(f"{out}/pair.out").read()
    tasks = {}
    for line in open(f"{out}/pair.out", encoding="utf-8"):
        rank, _, rest = line.partition(": ")
        if rest.startswith("{"):
            tasks[int(rank)] = json.loads(rest)
    assert sorted(tasks) == [0, 1]
    assert sorted(seen["node"] for seen in tasks.values()) == ["n1", "n2"]
    for seen in tasks.values():
        assert seen["listed"] == [STICK] and seen["default_ok"] is True
        # The container's stick is its own node's (each node's simulated node has its own minor).
        path, own = sticks[seen["node"]]
        assert seen["rdev"] == {path: [os.major(own), os.minor(own)]}
    # Slurm's own record: the job ran on both nodes with one TPU per node...
    shown = cluster.command(["scontrol", "-d", "show", "job", str(job)]).stdout
    fields = dict(part.split("=", 1) for part in shown.split() if "=" in part)
    assert fields["NodeList"] == "n[1-2]" and fields["TresPerNode"] in ("gres:tpu:1", "gres/tpu:1"), (
        shown
    )  # 22.05, 25.11
    # ...and each node's audit log: its own stick leased to this job, the node each container opened.
    for node in ("n1", "n2"):
        with open(os.path.join(cluster.state_dir(node), "audit.log"), encoding="utf-8") as handle:
            events = [json.loads(line) for line in handle]
        [acquired] = [e for e in events if e["event"] == "acquire" and e["job_id"] == job]
        assert acquired["identity"] == "usb-2-1.3" and acquired["uid"] == users["stpu_alice"]
        assert acquired["nodes"] == [os.path.join(cluster.node_dir(node), sticks[node][0][1:])]
    created = [line for line in double_log(cluster, "pair") if line.startswith("create ")]
    assert len(created) == 2


@pytest.fixture(scope="module")
def two_tpu_node(users):
    """One node with a USB stick and a PCIe card (the emulated apex driver's node)."""
    from harness.localcluster.cluster import NodeSpec

    require_pyxis(os.environ.get("SLURM_TPU_TEST_SLURM"))
    started = start_cluster([NodeSpec("n1", str(HARDWARE / "n1_two_tpus.umockdev"))])
    try:
        yield started
    finally:
        finish(started)


def test_each_container_sees_its_own_jobs_device_and_no_other(two_tpu_node, sqsh, users):
    """The stick's job and the card's job on one node: enroot's restricted /dev plus the hook's
    binds, so each container has its job's node (the card: /dev/apex_0, the host's very node) and
    not the other job's; both run the node's libedgetpu."""
    cluster = two_tpu_node
    devices = f"pci:/dev/apex_0,{STICK}"
    done, [card] = srun_probe(cluster, "stpu_alice", "card", ["-w", "n1", "--gres=tpu:edgetpu_pci:1"], sqsh, devices)
    assert done.returncode == 0, done.stderr
    host = os.stat(os.path.join(cluster.node_dir("n1"), "dev", "apex_0")).st_rdev
    assert card["SLURM_TPU_DEVICES"] == "pci-0000:03:00.0"
    assert card["rdev"] == {"/dev/apex_0": [os.major(host), os.minor(host)]}  # no /dev/bus/usb at all
    assert card["library"] == LIBRARY_IN_IMAGE
    done, [usb] = srun_probe(cluster, "stpu_bob", "stick", ["-w", "n1", "--gres=tpu:edgetpu_usb:1"], sqsh, devices)
    assert done.returncode == 0, done.stderr
    assert usb["SLURM_TPU_DEVICES"] == "usb-2-1.3"
    assert usb["nodes"] == [stick(cluster, "n1")[0]]  # no /dev/apex_0
    assert usb["listed"] == [STICK] and usb["default_ok"] is True  # the card is listed to no one but its job


def runner_path(cluster) -> str:
    """PYTHONPATH for the runner's API in a container: the checkout (mounted at its own path) and the
    two pure-Python packages it reads a model's schema with (tflite, flatbuffers), which the image
    lacks, copied from this venv beside the cluster."""
    import tflite

    pylib = cluster.path("pylib")
    if not os.path.isdir(pylib):
        site = os.path.dirname(os.path.dirname(tflite.__file__))
        for name in ("tflite", "flatbuffers"):
            shutil.copytree(os.path.join(site, name), os.path.join(pylib, name))
    return f"{REPO}:{pylib}"


def test_runners_sharded_batch_across_two_containers(cluster, sqsh, users):
    """The multi-worker seed: jobs/containers_across_nodes.sbatch runs tests/containers/pyxis_batch.py
    (the runner's API, step-sharded by SLURM_PROCID as `slurm-tpu infer` is) in a container per
    node: each task opens its own node's stick through the node's libedgetpu, the two shares are
    disjoint and cover the batch, and each node's audit log holds the job's lease."""
    from harness.modelgen import write_models

    out = cluster.path("out")
    models = write_models(Path(cluster.path("models")), image_count=8)
    command = [
        "env",
        f"PYTHONPATH={runner_path(cluster)}",
        "EDGETPU_DOUBLE_ROOT=/opt/stpu-double",
        f"EDGETPU_DOUBLE_DEVICES={STICK}",
        f"EDGETPU_DOUBLE_LOG={out}/batch.double.log",
        "python3",
        str(REPO / "tests" / "containers" / "pyxis_batch.py"),
        str(models["classifier"]),
        str(models["classifier_labels"]),
        str(models["images"]),
        out,
    ]
    script = str(REPO / "jobs" / "containers_across_nodes.sbatch")
    submitted = cluster.command(
        ["sbatch", "--parsable", "--chdir=/tmp", f"--export=ALL,PYXIS_CONTAINER_MOUNTS={out}:{out}"]
        + ["-o", f"{out}/batch.out", script, sqsh, *command],
        user="stpu_alice",
    )
    job = int(submitted.stdout.strip().split(";")[0])
    assert cluster.wait_for_jobs([job], timeout=300)[job] == "COMPLETED", open(f"{out}/batch.out").read()
    tasks = {}
    for line in open(f"{out}/batch.out", encoding="utf-8"):
        rank, _, rest = line.partition(": ")
        if rest.startswith("{"):
            tasks[int(rank)] = json.loads(rest)
    assert sorted(seen["node"] for seen in tasks.values()) == ["n1", "n2"]
    shares = [set(seen["inputs"]) for seen in tasks.values()]
    assert not shares[0] & shares[1] and len(shares[0] | shares[1]) == 8  # disjoint, the whole batch
    for rank, seen in tasks.items():
        assert seen["devices"] == ["edgetpu usb-2-1.3"] and seen["processed"] == len(seen["inputs"])
        with open(os.path.join(out, f"part-{rank}.jsonl"), encoding="utf-8") as handle:
            assert len(handle.read().splitlines()) == len(seen["inputs"])
    created = [line for line in double_log(cluster, "batch") if line.startswith("create ")]
    assert len(created) == 2 and all("path=/sys/bus/usb/devices/2-1.3" in line for line in created)
    for node in ("n1", "n2"):
        with open(os.path.join(cluster.state_dir(node), "audit.log"), encoding="utf-8") as handle:
            leased = [json.loads(line) for line in handle]
        assert [e["identity"] for e in leased if e["event"] == "acquire" and e["job_id"] == job] == ["usb-2-1.3"]


def test_a_slurmd_started_again_from_another_process_keeps_its_enroot(cluster, sqsh, users):
    """`python -m harness.localcluster stop-slurmd/start-slurmd` (LocalCluster.load: the saved
    cluster.json) starts the node's slurmd with its enroot wrapper on PATH again."""
    import subprocess
    import sys

    for command in ("stop-slurmd", "start-slurmd"):
        subprocess.run(
            [sys.executable, "-m", "harness.localcluster", command, cluster.base, "n2"],
            cwd=REPO,
            check=True,
            capture_output=True,
            timeout=60,
        )
    wait_until(lambda: cluster.node_states().get("n2", "").split("+")[0] == "IDLE", 60, "n2 back")
    done, [seen] = srun_probe(cluster, "stpu_bob", "again", ["-w", "n2", "--gres=tpu:1"], sqsh, STICK)
    assert done.returncode == 0, done.stderr
    assert seen["node"] == "n2" and seen["listed"] == [STICK] and seen["default_ok"] is True
