"""A job's energy at the Prolog and Epilog, run as the hook functions with a testbed: the start file is
root's, the Epilog's figures land in the audit log and the spool entry, and energy never fails a job.

No Slurm: the node's settings are built here and the job's allocation is what Slurm would answer. GPUs
are read through the NVML double (tests/nvml_double), named by ``energy.nvml_library``; an Edge TPU
shard job's figure is the power model with the broker's busy time (its stats file, root's).
"""

from __future__ import annotations

import json
import os
import stat

import pytest
from support import run_hook_in_process as run  # energy never drains a node

import nvml_double
from slurm_tpu.config import Config
from slurm_tpu.hooks import allocation, epilog, prolog, settings as hook_settings
from slurm_tpu.protocol import energy
from slurm_tpu.protocol.hooks_snapshot import ShardPolicy
from slurm_tpu.protocol.inventory import KnownDevice
from slurm_tpu.protocol.job_record import decode_spool
from slurm_tpu.slurm.jobdetail import GresAlloc

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the state directory must be root-owned")
GPU_A, GPU_B = "00000000:41:00.0", "00000000:81:00.0"
TPU = "usb-2-1.3"


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    return nvml_double.build_or_skip(tmp_path_factory)


@pytest.fixture
def node(tmp_path, monkeypatch, library):
    """A node with two NVIDIA GPUs (not leased: the default) and one shared Edge TPU."""
    os.chmod(tmp_path, 0o755)
    state, spool, gpus = tmp_path / "state", tmp_path / "spool", tmp_path / "gpus"
    os.mkdir(spool, 0o700)  # a collector runs here: the epilog spools
    monkeypatch.setenv(nvml_double.STATE_VARIABLE, str(gpus))
    settings = hook_settings.HookSettings(str(state), node="n1")
    hook_settings.apply_families(settings, Config())
    settings.devices = {
        "pci-0000:41:00.0": KnownDevice("pci-0000:41:00.0", "gpu", "pci", ("/dev/nvidia0",)),
        "pci-0000:81:00.0": KnownDevice("pci-0000:81:00.0", "gpu", "pci", ("/dev/nvidia1",)),
        TPU: KnownDevice(TPU, "edgetpu", "usb", ("/dev/bus/usb/002/005",)),
    }
    settings.index = {"gpu": [("a100", "/dev/nvidia0"), ("a100", "/dev/nvidia1")]}
    settings.energy_sources = {
        "pci-0000:41:00.0": f"nvml-energy:{GPU_A}",
        "pci-0000:81:00.0": f"nvml-energy:{GPU_B}",
        TPU: "model:0.5:2",
    }
    settings.shards = ShardPolicy("tpu_shard", {TPU: 4})
    settings.nvml_library, settings.accounting_spool = library, str(spool)
    monkeypatch.setattr(hook_settings, "load", lambda environ, node=None, create=True: settings)
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=5_000_000_000, power_mw=200_000)
    nvml_double.set_gpu(gpus, GPU_B, energy_mj=7_000_000_000, power_mw=200_000)
    return settings, state, spool, gpus


def job(monkeypatch, job_id: int, allocs: list[GresAlloc]) -> dict[str, str]:
    monkeypatch.setattr(allocation, "query_job_gres", lambda hook, metered=(): allocs)
    return {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_UID": "1234", "SLURM_JOB_GID": "1235", "SLURMD_NODENAME": "n1"}


def events(state, name: str = "energy") -> list[dict]:
    lines = (state / "audit.log").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["event"] == name]


def test_a_gpu_job_gets_its_own_gpus_counter_delta_though_gpus_are_not_leased(node, monkeypatch):
    settings, state, spool, gpus = node
    env = job(monkeypatch, 41, [GresAlloc("gpu", "a100", 1, (1,))])  # IDX 1: the second GPU
    assert run(prolog, env) == 0
    start_file = state / energy.DIR / "41"
    info, directory = start_file.stat(), start_file.parent.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o600)
    assert (directory.st_uid, stat.S_IMODE(directory.st_mode)) == (0, 0o700)
    start = energy.decode(start_file.read_bytes(), "start")
    assert [(d.identity, d.start) for d in start.devices] == [("pci-0000:81:00.0", 7_000_000_000)]
    assert not (state / "leases").exists() or os.listdir(state / "leases") == []  # read, never leased
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=5_000_000_000 + 10**9)  # another job's GPU: not this one's
    nvml_double.set_gpu(gpus, GPU_B, energy_mj=7_000_000_000 + 4_321_987)
    assert run(epilog, env) == 0
    [event] = events(state)
    assert (event["identity"], event["job_id"], event["uid"], event["method"]) == (
        "pci-0000:81:00.0",
        41,
        1234,
        "measured",
    )
    assert event["joules"] == pytest.approx(4321.987, abs=1e-3)
    entry = decode_spool((spool / "41").read_bytes(), "spool")
    assert (entry.energy_j, entry.energy_method, entry.devices) == (pytest.approx(4321.987, abs=1e-3), "measured", 0)
    assert not start_file.exists()
    # A second Epilog run changes nothing (the start file was read once).
    assert run(epilog, env) == 0
    assert len(events(state)) == 1


