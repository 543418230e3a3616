"""slurm-tpu metrics: real detection (umockdev), a real state dir, the official parser."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import HARDWARE, detect_json, real_libedgetpu, run_cli


@pytest.fixture
def node_state(tmp_path):
    """A root-owned state dir as `gres-conf --output` and the hooks leave it on big_node."""
    if os.geteuid() != 0:
        pytest.skip("the state directory must be root-owned")
    state = tempfile.mkdtemp(prefix="slurm-tpu-state-")
    os.chmod(state, 0o755)
    (tmp_path / "inv.json").write_text(json.dumps(detect_json("big_node")))
    config = tmp_path / "config.yaml"
    config.write_text(f"version: 1\nnode_name: big\nstate_dir: {state}\ndevices: {{slot_dir: {tmp_path}/slots}}\n")
    result = run_cli(
        [
            "--config",
            str(config),
            "gres-conf",
            "--inventory",
            str(tmp_path / "inv.json"),
            "--no-slots",
            "--output",
            str(tmp_path / "gres.conf"),
        ]
    )
    assert result.returncode == 0, result.stderr
    from slurm_tpu.access.ledger import Lease, Ledger
    from slurm_tpu.access.node_inventory import write_state_inventory

    write_state_inventory(state, json.loads((tmp_path / "inv.json").read_text()))
    with Ledger(state) as ledger:
        assert ledger.claim(Lease("pci-0000:04:00.0", 77, 1001, start=time.time()))
    events = [
        {"event": "acquire", "identity": "usb-2-1", "job_id": 70, "uid": 1001, "t": 1000.0},
        {
            "event": "usage",
            "identity": "usb-2-1",
            "job_id": 70,
            "uid": 1001,
            "inferences": 250,
            "seconds": 2.5,
            "t": 1010.0,
        },
        {"event": "release", "identity": "usb-2-1", "job_id": 70, "uid": 1001, "t": 1012.0},
        {"event": "acquire", "identity": "usb-2-1", "job_id": 71, "uid": 1002, "t": 1020.0},
        {"event": "release", "identity": "usb-2-1", "job_id": 71, "uid": 1002, "t": 1023.0},
    ]
    with open(os.path.join(state, "audit.log"), "a") as handle:
        handle.writelines(json.dumps(e) + "\n" for e in events)
    yield config
    shutil.rmtree(state, ignore_errors=True)


def samples(text: str) -> dict[tuple[str, str], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, sample.labels.get("identity", ""))] = sample.value
    return found


def test_metrics_parse_and_report_the_node(node_state):
    result = run_cli(["--config", str(node_state), "metrics"], "big_node")
    assert result.returncode == 0, result.stderr
    values = samples(result.stdout)
    assert values[("slurm_tpu_device_present", "usb-2-1")] == 1
    assert values[("slurm_tpu_device_healthy", "pci-0000:05:00.0")] == 1
    assert values[("slurm_tpu_device_leased", "pci-0000:04:00.0")] == 1
    assert values[("slurm_tpu_device_leased", "usb-2-1")] == 0
    assert values[("slurm_tpu_device_temperature_celsius", "pci-0000:03:00.0")] == 45.25
    assert values[("slurm_tpu_device_jobs_total", "usb-2-1")] == 2
    assert values[("slurm_tpu_device_lease_seconds_total", "usb-2-1")] == 15.0
    assert values[("slurm_tpu_device_inferences_total", "usb-2-1")] == 250
    assert values[("slurm_tpu_device_inference_seconds_total", "usb-2-1")] == 2.5
    assert sum(1 for (name, _) in values if name == "slurm_tpu_device_present") == 10


def test_metrics_report_the_real_libedgetpu_version(node_state, tmp_path):
    library = real_libedgetpu()
    result = run_cli(["--config", str(node_state), "metrics", "--libedgetpu", library], "big_node")
    assert result.returncode == 0, result.stderr
    [family] = [f for f in text_string_to_metric_families(result.stdout) if f.name == "slurm_tpu_edgetpu_runtime_info"]
    assert family.type == "gauge"  # text format 0.0.4 has no info type: a constant-1 gauge
    [sample] = family.samples
    assert sample.labels["version"].startswith("BuildLabel(COMPILER=")
    assert sample.labels["version"].endswith("RuntimeVersion(14)")
    assert sample.value == 1
    # A node without libedgetpu has no such series (rather than an empty version).
    none = run_cli(["--config", str(node_state), "metrics", "--libedgetpu", str(tmp_path / "none.so.1")], "big_node")
    assert none.returncode == 0 and "slurm_tpu_edgetpu_runtime_info" not in none.stdout


def test_missing_and_hot_devices_are_unhealthy(node_state, tmp_path):
    hot = tmp_path / "hot.umockdev"
    text = (HARDWARE / "big_node.umockdev").read_text().replace("A: temp=44000", "A: temp=91500")
    # ...and the USB 3 stick unplugged: drop its block.
    blocks = [b for b in text.split("\n\n") if "usb2/2-1\n" not in b + "\n"]
    hot.write_text("\n\n".join(blocks))
    shutil.copytree(HARDWARE / "big_node.extra", tmp_path / "hot.extra")
    values = samples(run_cli(["--config", str(node_state), "metrics"], str(hot)).stdout)
    assert values[("slurm_tpu_device_present", "usb-2-1")] == 0
    assert values[("slurm_tpu_device_healthy", "usb-2-1")] == 0
    assert values[("slurm_tpu_device_healthy", "pci-0000:05:00.0")] == 0
    assert values[("slurm_tpu_device_temperature_celsius", "pci-0000:05:00.0")] == 91.5
    assert values[("slurm_tpu_device_healthy", "pci-0000:03:00.0")] == 1


def test_metrics_over_http(node_state):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slurm_tpu.cli",
            "--config",
            str(node_state),
            "metrics",
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stderr=subprocess.PIPE,
    )
    try:
        deadline, body = time.monotonic() + 20, ""
        while time.monotonic() < deadline and not body:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                    body = response.read().decode()
            except OSError:
                time.sleep(0.2)
        assert ("slurm_tpu_device_leased", "pci-0000:04:00.0") in samples(body)  # no hardware: from the state
        # prometheus_client's server: OpenMetrics for a scraper that asks for it.
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.headers["Content-Type"].startswith("application/openmetrics-text")
            assert response.read().decode().endswith("# EOF\n")
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_report_from_the_audit_log(node_state):
    result = run_cli(["--config", str(node_state), "report", "--by", "device", "--json"])
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["usb-2-1"]["jobs"] == 2 and data["usb-2-1"]["inferences"] == 250
    assert data["usb-2-1"]["mean_latency_ms"] == 10.0
    table = run_cli(["--config", str(node_state), "report", "--by", "job"]).stdout
    assert table.splitlines()[0].split() == ["JOB", "JOBS", "LEASE", "TIME", "INFERENCES", "MEAN", "LATENCY"]
    bad = run_cli(["--config", str(node_state), "report", "--since", "yesterday"])
    assert bad.returncode == 2 and "neither a date" in bad.stderr


def test_absurd_usage_in_the_audit_log_changes_nothing_in_report_and_metrics(node_state):
    """A record an older epilog accepted (1e400, a 400-digit count, negative energy, NaN)."""
    state = node_state.read_text().split("state_dir: ")[1].split("\n")[0]
    forged = [
        '{"event": "usage", "identity": "usb-2-1", "job_id": 70, "uid": 1001, "inferences": 1e400, '
        '"seconds": 1, "t": 1011.0}',
        '{"event": "usage", "identity": "usb-2-1", "job_id": 70, "uid": 1001, "inferences": '
        + "9" * 400
        + ', "seconds": 1, "t": 1011.0}',
        '{"event": "usage", "identity": "usb-2-1", "job_id": 70, "uid": 1001, "inferences": 1, '
        '"seconds": NaN, "energy_j": -5, "t": 1011.0}',
    ]
    log = os.path.join(state, "audit.log")
    lines = open(log).read().splitlines(keepends=True)
    with open(log, "w") as handle:  # forged lines inside job 70's lease, before its release
        handle.writelines(lines[:2] + [line + "\n" for line in forged] + lines[2:])
    report = run_cli(["--config", str(node_state), "report", "--by", "device", "--json"])
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["usb-2-1"]["inferences"] == 250
    assert run_cli(["--config", str(node_state), "report"]).returncode == 0
    metrics = run_cli(["--config", str(node_state), "metrics"], "big_node")
    assert metrics.returncode == 0, metrics.stderr
    assert samples(metrics.stdout)[("slurm_tpu_device_inferences_total", "usb-2-1")] == 250


def test_the_leased_device_carries_its_job_and_user_the_others_none(node_state):
    """dcgm-exporter's HPC job mapping: hpc_job on a device's series while a job holds it (and hpc_user)."""
    import pwd

    result = run_cli(["--config", str(node_state), "metrics"], "big_node")
    assert result.returncode == 0, result.stderr
    try:
        user = pwd.getpwuid(1001).pw_name
    except KeyError:
        user = "1001"
    found = [s for f in text_string_to_metric_families(result.stdout) for s in f.samples]
    for sample in found:
        held = sample.labels.get("identity") == "pci-0000:04:00.0" and not sample.name.endswith("_total")
        if held:
            assert (sample.labels["hpc_job"], sample.labels["hpc_user"]) == ("77", user), sample
        else:
            assert "hpc_job" not in sample.labels and "hpc_user" not in sample.labels, sample


def test_textfile_mode_writes_atomically_and_refuses_unsafe_targets(node_state, tmp_path):
    target = tmp_path / "prom" / "slurm_tpu.prom"
    target.parent.mkdir(mode=0o755)
    target.write_text("old\n")
    old_inode = os.stat(target).st_ino
    result = run_cli(["--config", str(node_state), "metrics", "--textfile", str(target)], "big_node")
    assert result.returncode == 0 and result.stdout == "", result.stderr
    # Renamed over the old file (write_to_textfile: <path>.<pid>.<thread>, then rename): a new inode,
    # no temporary file left, readable by node_exporter's unprivileged user.
    assert os.stat(target).st_ino != old_inode and os.listdir(target.parent) == ["slurm_tpu.prom"]
    assert os.stat(target).st_mode & 0o777 == 0o644
    assert samples(target.read_text())[("slurm_tpu_device_leased", "pci-0000:04:00.0")] == 1
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o1777)
    refused = run_cli(["--config", str(node_state), "metrics", "--textfile", str(open_dir / "x.prom")], "big_node")
    assert refused.returncode == 1 and "others could plant" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and os.listdir(open_dir) == []
    wrong = run_cli(["--config", str(node_state), "metrics", "--textfile", str(tmp_path / "prom" / "x.txt")])
    assert wrong.returncode == 1 and "only *.prom files" in wrong.stderr


def test_an_ended_jobs_energy_reaches_the_devices_lifetime_counter_and_report_not_a_job_series(node_state):
    """The Epilog's energy events (protocol/audit.py ENERGY, by the audit log's own writer) through the
    real commands: each device's lifetime counter per method, and report's figures; no series carries
    the ended job (job labels only while the job holds the device, as dcgm-exporter's)."""
    from slurm_tpu.protocol import audit

    state = node_state.read_text().split("state_dir: ")[1].split("\n")[0]
    ended = time.time() - 60

    def energy(identity: str, job: int, joules, method: str, note: str = "") -> bytes:
        fields = {"identity": identity, "job_id": job, "uid": 1001, "joules": joules}
        return audit.encode(audit.ENERGY, ended, {**fields, "method": method, "seconds": 30.0, "note": note})

    with open(os.path.join(state, "audit.log"), "ab") as handle:
        handle.write(energy("usb-2-1", 72, 37.5, "estimated", "no busy time reported: idle power only"))
        handle.write(energy("pci-0000:04:00.0", 72, None, "unavailable", "no start reading"))
    result = run_cli(["--config", str(node_state), "metrics"], "big_node")
    assert result.returncode == 0, result.stderr
    lifetime = [
        (s.labels, s.value)
        for f in text_string_to_metric_families(result.stdout)
        if f.name == "slurm_tpu_device_energy_joules"
        for s in f.samples
    ]
    assert lifetime == [({"node": "big", "identity": "usb-2-1", "method": "estimated"}, 37.5)]
    assert "slurm_tpu_job_energy_joules" not in result.stdout
    assert not [
        s for f in text_string_to_metric_families(result.stdout) for s in f.samples if "72" in s.labels.values()
    ]
    report = run_cli(["--config", str(node_state), "report", "--by", "device", "--json"])
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert (data["usb-2-1"]["energy_j"], data["usb-2-1"]["energy_method"]) == (37.5, "estimated")
    assert data["pci-0000:04:00.0"]["energy_method"] == "unavailable"
    assert data["pci-0000:04:00.0"]["energy_notes"] == ["no start reading"]


def test_a_running_jobs_energy_so_far_is_its_series_while_it_holds_the_device(node_state):
    """Job 77 holds pci-0000:04:00.0 (the fixture's lease) and its Prolog's start file is there: its
    energy so far, computed as its Epilog will, labelled with the job, its user and the method; the
    start file is left as it was; a GPU whose NVML cannot be opened has no sample (never a wrong one);
    once the Epilog has taken the start file, the series is gone."""
    from slurm_tpu.access import statedir
    from slurm_tpu.energy import figures
    from slurm_tpu.protocol.energy import DIR, StartDevice, StartFile

    node_state.write_text(node_state.read_text() + "energy: {nvml_library: /nonexistent/libnvidia-ml.so.1}\n")
    state = node_state.read_text().split("state_dir: ")[1].split("\n")[0]
    devices = [
        StartDevice("pci-0000:04:00.0", "edgetpu", figures.model_source(0.3, 2.0), None, None),
        StartDevice("pci-0000:05:00.0", "edgetpu", "nvml-energy:00000000:05:00.0", 1000.0, None),
    ]
    began = figures.clock_ns() - 60 * 10**9
    fd = statedir.open_dir(state)
    try:
        figures.write_start(fd, StartFile(77, figures.boot_id(), began, devices, 1001))
    finally:
        os.close(fd)
    path = os.path.join(state, DIR, "77")
    written = open(path, "rb").read()
    result = run_cli(["--config", str(node_state), "metrics"], "big_node")
    assert result.returncode == 0, result.stderr
    [family] = [f for f in text_string_to_metric_families(result.stdout) if f.name == "slurm_tpu_job_energy_joules"]
    assert family.type == "counter" and "so far" in family.documentation
    [sample] = family.samples
    user = sample.labels["hpc_user"]  # uid 1001's name, or the uid itself where it has none
    assert sample.name == "slurm_tpu_job_energy_joules_total" and user in ("1001", pwd_name(1001))
    assert sample.labels == {
        "node": "big",
        "identity": "pci-0000:04:00.0",
        "hpc_job": "77",
        "hpc_user": user,
        "method": "estimated",
    }
    assert 0.3 * 60 <= sample.value <= 0.3 * 600  # idle watts over the minute so far (no busy time)
    assert open(path, "rb").read() == written  # read, not taken: the Epilog reads it at the job's end
    os.unlink(path)  # what the Epilog's take_start does
    after = run_cli(["--config", str(node_state), "metrics"], "big_node")
    assert after.returncode == 0 and "slurm_tpu_job_energy_joules" not in after.stdout


def pwd_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
