"""Each job's accelerator energy in the books: the Epilog's ``energy`` audit events and the AdminComment's
``energy_j``/``energy_method`` read into ``slurm-tpu report`` (per job, user and device), the metrics'
per-job-per-device counter, doctor's lines on node energy, and the demo's closing lines.

The audit lines are written by the audit log's own writer (protocol/audit.py encode) in the ENERGY
event's fields, and the AdminComment items as the Epilog's spool entry renders them; a figure is
never shown without its method, and what is not a figure with its method is not shown at all.
"""

from __future__ import annotations

import json
import re

import pytest

from helpers import detect_json, exposition, run_cli
from slurm_tpu.ops.accounting import (
    JOULES_PER_KWH,
    energy_figures,
    parse_sacct,
    summarize_audit,
    summarize_sacct,
)
from slurm_tpu.protocol import audit
from slurm_tpu.protocol.energy import DeviceEnergy, join_methods, node_method
from slurm_tpu.protocol.job_record import admin_energy

GPU0, GPU1, TPU, SHARED = "pci-0000:41:00.0", "pci-0000:42:00.0", "usb-2-1", "usb-2-2"


def energy_line(t: float, identity: str, job: int, uid: int, joules, method: str, seconds: float, note: str = ""):
    """One ENERGY audit line as the Epilog writes it."""
    fields = {
        audit.IDENTITY: identity,
        audit.JOB_ID: job,
        audit.UID: uid,
        "joules": joules,
        "method": method,
        "seconds": seconds,
        "note": note,
    }
    return audit.encode(audit.ENERGY, t, fields).decode()


def lease_lines(identity: str, job: int, uid: int, start: float, end: float) -> list[str]:
    return [
        audit.encode(audit.ACQUIRE, start, {audit.IDENTITY: identity, audit.JOB_ID: job, audit.UID: uid}).decode(),
        audit.encode(audit.RELEASE, end, {audit.IDENTITY: identity, audit.JOB_ID: job, audit.UID: uid}).decode(),
    ]


# Job 10 (uid 1001): two GPUs, one measured, one whose counter went back (unavailable). Job 11 (uid 1001):
# a leased Edge TPU, estimated. Job 12 (uid 1002): shares of a TPU (no lease), estimated with root's
# busy time. Job 13 (uid 1002): the leased TPU, self-reported.
LOG = [
    *lease_lines(GPU0, 10, 1001, 1000.0, 1100.0),
    *lease_lines(GPU1, 10, 1001, 1000.0, 1100.0),
    *lease_lines(TPU, 11, 1001, 1000.0, 1060.0),
    *lease_lines(TPU, 13, 1002, 1200.0, 1260.0),
]
ENERGY = [
    energy_line(1060.0, TPU, 11, 1001, 45.0, "estimated", 60.0, "no busy time reported: idle power only"),
    energy_line(1100.0, GPU0, 10, 1001, 18000.0, "measured", 100.0),
    energy_line(1100.0, GPU1, 10, 1001, None, "unavailable", 100.0, "the energy counter went back (driver reload?)"),
    energy_line(1150.0, SHARED, 12, 1002, 12.5, "estimated", 50.0, "busy time from the TPU broker"),
    energy_line(1260.0, TPU, 13, 1002, 90.0, "self-reported", 60.0),
]


def figures(extra: list[str] = ()):
    return energy_figures(audit.read_events(LOG + ENERGY + list(extra)))


def test_energy_events_become_figures_and_what_is_not_a_figure_with_its_method_is_skipped():
    forged = [
        energy_line(1300.0, TPU, 14, 1002, 5.0, "guessed", 10.0),  # no known method
        energy_line(1300.0, TPU, 15, 1002, 5.0, "unavailable", 10.0),  # joules yet unavailable
        energy_line(1300.0, TPU, 16, 1002, None, "measured", 10.0),  # measured, yet no joules
        energy_line(1300.0, TPU, 17, 1002, -5.0, "measured", 10.0),
        energy_line(1300.0, TPU, 18, 1002, 1e13, "measured", 10.0),  # beyond any device
        energy_line(1300.0, TPU, 19, 1002, float("nan"), "measured", 10.0),
        energy_line(1300.0, TPU, 20, 1002, 1.0, "measured", -3.0),
        '{"event": "energy", "identity": "usb-2-1", "job_id": 21, "joules": 1, "method": "measured", "t": 1300',  # torn
    ]
    found = figures(forged)
    assert [(f.identity, f.job_id, f.joules, f.method) for f in found] == [
        (TPU, 11, 45.0, "estimated"),
        (GPU0, 10, 18000.0, "measured"),
        (GPU1, 10, None, "unavailable"),
        (SHARED, 12, 12.5, "estimated"),
        (TPU, 13, 90.0, "self-reported"),
    ]
    assert found[2].note == "the energy counter went back (driver reload?)" and found[1].start == 1000.0
    # A requeued job id's second run on the device counts beside its first; a line read twice counts once.
    again = figures([energy_line(1270.0, TPU, 13, 1002, 80.0, "self-reported", 60.0)] * 2)
    assert sorted(f.joules for f in again if f.job_id == 13) == [80.0, 90.0]


