"""IDX -> device on a real cluster whose slurm.conf lists the TPU types in another
order than gres.conf (Slurm numbers by slurm.conf's Gres= type order first)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import pytest
from support import HARDWARE, REPO, inventory, owner, require_root_and_slurm, wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def cluster():
    require_root_and_slurm()
    from harness.localcluster.cluster import Hooks, LocalCluster, NodeSpec
    from helpers import first_job_id

    base = tempfile.mkdtemp(prefix="slurm-tpu-idx-", dir="/tmp")
    os.chmod(base, 0o755)
    os.makedirs(os.path.join(base, "out"), mode=0o1777)
    os.chmod(os.path.join(base, "out"), 0o1777)
    started = LocalCluster(
        base=base,
        nodes=[NodeSpec("n1", os.path.join(HARDWARE, "n1_two_tpus.umockdev"))],
        hooks=Hooks(
            prolog=os.path.join(REPO, "prolog", "slurm-tpu-prolog"),
            epilog=os.path.join(REPO, "epilog", "slurm-tpu-epilog"),
            task_prolog=os.path.join(REPO, "prolog", "slurm-tpu-task-prolog"),
        ),
        first_job_id=first_job_id(),
    )
    started.configure()
    nodes_conf = started.path("etc", "nodes.conf")
    with open(nodes_conf, encoding="utf-8") as handle:
        text = handle.read()
    # node-conf wrote usb first (inventory order), as gres.conf does; swap the types in Gres=.
    swapped = re.sub(r"Gres=tpu:edgetpu_usb:1,tpu:edgetpu_pci:1", "Gres=tpu:edgetpu_pci:1,tpu:edgetpu_usb:1", text)
    assert swapped != text
    with open(nodes_conf, "w", encoding="utf-8") as handle:
        handle.write(swapped)
    try:
        started.start()
        yield started
    finally:
        started.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_typed_request_gets_the_device_of_that_type_despite_reordered_types(cluster, users):
    out = os.path.join(cluster.base, "out")
    # Each job runs until the test lets it go: the checks below need the USB job still running.
    script = (
        f"#!/bin/sh\necho $SLURM_TPU_DEVICES > {out}/$SLURM_JOB_ID.dev\n"
        f"i=0; while [ ! -e {out}/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n"
    )
    usb_job = cluster.sbatch(["--gres=tpu:edgetpu_usb:1", "-o", "/dev/null"], script, user="stpu_alice")
    wait_until(lambda: os.path.exists(f"{out}/{usb_job}.dev"), 60, "the usb job to start")
    detail = cluster.command(["scontrol", "show", "job", "-d", str(usb_job)]).stdout
    assert "GRES=tpu:edgetpu_usb:1(IDX:1)" in detail  # pci is IDX 0 now, although gres.conf lists usb first
    assert owner(inventory(cluster, "n1")["usb-2-1.3"][0])[0] == users["stpu_alice"]
    assert owner(inventory(cluster, "n1")["pci-0000:03:00.0"][0])[0] == 0
    pci_job = cluster.sbatch(["--gres=tpu:edgetpu_pci:1", "-o", "/dev/null"], script, user="stpu_bob")
    open(f"{out}/go", "w").close()
    assert cluster.wait_for_jobs([usb_job, pci_job], timeout=60) == {usb_job: "COMPLETED", pci_job: "COMPLETED"}
    with open(f"{out}/{usb_job}.dev", encoding="utf-8") as handle:
        assert handle.read().strip() == "usb-2-1.3"
    with open(f"{out}/{pci_job}.dev", encoding="utf-8") as handle:
        assert handle.read().strip() == "pci-0000:03:00.0"