def test_a_shard_jobs_estimate_uses_the_brokers_busy_time(node, monkeypatch):
    settings, state, spool, _ = node
    env = job(monkeypatch, 42, [GresAlloc("tpu_shard", None, 2, ())])
    assert run(prolog, env) == 0  # the broker is down: the job starts anyway
    start_file = state / energy.DIR / "42"
    start = energy.decode(start_file.read_bytes(), "start")
    assert [(d.identity, d.source, d.shares) for d in start.devices] == [(TPU, "model:0.5:2", (2, 4))]
    # The job ran ten minutes: its start moves back (root's file, as a slow clock would leave it).
    start.start_ns -= 600 * 10**9
    start_file.write_bytes(energy.encode(start))
    stats = state / "broker" / "stats"
    stats.mkdir(mode=0o700)
    figures = {"busy_ms": 120_000.0, "inferences": 300, "model_swaps": 0, "queue_wait_ms": 0.0, "model_loads": 1}
    (stats / "42").write_text(json.dumps(figures))
    assert run(epilog, env) == 0
    [event] = events(state)
    assert (event["identity"], event["method"]) == (TPU, "estimated") and "broker" in event["note"]
    assert event["seconds"] >= 600
    expected = 0.5 * event["seconds"] * 0.5 + (2.0 - 0.5) * 120.0
    assert event["joules"] == pytest.approx(expected, rel=1e-6)
    entry = decode_spool((spool / "42").read_bytes(), "spool")
    assert (entry.energy_method, entry.shards["shards"]) == ("estimated", 2)
    assert entry.energy_j == pytest.approx(expected, rel=1e-6)


def test_nvml_that_cannot_load_costs_the_figure_not_the_job(node, monkeypatch, tmp_path):
    settings, state, spool, _ = node
    settings.nvml_library = str(tmp_path / "missing" / "libnvidia-ml.so.1")
    env = job(monkeypatch, 43, [GresAlloc("gpu", "a100", 1, (0,))])
    assert run(prolog, env) == 0
    [line] = events(state, "energy-unavailable")
    assert line["job_id"] == 43 and "cannot load NVML" in line["reason"]
    assert run(epilog, env) == 0
    [event] = events(state)
    assert (event["method"], event["joules"]) == ("unavailable", None) and "cannot load NVML" in event["note"]
    assert decode_spool((spool / "43").read_bytes(), "spool").energy_method == "unavailable"


def test_a_planted_link_costs_the_figure_and_is_never_followed(node, monkeypatch, tmp_path):
    settings, state, spool, _ = node
    env = job(monkeypatch, 44, [GresAlloc("gpu", "a100", 1, (0,))])
    assert run(prolog, env) == 0
    start_file = state / energy.DIR / "44"
    target = tmp_path / "elsewhere"
    target.write_bytes(start_file.read_bytes())
    start_file.unlink()
    os.symlink(target, start_file)
    assert run(epilog, env) == 0
    [line] = events(state, "energy-unavailable")
    assert "symlink" in line["reason"] and events(state) == []
    assert target.exists() and not os.path.lexists(start_file)


def test_with_energy_disabled_nothing_is_read_or_written(node, monkeypatch):
    settings, state, spool, _ = node
    settings.energy_enabled, settings.energy_sources, settings.shards = False, {}, None

    def no_query(hook, metered=()):
        raise AssertionError("Slurm asked for a job's GPUs with energy disabled")

    monkeypatch.setattr(allocation, "query_job_gres", no_query)
    env = {"SLURM_JOB_ID": "45", "SLURM_JOB_UID": "1234", "SLURMD_NODENAME": "n1"}
    assert run(prolog, env) == 0
    assert run(epilog, env) == 0
    assert not (state / energy.DIR).exists() and not (spool / "45").exists()


# ---- hardening (the reviewer's findings): every energy problem costs the figure, never the job