def test_methods_are_joined_in_one_order_as_the_epilog_names_a_nodes():
    assert join_methods(["estimated", "measured", "measured+unavailable"]) == "measured+estimated+unavailable"
    mixed = [DeviceEnergy("a", "gpu", 1.0, "measured", 1.0), DeviceEnergy("b", "edgetpu", 1.0, "estimated", 1.0)]
    assert join_methods(["estimated", "measured"]) == node_method(mixed)


def test_report_from_the_audit_log_gives_joules_kwh_and_methods_per_job_user_and_device():
    found = figures()
    by_job = summarize_audit(audit.pair_leases(audit.read_events(LOG)).spans, "job", None, None, 2000.0, str, found)
    job10 = by_job["10"].to_json()
    # The measured GPU's joules; the other GPU's figure is missing, and the method says so.
    assert (job10["energy_j"], job10["energy_method"]) == (18000.0, "measured+unavailable")
    assert job10["energy_kwh"] == pytest.approx(18000.0 / JOULES_PER_KWH) == pytest.approx(0.005)
    assert job10["energy_notes"] == ["the energy counter went back (driver reload?)"]
    # A job on TPU shares holds no lease: it is in the books through its energy figure.
    assert by_job["12"].to_json()["energy_method"] == "estimated" and by_job["12"].leases == 0
    assert by_job["13"].to_json()["energy_method"] == "self-reported"

    by_user = summarize_audit([], "user", None, None, 2000.0, lambda uid: f"u{uid}", found)
    assert by_user["u1001"].energy.joules == 18045.0
    assert by_user["u1001"].energy.method == "measured+estimated+unavailable"
    assert by_user["u1002"].energy.joules == 102.5 and by_user["u1002"].energy.method == "estimated+self-reported"

    by_device = summarize_audit([], "device", None, None, 2000.0, str, found)
    assert by_device[TPU].energy.method == "estimated+self-reported" and by_device[TPU].energy.joules == 135.0
    gpu1 = by_device[GPU1].to_json()
    assert gpu1["energy_j"] is None and gpu1["energy_kwh"] is None and gpu1["energy_method"] == "unavailable"
    # The period selects whole jobs' figures: from 1150 on, jobs 12 (ended at 1150) and 13.
    later = summarize_audit([], "job", 1150.0, None, 2000.0, str, found)
    assert sorted(later) == ["12", "13"]


def sacct_text() -> str:
    """Jobs as sacct lists them, with AdminComment items of nodes n1 and n2 in the Epilog's format."""
    both = (
        "slurm-tpu/n1:devices=2,inferences=0,inference_seconds=0,energy_j=18000,energy_method=measured+unavailable;"
        "slurm-tpu/n2:devices=1,inferences=5,inference_seconds=0.5,energy_j=45.5,energy_method=estimated"
    )
    return "\n".join(
        [
            f"10|alice|2026-11-25T12:00:00|2026-11-25T12:01:40|gres/gpu=2,gres/tpu=1|{both}",
            "11|alice|2026-11-25T12:00:00|2026-11-25T12:01:00|gres/tpu=1|"
            "slurm-tpu/n2:devices=1,inferences=1,inference_seconds=0.1,energy_method=unavailable",
            # An item from before energy had methods (the job's own figure): no energy shown for it.
            "12|bob|2026-11-25T12:00:00|2026-11-25T12:01:00|gres/tpu=1|"
            "slurm-tpu/n1:devices=1,inferences=12,inference_seconds=0.5,energy_j=3",
            "13|bob|2026-11-25T12:00:00|2026-11-25T12:01:00|gres/tpu=1|"
            "slurm-tpu/n1:devices=1,inferences=1,inference_seconds=0.5,energy_j=9,energy_method=guessed",
            "14|bob|2026-11-25T12:00:00|2026-11-25T12:01:00|gres/tpu_shard=1|"
            "slurm-tpu/n1:devices=0,inferences=1,inference_seconds=0.5,energy_j=7.25,energy_method=self-reported;"
            "an admin's note",
        ]
    )


