"""Job-labelled metrics on a real cluster, with real users and a hostile job.

While stpu_alice's job holds the PCIe Edge TPU, the device's state series carry
``hpc_job`` (her job id) and ``hpc_user`` (stpu_alice), and her job has its own
inference counters from its usage record and its energy so far on the device (the
power model with her own busy time: self-reported); once the job has ended, no series
carries a job, and its energy is in the device's lifetime counter. stpu_bob's job,
holding the USB stick, does what it can to reach the output: quotes, newlines and
exposition syntax in its name and comment, a forged usage record. Every scrape is
parsed with prometheus_client's own parser; the stdout and textfile modes must say
the same.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import PCI, USB, audit, one_node_two_tpus, out, wait_until

ALICE, BOB = "stpu_alice", "stpu_bob"
HOSTILE = 'x"} 1\nslurm_tpu_device_leased{identity="evil",hpc_job="1'
# Waits until the test lets it go, after writing its usage record (job side, the runner's writer).
HOLD = """#!/bin/sh
{python} -c 'import os; from slurm_tpu.protocol.usage import add_usage
assert add_usage(os.environ["SLURM_TPU_USAGE_DIR"], "{identity}", 42, 0.5)'
touch {ready}
while [ ! -e {release} ]; do sleep 0.2; done
"""
FORGE = """#!/bin/sh
printf '%s' '{{"version": 1, "inferences": 1e400, "seconds": "\\"}} 9", "x": "{{hpc_job=\\"1\\"}}"}}' \
    > "$SLURM_TPU_USAGE_DIR/{identity}.json"