def test_an_nvml_that_hangs_costs_the_figure_within_the_deadline_and_the_hooks_go_on(node, monkeypatch):
    settings, state, spool, gpus = node
    nvml_double.set_driver(gpus, hang=True)  # nvmlInit_v2 never returns
    env = job(monkeypatch, 46, [GresAlloc("gpu", "a100", 1, (0,))])
    assert run(prolog, env) == 0
    [line] = events(state, "energy-unavailable")
    assert "did not answer within 2 s" in line["reason"]
    start = energy.decode((state / energy.DIR / "46").read_bytes(), "start")
    assert start.devices[0].source.startswith("none:NVML at job start did not answer")
    assert run(epilog, env) == 0
    [event] = events(state)
    assert (event["method"], event["joules"]) == ("unavailable", None) and "did not answer" in event["note"]
    # The end's reads hang too (a sound init, a GPU whose query never returns): the same.
    nvml_double.set_driver(gpus)
    env = job(monkeypatch, 47, [GresAlloc("gpu", "a100", 1, (1,))])
    assert run(prolog, env) == 0
    nvml_double.set_gpu(gpus, GPU_B, energy_mj=7_000_000_000, hang=True)
    assert run(epilog, env) == 0
    event = events(state)[-1]
    assert (event["job_id"], event["method"]) == (47, "unavailable")
    assert "the device reads at job end did not answer within 2 s: killed" in event["note"]
    assert decode_spool((spool / "47").read_bytes(), "spool").energy_method == "unavailable"


def test_an_nvml_that_crashes_costs_the_figure_not_the_hook(node, monkeypatch):
    settings, state, spool, gpus = node
    nvml_double.set_driver(gpus, crash=True)  # nvmlInit_v2 aborts its process
    env = job(monkeypatch, 48, [GresAlloc("gpu", "a100", 1, (0,))])
    assert run(prolog, env) == 0
    [line] = events(state, "energy-unavailable")
    assert "NVML at job start crashed (signal 6)" in line["reason"]
    assert run(epilog, env) == 0
    [event] = events(state)
    assert event["method"] == "unavailable" and "crashed (signal 6)" in event["note"]


def test_an_edge_tpu_job_forks_nothing_for_its_figure(node, monkeypatch):
    settings, state, spool, _ = node
    env = job(monkeypatch, 49, [GresAlloc("tpu_shard", None, 2, ())])

    def no_fork():
        raise AssertionError("an Edge TPU job forked for its energy")

    monkeypatch.setattr(os, "fork", no_fork)
    assert run(prolog, env) == 0
    assert run(epilog, env) == 0
    [event] = events(state)
    assert (event["identity"], event["method"]) == (TPU, "estimated")


class FailingSlurm:
    def job_gres(self, job_id, node):
        from slurm_tpu.errors import SlurmCommandError

        raise SlurmCommandError("scontrol: slurm_load_jobs error: Socket timed out on send/recv operation", "scontrol")