def test_admin_comment_energy_needs_its_method():
    comment = "x;slurm-tpu/n1:devices=1,inferences=1,inference_seconds=1,energy_j=1e400,energy_method=measured"
    assert admin_energy(comment) == {}  # not a figure any device gives
    assert (
        admin_energy("slurm-tpu/n1:devices=1,inferences=1,inference_seconds=1,energy_j=5,energy_method=unavailable")
        == {}
    )
    assert admin_energy("slurm-tpu/n1:devices=1,energy_j=5,energy_method=measured+integrated") == {
        "n1": (5.0, "measured+integrated")
    }


def test_report_from_sacct_sums_the_nodes_figures_with_their_methods_per_job_and_user():
    rows = parse_sacct(sacct_text())
    by_job = summarize_sacct(rows, "job", ["gres/tpu", "gres/gpu", "gres/tpu_shard"], None, None, now=0)
    job10 = by_job["10"].to_json()
    assert job10["energy_j"] == 18045.5 and job10["energy_method"] == "measured+estimated+unavailable"
    assert job10["energy_kwh"] == round(18045.5 / JOULES_PER_KWH, 9)
    assert (by_job["11"].energy.joules, by_job["11"].energy.method) == (None, "unavailable")
    for old in ("12", "13"):  # a figure without a (known) method is not shown
        assert by_job[old].to_json()["energy_j"] is None and by_job[old].to_json()["energy_method"] is None
    assert by_job["14"].energy.joules == 7.25 and by_job["14"].energy.method == "self-reported"
    by_user = summarize_sacct(rows, "user", ["gres/tpu", "gres/gpu", "gres/tpu_shard"], None, None, now=0)
    assert by_user["alice"].energy.joules == 18045.5
    assert by_user["alice"].energy.method == "measured+estimated+unavailable"
    assert (by_user["bob"].energy.joules, by_user["bob"].energy.method) == (7.25, "self-reported")


def test_report_command_prints_energy_with_its_method_and_per_device_why_a_figure_is_unavailable(tmp_path):
    log = tmp_path / "audit.log"
    log.write_text("\n".join(LOG + ENERGY) + "\n")
    by_device = run_cli(["report", "--audit", str(log), "--by", "device"])
    assert by_device.returncode == 0, by_device.stderr
    header, *rows = by_device.stdout.splitlines()
    assert header.split()[-6:] == ["LATENCY", "ENERGY", "KWH", "METHOD", "UNAVAILABLE", "BECAUSE"]
    cells = {row.split()[0]: row for row in rows}
    assert re.search(r"18000\.0 J +0\.005000 +measured +-$", cells[GPU0])
    assert re.search(r" - +- +unavailable +the energy counter went back \(driver reload\?\)$", cells[GPU1])
    assert re.search(r"135\.0 J +0\.0000\d\d +estimated\+self-reported +-$", cells[TPU])
    as_json = json.loads(run_cli(["report", "--audit", str(log), "--by", "job", "--json"]).stdout)
    assert as_json["10"]["energy_j"] == 18000.0 and as_json["10"]["energy_method"] == "measured+unavailable"
    assert as_json["12"]["energy_method"] == "estimated" and as_json["12"]["leases"] == 0
    # A log without energy events (jobs before issue 33): no energy columns, nothing invented.
    old = tmp_path / "old.log"
    old.write_text("\n".join(LOG) + "\n")
    plain = run_cli(["report", "--audit", str(old), "--by", "job"])
    assert plain.returncode == 0 and "ENERGY" not in plain.stdout and "METHOD" not in plain.stdout


# ---- metrics ---------------------------------------------------------------------------------


def snapshot(now: float, energy, running=(), leased=None, held=None):
    from slurm_tpu.hardware import Inventory
    from slurm_tpu.ops.metrics import NodeSnapshot

    leased, held = leased or {}, held or {}
    return NodeSnapshot("n1", Inventory([]), Inventory([]), leased, held, [], now, None, [], None, energy, running)


