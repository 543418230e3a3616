"""Accounting end to end: a job's real `slurm-tpu infer` on its leased TPU shows up in `report`.

runner (job user) -> usage record in the job's usage box -> epilog (root) -> audit log
-> `slurm-tpu report` and `slurm-tpu metrics`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import TESTS, double_root, repo_hooks, runner_job_workspace

pytestmark = pytest.mark.slurm
USER = "stpu_carol"


@pytest.fixture(scope="module")
def setup(cluster_factory):
    from harness.localcluster import NodeSpec

    with runner_job_workspace("slurm-tpu-usage-", USER, image_count=3) as (_, models, double):
        cluster = cluster_factory(
            [NodeSpec("n1", str(TESTS / "isolation" / "hardware" / "n4_one_tpu.umockdev"))], hooks=repo_hooks()
        )
        yield cluster, models, double


def test_inferences_of_a_job_reach_report_and_metrics(setup):
    cluster, models, double = setup
    script = f"""#!/bin/sh
export SLURM_TPU_LIBEDGETPU={double} EDGETPU_DOUBLE_DEVICES=usb:/sys/bus/usb/devices/2-1.3
export EDGETPU_DOUBLE_ROOT={double_root(cluster)}
exec {sys.executable} -m slurm_tpu.cli infer {models["classifier"]} {models["images"]}/img_00001.png -c 12
"""
    out_dir = os.path.join(cluster.base, "out")
    os.makedirs(out_dir, exist_ok=True)
    os.chmod(out_dir, 0o1777)  # the job's user writes its stderr here
    err = os.path.join(out_dir, "job.err")
    job = cluster.sbatch(["--gres=tpu:1", "-o", "/dev/null", "-e", err], script, user=USER)
    assert cluster.wait_for_jobs([job], timeout=90)[job] == "COMPLETED", open(err).read()
    env = dict(os.environ, SLURM_TPU_CONFIG=cluster.node_config("n1"))
    report = subprocess.run(
        [sys.executable, "-m", "slurm_tpu.cli", "report", "--by", "job", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr
    row = json.loads(report.stdout)[str(job)]
    assert row["inferences"] == 12 and row["leases"] == 1 and row["mean_latency_ms"] > 0
    by_user = json.loads(
        subprocess.run(
            [sys.executable, "-m", "slurm_tpu.cli", "report", "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        ).stdout
    )
    assert by_user[USER]["inferences"] == 12
    metrics = subprocess.run(
        [sys.executable, "-m", "slurm_tpu.cli", "metrics"], capture_output=True, text=True, env=env, timeout=60
    ).stdout
    from prometheus_client.parser import text_string_to_metric_families

    [total] = [
        s
        for f in text_string_to_metric_families(metrics)
        for s in f.samples
        if s.name == "slurm_tpu_device_inferences_total"
    ]
    assert total.labels == {"node": "n1", "identity": "usb-2-1.3"} and total.value == 12