def test_a_slurm_query_made_only_for_energy_that_fails_costs_the_figure_not_the_job(node, monkeypatch):
    settings, state, spool, _ = node
    settings.shards = None  # the node leases and shares nothing: the query is for its GPUs' energy only
    from slurm_tpu.hooks.context import HookRun

    monkeypatch.setattr(HookRun, "slurm", lambda self: FailingSlurm())
    env = {"SLURM_JOB_ID": "50", "SLURM_JOB_UID": "1234", "SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "0"}
    assert run(prolog, env) == 0
    [line] = events(state, "energy-unavailable")
    assert line["job_id"] == 50 and "Socket timed out" in line["reason"] and "energy" in line["reason"]
    assert not (state / energy.DIR / "50").exists()


def test_a_state_directory_that_cannot_be_opened_costs_the_figure_not_the_job(node, monkeypatch, tmp_path, capsys):
    settings, state, spool, _ = node
    settings.shards = None
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    os.symlink(tmp_path / "elsewhere", state)  # the Ledger refuses a state directory that is a link
    env = job(monkeypatch, 51, [GresAlloc("gpu", "a100", 1, (0,))])
    assert run(prolog, env) == 0
    assert "energy-unavailable" in capsys.readouterr().err
    assert os.listdir(tmp_path / "elsewhere") == []


def test_a_requeued_job_never_inherits_its_earlier_runs_power_samples(node, monkeypatch, tmp_path):
    """The sampler wrote run 1's integral as run 1 ended: run 2's Epilog does not count it."""
    from slurm_tpu.protocol.energy import PollState, encode_poll

    settings, state, spool, _ = node
    power = tmp_path / "power1_average"
    power.write_text("100000000\n")
    settings.sysfs_root = str(tmp_path)
    settings.energy_sources["pci-0000:41:00.0"] = f"hwmon-power:{power}"
    env = job(monkeypatch, 52, [GresAlloc("gpu", "a100", 1, (0,))])
    assert run(prolog, env) == 0
    start_file = state / energy.DIR / "52"
    start = energy.decode(start_file.read_bytes(), "start")
    earlier = PollState(
        "pci-0000:41:00.0",
        10**5,
        200,
        start.start_ns,
        100.0,
        start.start_ns - 10**12,
        5 * 10**9,
        start.start_ns - 10**12,
        start.boot,
    )
    (state / energy.DIR / "52.poll").write_bytes(encode_poll([earlier]))
    os.chmod(state / energy.DIR / "52.poll", 0o600)
    assert run(epilog, env) == 0
    [event] = events(state)
    assert (event["method"], event["joules"]) == ("unavailable", None)
    assert "earlier run of job 52" in event["note"]
    # And the Prolog of a run removes a poll file a run before it left.
    (state / energy.DIR / "52.poll").write_bytes(encode_poll([earlier]))
    assert run(prolog, env) == 0
    assert not (state / energy.DIR / "52.poll").exists()


def test_a_bad_poll_file_is_the_figures_note(node, monkeypatch, tmp_path):
    settings, state, spool, _ = node
    settings.energy_sources["pci-0000:41:00.0"] = f"hwmon-power:{tmp_path}/power1_average"
    env = job(monkeypatch, 53, [GresAlloc("gpu", "a100", 1, (0,))])
    assert run(prolog, env) == 0
    (state / energy.DIR / "53.poll").write_bytes(b"pci-0000:41:00.0\t5\t1\t5\t2\n")  # version 1: refused
    assert run(epilog, env) == 0
    [event] = events(state)
    assert event["method"] == "unavailable" and "not format version 2" in event["note"]
    assert event["note"] != "no node agent polls power here"


def test_a_shard_job_whose_start_file_is_gone_still_gets_its_devices_events(node, monkeypatch):
    settings, state, spool, _ = node
    env = job(monkeypatch, 54, [GresAlloc("tpu_shard", None, 2, ())])
    assert run(prolog, env) == 0
    (state / energy.DIR / "54").unlink()  # the node rebooted (a tmpfs state directory) or the write failed
    assert run(epilog, env) == 0
    [event] = events(state)
    assert (event["identity"], event["method"], event["joules"]) == (TPU, "unavailable", None)
    assert "start file is missing" in event["note"]
    assert decode_spool((spool / "54").read_bytes(), "spool").energy_method == "unavailable"
    assert run(epilog, env) == 0 and len(events(state)) == 1  # a second run says it once


def test_energy_turned_off_since_the_prolog_leaves_no_start_file_behind(node, monkeypatch):
    settings, state, spool, _ = node
    env = job(monkeypatch, 55, [GresAlloc("gpu", "a100", 1, (0,))])
    assert run(prolog, env) == 0
    (state / energy.DIR / "55.poll").write_bytes(b"anything\n")
    settings.energy_enabled, settings.energy_sources = False, {}
    assert run(epilog, env) == 0
    assert os.listdir(state / energy.DIR) == [] and not (state / "audit.log").exists()


def test_the_epilog_reads_the_end_before_it_answers_slurm(node, monkeypatch, tmp_path):
    """The node agent answers Slurm early, and the node's next job may start at once: the end readings
    (and the end's time) are taken before the answer, the figures computed after."""
    from slurm_tpu.access.ledger import Ledger
    from slurm_tpu.hooks import leasing
    from slurm_tpu.hooks.context import JobContext

    settings, state, spool, gpus = node
    # A job holding a leased device (the answer comes only with a lease) and a GPU read for energy.
    node_file = tmp_path / "dev" / "accel0"
    node_file.parent.mkdir()
    os.mknod(node_file, stat.S_IFCHR | 0o600, os.makedev(240, 219))  # no driver: nobody holds it
    leased = KnownDevice("pci-0000:02:00.0", "gpu", "pci", (str(node_file),))
    settings.devices[leased.identity] = leased
    settings.energy_sources[leased.identity] = "none:no reading for this test's leased device"
    env = job(monkeypatch, 56, [GresAlloc("gpu", "a100", 1, (0,))])
    assert run(prolog, env) == 0
    with Ledger(settings.state_dir) as ledger:
        leasing.acquire(ledger, JobContext(56, 1234, "alice", "n1"), [leased], settings)
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=5_000_000_000 + 2_000_000)  # the job drew 2 kJ
    answered = []

    def answer():  # Slurm has its answer: the next job on the GPU draws at once
        answered.append(True)
        nvml_double.set_gpu(gpus, GPU_A, energy_mj=5_000_000_000 + 10**9)

    assert run(epilog, env, answer) == 0 and answered
    figures = {event["identity"]: event for event in events(state)}
    assert figures["pci-0000:41:00.0"]["joules"] == pytest.approx(2000.0)
    assert figures["pci-0000:41:00.0"]["method"] == "measured"