def test_metrics_label_a_running_jobs_energy_with_job_user_and_method_and_count_ended_ones_per_device():
    from slurm_tpu.ops.accounting import DeviceFigure
    from slurm_tpu.ops.metrics import Holder, energy_families

    running = [  # job 40's figures so far (node_state.running_energy's: only those with joules)
        DeviceFigure(GPU0, 40, 1001, 1300.0, 2500.0, "measured", 25.0),
        DeviceFigure(TPU, 40, 1001, 1300.0, 13.0, "self-reported", 25.0),
    ]
    text, found = exposition(energy_families("n1", snapshot(1300.0, figures(), running)))
    per_job = found["slurm_tpu_job_energy_joules"]
    assert per_job.type == "counter" and "so far" in per_job.documentation
    for method in ("measured", "integrated", "estimated", "self-reported"):
        assert method in per_job.documentation
    series = {s.labels["identity"]: s for s in per_job.samples}
    assert series.keys() == {GPU0, TPU}  # the running job's only: ended jobs 10-13 have no job series
    assert series[GPU0].name == "slurm_tpu_job_energy_joules_total" and series[GPU0].value == 2500.0
    assert series[GPU0].labels == {
        "node": "n1",
        "identity": GPU0,
        "hpc_job": "40",
        "hpc_user": series[GPU0].labels["hpc_user"],  # uid 1001's name, or the uid itself
        "method": "measured",
    }
    assert series[TPU].labels["method"] == "self-reported"
    # Its TPU leased and held by it: the series stays; its lease being released (no longer held, its
    # Epilog not yet done): no series carries the job on that device, as no state series does.
    lease = {TPU: Holder(40, 1001)}
    _, held = exposition(energy_families("n1", snapshot(1300.0, [], running, leased=lease, held=lease)))
    assert {s.labels["identity"] for s in held["slurm_tpu_job_energy_joules"].samples} == {GPU0, TPU}
    _, releasing = exposition(energy_families("n1", snapshot(1300.0, [], running, leased=lease)))
    assert {s.labels["identity"] for s in releasing["slurm_tpu_job_energy_joules"].samples} == {GPU0}
    # The ended jobs' figures are each device's lifetime counter, per method (unavailable: no sample).
    lifetime = {
        (s.labels["identity"], s.labels["method"]): s.value for s in found["slurm_tpu_device_energy_joules"].samples
    }
    assert lifetime == {
        (GPU0, "measured"): 18000.0,
        (TPU, "estimated"): 45.0,
        (TPU, "self-reported"): 90.0,
        (SHARED, "estimated"): 12.5,
    }
    assert not [s for s in found["slurm_tpu_device_energy_joules"].samples if "hpc_job" in s.labels]
    # Once job 40 has ended (no running figure), its series is gone and nothing else carries a job.
    _, later = exposition(energy_families("n1", snapshot(1400.0, figures())))
    assert "slurm_tpu_job_energy_joules" not in later
    assert sum(s.value for s in later["slurm_tpu_device_energy_joules"].samples) == 18147.5
    # A node whose jobs have no figures has no energy series at all.
    assert exposition(energy_families("n1", snapshot(1300.0, [])))[1] == {}


# ---- doctor ----------------------------------------------------------------------------------

# `scontrol show config` prints each key padded to 23 characters then " = " (slurm_print_key_pairs);
# 25.11 prints an unset or none AcctGatherEnergyType as (null) (read_config.c drops "none"), 22.05
# as its default, acct_gather_energy/none.
SHOW_CONFIG = """Configuration data as of 2026-11-28T05:40:00
AccountingStorageType   = accounting_storage/slurmdbd
AcctGatherEnergyType    = {}
AcctGatherFilesystemType = (null)
AcctGatherNodeFreq      = 0 sec
"""


def show_config_options(value: str) -> dict[str, str]:
    pairs = (line.partition("=") for line in SHOW_CONFIG.format(value).splitlines())
    return {key.strip().lower(): rest.strip() for key, sep, rest in pairs if sep}