touch {ready}
while [ ! -e {release} ]; do sleep 0.2; done
"""


@pytest.fixture(scope="module")
def cluster(users):
    yield from one_node_two_tpus()


def scrape(cluster, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SLURM_TPU_CONFIG": cluster.node_config("n1")}
    return subprocess.run(
        [sys.executable, "-m", "slurm_tpu.cli", "metrics", "--node", "n1", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def series(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def of(found, name: str, identity: str) -> tuple[dict[str, str], float]:
    [hit] = [(labels, value) for n, labels, value in found if n == name and labels.get("identity") == identity]
    return hit


def test_device_series_carry_the_holding_job_and_user_until_it_ends(cluster, tmp_path):
    ready = {who: out(cluster, f"{who}.ready") for who in (ALICE, BOB)}
    release = out(cluster, "release")
    alice = cluster.sbatch(
        ["--gres=tpu:edgetpu_pci:1", "-o", out(cluster, "alice.out")],
        HOLD.format(python=sys.executable, identity=PCI, ready=ready[ALICE], release=release),
        user=ALICE,
    )
    bob = cluster.sbatch(
        ["--gres=tpu:edgetpu_usb:1", "-o", out(cluster, "bob.out"), f"--job-name={HOSTILE}", f"--comment={HOSTILE}"],
        FORGE.format(identity=USB, ready=ready[BOB], release=release),
        user=BOB,
    )
    try:
        wait_until(lambda: all(os.path.exists(path) for path in ready.values()), 120, "both jobs to hold their TPU")
        shown = cluster.command(["scontrol", "-o", "show", "job", str(bob)]).stdout
        assert 'identity="evil"' in shown  # Slurm took the hostile name and comment as they are
        during = scrape(cluster)
        assert during.returncode == 0, during.stderr
        textfile = tmp_path / "slurm_tpu.prom"
        written = scrape(cluster, "--textfile", str(textfile))
        assert written.returncode == 0 and written.stdout == "", written.stderr
        from_file = textfile.read_text()
    finally:
        with open(release, "w"):
            pass
    found = series(during.stdout)

    # Textfile mode: the same series and figures (lease seconds and running jobs' energy grow between the scrapes).
    growing = ("slurm_tpu_device_lease_seconds_total", "slurm_tpu_job_energy_joules_total")

    def steady(found):
        return [(n, labels, None if n in growing else v) for n, labels, v in found]

    assert steady(found) == steady(series(from_file))
    for name in ("slurm_tpu_device_present", "slurm_tpu_device_healthy", "slurm_tpu_device_leased"):
        labels, _ = of(found, name, PCI)
        assert (labels["hpc_job"], labels["hpc_user"]) == (str(alice), ALICE)
        labels, _ = of(found, name, USB)
        assert (labels["hpc_job"], labels["hpc_user"]) == (str(bob), BOB)
    assert of(found, "slurm_tpu_device_leased", PCI)[1] == 1
    # Her job's own counters, from its usage record; bob's forged record is refused: no series.
    usage_series = [(n, labels, v) for n, labels, v in found if n.startswith("slurm_tpu_job_inference")]
    assert sorted((n, v) for n, _, v in usage_series) == [
        ("slurm_tpu_job_inference_seconds_total", 0.5),
        ("slurm_tpu_job_inferences_total", 42),
    ]
    assert all(
        labels == {"node": "n1", "identity": PCI, "hpc_job": str(alice), "hpc_user": ALICE}
        for _, labels, _ in usage_series
    )
    # Each job's energy so far on the TPU it holds (its Prolog's start file, computed as its Epilog will):
    # hers with the busy time her job reported, his idle power only (his forged record gives none).
    energy = {labels["identity"]: (labels, v) for n, labels, v in found if n == "slurm_tpu_job_energy_joules_total"}
    assert energy[PCI][0] == {
        "node": "n1",
        "identity": PCI,
        "hpc_job": str(alice),
        "hpc_user": ALICE,
        "method": "self-reported",
    }
    assert (energy[USB][0]["hpc_job"], energy[USB][0]["hpc_user"], energy[USB][0]["method"]) == (
        str(bob),
        BOB,
        "estimated",
    )
    assert energy.keys() == {PCI, USB} and all(v > 0 for _, v in energy.values())
    assert {n for n, _, _ in found if n.startswith("slurm_tpu_job_")} == {
        "slurm_tpu_job_inference_seconds_total",
        "slurm_tpu_job_inferences_total",
        "slurm_tpu_job_energy_joules_total",
    }
    # Lifetime counters stay per device, without the job.
    assert "hpc_job" not in of(found, "slurm_tpu_device_inferences_total", PCI)[0]
    # Nothing bob chose reached the output: no label name or value but ours, no "evil" series.
    assert {key for _, labels, _ in found for key in labels} <= {
        "node",
        "identity",
        "kind",
        "model",
        "hpc_job",
        "hpc_user",
        "method",
        "version",
    }
    assert "evil" not in during.stdout and "evil" not in from_file
    assert {labels["hpc_job"] for _, labels, _ in found if "hpc_job" in labels} == {str(alice), str(bob)}

    assert cluster.wait_for_jobs([alice, bob], 180) == {alice: "COMPLETED", bob: "COMPLETED"}
    # The Epilog's energy events come after the release, once it has taken the job's start file.
    wait_until(
        lambda: {e.get("job_id") for e in audit(cluster, "n1") if e["event"] == "energy"} >= {alice, bob},
        120,
        "the epilogs to release both TPUs and account their energy",
    )
    after = scrape(cluster)
    assert after.returncode == 0, after.stderr
    found = series(after.stdout)
    assert not [labels for _, labels, _ in found if "hpc_job" in labels or "hpc_user" in labels]
    assert not [n for n, _, _ in found if n.startswith("slurm_tpu_job_")]
    assert of(found, "slurm_tpu_device_leased", PCI)[1] == 0
    assert of(found, "slurm_tpu_device_inferences_total", PCI)[1] == 42  # the epilog took her record
    assert of(found, "slurm_tpu_device_inferences_total", USB)[1] == 0  # and refused his
    # Their energy now only in each device's lifetime counter, by method, at least what was seen running.
    for identity, method in ((PCI, "self-reported"), (USB, "estimated")):
        labels, joules = of(found, "slurm_tpu_device_energy_joules_total", identity)
        assert labels == {"node": "n1", "identity": identity, "method": method}
        assert joules >= energy[identity][1]
    rejected = [e for e in audit(cluster, "n1") if e["event"] == "usage-rejected"]
    assert [e["job_id"] for e in rejected] == [bob]