@pytest.mark.parametrize(
    "value, plugins",
    [
        ("(null)", []),
        ("acct_gather_energy/none", []),
        ("acct_gather_energy/rapl", ["rapl"]),
        ("acct_gather_energy/ipmi,acct_gather_energy/gpu", ["ipmi", "gpu"]),
        ("acct_gather_energy/rsmi", ["gpu"]),  # the old name, as Slurm reads it
    ],
)
def test_node_energy_plugins_from_show_config_shapes(value, plugins):
    from slurm_tpu.ops.doctor import node_energy_plugins

    assert node_energy_plugins(show_config_options(value)["acctgatherenergytype"]) == plugins


def test_doctor_says_whether_slurm_collects_node_energy_and_what_device_figures_add(tmp_path):
    import dataclasses

    from slurm_tpu.config import Config, parse_config
    from slurm_tpu.families import inventory_from_json
    from slurm_tpu.ops.doctor import Node, check_energy
    from slurm_tpu.ops.install import Layout

    conf = tmp_path / "slurm.conf"
    node = Node(Config(), Layout(str(tmp_path / "usr")), str(conf), "big", inventory_from_json(detect_json("big_node")))
    conf.write_text("ClusterName=c\n")  # no AcctGatherEnergyType: none
    none, devices = check_energy(node)
    assert none.ok and devices.ok  # absent node energy is information, never a failure
    assert none.line().startswith("ok    node energy: Slurm collects no node energy here")
    assert devices.line().startswith("ok    device energy: slurm-tpu adds each job's energy on each accelerator")
    assert "edgetpu" in devices.message and "gpu" in devices.message
    conf.write_text("AcctGatherEnergyType=acct_gather_energy/ipmi,acct_gather_energy/gpu\n")
    [ipmi, _] = check_energy(node)
    assert ipmi.ok and "Slurm collects node energy here (AcctGatherEnergyType ipmi, gpu" in ipmi.message
    assert "AMD GPUs only" in ipmi.message and "had the node to itself" in ipmi.message
    assert "\n" not in ipmi.line()
    # With energy off (config energy.enabled: false) the node adds no figures, and doctor says so.
    off = dataclasses.replace(node, config=parse_config({"version": 1, "energy": {"enabled": False}}))
    [_, devices] = check_energy(off)
    assert devices.ok and devices.line().startswith("ok    device energy: energy is off here (config energy.enabled")
    assert "adds each job's energy" not in devices.message


# ---- the demo's closing report ---------------------------------------------------------------


def test_demo_energy_lines_show_each_jobs_figure_with_its_method_and_say_when_there_is_none():
    from harness.demo.accounting import energy_lines

    plain = "15|bob|2026-11-25T12:00:00|2026-11-25T12:01:00|cpu=1|"  # no accelerator: not listed
    rows = parse_sacct(sacct_text() + "\n" + plain)
    lines = energy_lines(rows)
    assert lines[:2] == [
        "  energy per job on its accelerators: 18052.8 J (0.005015 kWh) in all,",
        "  by how each figure was obtained (the jobs' AdminComments):",
    ]
    assert lines[2:] == [
        "    measured+estimated+unavailable: 10 18045.5 J",
        "    unavailable: 11",
        # Jobs without a figure with its method (Edge TPU jobs before the Epilog wrote energy): said, not fatal.
        "    no figure: 12, 13",
        "    self-reported: 14 7.2 J",
    ]
    # Many jobs wrap, each line within the width, every job once.
    many = parse_sacct(
        "\n".join(
            f"{job}|bob|2026-11-25T12:00:00|2026-11-25T12:01:00|gres/tpu=1|"
            f"slurm-tpu/n1:devices=1,inferences=1,inference_seconds=0.5,energy_j=31.25,energy_method=self-reported"
            for job in range(100, 140)
        )
    )
    wrapped = energy_lines(many, width=80)
    assert len(wrapped) > 4 and max(map(len, wrapped)) <= 80
    assert " ".join(wrapped[2:]).count(" 31.2 J") == 40
    assert energy_lines([]) == ["  energy per job: no jobs"]
    # A shard job's few hundredths of a joule are shown as such, not as 0.0.
    small = parse_sacct(
        "16|bob|2026-11-25T12:00:00|2026-11-25T12:00:01|gres/tpu_shard=1|"
        "slurm-tpu/n1:devices=0,inferences=0,inference_seconds=0,energy_j=0.0431,energy_method=estimated"
    )
    assert energy_lines(small)[2:] == ["    estimated: 16 0.043 J"]
