"""The Epilog's energy figures (slurm_tpu/energy/figures.py) from a start file and what it reads at the
job's end: the power model (Edge TPU, Hailo), the reboot and bound rules, and the start file's I/O.
GPU counters through the NVML double: tests/energy/test_figures_nvml.py."""

from __future__ import annotations

import os
import stat

import pytest

from slurm_tpu.access import statedir
from slurm_tpu.energy import figures
from slurm_tpu.hooks.epilog import _has_energy_start
from slurm_tpu.protocol import energy
from slurm_tpu.protocol.energy import DeviceEnergy, PollState, StartDevice, StartFile

BOOT = "3c1f-boot"
S = 10**9  # ns


def start_file(*devices: StartDevice, start_ns: int = 100 * S) -> StartFile:
    return StartFile(41, BOOT, start_ns, list(devices))


def tpu(identity: str = "usb-2-1.3", idle: float = 0.5, active: float = 2.0, shares=None) -> StartDevice:
    return StartDevice(identity, "edgetpu", figures.model_source(idle, active), None, shares)


def compute(start: StartFile, seconds: float, **kwargs) -> list[DeviceEnergy]:
    return figures.device_figures(
        start, "libnvidia-ml.so.1", end_ns=start.start_ns + int(seconds * S), boot=BOOT, **kwargs
    )


def test_an_edge_tpu_without_busy_time_is_its_idle_power_over_the_allocation():
    [figure] = compute(start_file(tpu()), 600)
    assert (figure.method, figure.seconds) == ("estimated", 600)
    assert figure.joules == pytest.approx(0.5 * 600)
    assert "idle power only" in figure.note


def test_self_reported_busy_time_adds_active_power_and_says_so():
    start = start_file(tpu())
    busy = figures.busy_times(start, {"usb-2-1.3": 100.0}, None)
    [figure] = compute(start, 600, busy=busy)
    assert figure.method == "self-reported"
    assert figure.joules == pytest.approx(0.5 * 600 + (2.0 - 0.5) * 100)


@pytest.mark.parametrize("shares", [None, (1, 4), (3, 4), (9, 4)])
def test_self_reported_busy_time_never_pushes_the_estimate_past_active_power_times_the_allocation(shares):
    """A job writes its own usage record: whatever it claims, its figure stays within active watts
    x the seconds it held the device (a share: its part of them)."""
    start = start_file(tpu(shares=shares))
    for claimed in (0.0, 599.0, 600.0, 10**6, 10.0**9):
        busy = figures.busy_times(start, {"usb-2-1.3": claimed}, None)
        [figure] = compute(start, 600, busy=busy)
        share = 1.0 if shares is None else min(1.0, shares[0] / shares[1])
        assert 0 <= figure.joules <= 2.0 * 600 * share + 1e-9
    # The bound is reached, not merely respected: a claim past the allocation is the allocation.
    assert figure.joules == pytest.approx(2.0 * 600 * share)


def test_a_shard_jobs_estimate_uses_the_brokers_busy_time():
    start = start_file(tpu(shares=(2, 4)))
    busy = figures.busy_times(start, {}, broker_busy_ms=30_000.0)
    [figure] = compute(start, 600, busy=busy)
    assert figure.method == "estimated" and "broker" in figure.note
    assert figure.joules == pytest.approx(0.5 * 600 * 0.5 + 1.5 * 30)
    # Root's busy time counts whole past the job's share of the seconds (the broker ran its inferences on
    # the device, whatever the share of its idle time): 400 s busy of 600 s, holding 2 of 4 shares.
    busy = figures.busy_times(start, {}, broker_busy_ms=400_000.0)
    [figure] = compute(start, 600, busy=busy)
    assert figure.joules == pytest.approx(0.5 * 600 * 0.5 + 1.5 * 400)
    # It is bounded by the job's seconds: never more active time than the job ran.
    busy = figures.busy_times(start, {}, broker_busy_ms=10.0**9)
    [figure] = compute(start, 600, busy=busy)
    assert figure.joules == pytest.approx(0.5 * 600 * 0.5 + 1.5 * 600)


def test_the_brokers_busy_time_wins_over_a_record_the_job_wrote():
    start = start_file(tpu(shares=(1, 4)))
    busy = figures.busy_times(start, {"usb-2-1.3": 10.0**6}, broker_busy_ms=4000.0)
    assert busy == {"usb-2-1.3": (4.0, "estimated", "busy time measured by the node's TPU broker")}


def test_a_reboot_between_start_and_end_makes_every_figure_unavailable():
    start = start_file(tpu(), StartDevice("pci-0000:41:00.0", "gpu", "nvml-energy:00000000:41:00.0", 5.0, None))
    found = figures.device_figures(start, "x", end_ns=start.start_ns + S, boot="another-boot")
    assert [(f.joules, f.method) for f in found] == [(None, "unavailable")] * 2
    assert all("rebooted" in f.note for f in found)


def test_a_device_without_a_source_says_why():
    start = start_file(
        StartDevice("platform-17000000.gpu", "gpu", "none:Jetson's GPU has no NVML power readings", None, None)
    )
    [figure] = compute(start, 60)
    assert (figure.joules, figure.method, figure.note) == (
        None,
        "unavailable",
        "Jetson's GPU has no NVML power readings",
    )


def test_polled_power_without_an_agent_or_samples_is_unavailable_and_with_samples_integrated(tmp_path):
    power = tmp_path / "power1_average"
    device = StartDevice("pci-0000:03:00.0", "gpu", f"hwmon-power:{power}", None, None)
    start = start_file(device)
    [figure] = compute(start, 60)
    assert (figure.method, figure.note) == ("unavailable", figures.NO_AGENT)
    [figure] = compute(start, 60, poll={})
    assert figure.method == "unavailable" and "no power sample" in figure.note
    state = PollState(device.identity, 500.0, 6, start.start_ns + 50 * S, 10.0)
    # No power reading at the end: the last stretch (10 s) at the last sample's watts.
    [figure] = compute(start, 60, poll={device.identity: state})
    assert (figure.method, figure.joules) == ("integrated", pytest.approx(500.0 + 10.0 * 10))


def test_a_figure_beyond_any_device_is_refused_whole():
    start = start_file(tpu(idle=9000.0, active=9999.0))
    busy = figures.busy_times(start, {"usb-2-1.3": 60.0}, None)
    [figure] = compute(start, 60, busy=busy)
    assert figure.method == "self-reported"  # 9999 W is within the bound: a model's figure stands
    start = start_file(StartDevice("x", "gpu", "hwmon-power:/nonexistent", None, None))
    state = PollState("x", 10.0**9, 3, start.start_ns + 60 * S, 1.0)
    [figure] = compute(start, 60, poll={"x": state})
    assert figure.method == "unavailable" and "implausible" in figure.note


def test_a_malformed_model_is_unavailable_not_an_error():
    start = start_file(StartDevice("usb-2-1.3", "edgetpu", "model:2:0.5", None, None))
    [figure] = compute(start, 60)
    assert figure.method == "unavailable" and "idle:active" in figure.note


def test_start_readings_of_modelled_devices_load_no_nvml():
    devices = [tpu(), tpu("pci-0000:01:00.0", 0.3, 2.0, (1, 4))]
    # A library that does not exist: opening it would be a problem line; none is opened.
    start, problems = figures.start_readings(41, devices, "/nonexistent/libnvidia-ml.so.1")
    assert problems == [] and [d.source for d in start.devices] == [d.source for d in devices]
    assert start.boot == figures.boot_id() and start.boot
    assert energy.decode(energy.encode(start), "start") == start
    assert start.uid == -1 and b"uid=" not in energy.encode(start)  # a start file from before uid: unknown
    mine, _ = figures.start_readings(41, devices, "/nonexistent/libnvidia-ml.so.1", uid=1001)
    assert energy.decode(energy.encode(mine), "start").uid == 1001


@pytest.mark.skipif(os.geteuid() != 0, reason="the state directory must be root-owned")
def test_the_start_file_is_roots_in_a_root_only_directory_and_is_read_once(tmp_path):
    os.chmod(tmp_path, 0o755)
    fd = statedir.open_dir(str(tmp_path / "state"), create=True)
    try:
        start = start_file(tpu())
        figures.write_start(fd, start)
        directory = tmp_path / "state" / energy.DIR
        info, dir_info = (directory / "41").stat(), directory.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o600)
        assert (dir_info.st_uid, stat.S_IMODE(dir_info.st_mode)) == (0, 0o700)
        state = PollState("usb-2-1.3", 1.0, 1, start.start_ns + 5, 2.0, start_ns=start.start_ns, boot=BOOT)
        (directory / "41.poll").write_bytes(energy.encode_poll([state]))
        assert _has_energy_start(str(tmp_path / "state"), 41)
        got, poll, why = figures.take_start(fd, 41)
        assert (got, why) == (start, "") and poll is not None and poll["usb-2-1.3"].samples == 1
        assert os.listdir(directory) == []
        assert figures.take_start(fd, 41) == (None, None, "")
        # A link planted where the start file goes is never followed, and costs only the figure.
        os.symlink("/etc/shadow", directory / "42")
        got, _, why = figures.take_start(fd, 42)
        assert got is None and "symlink" in why and not (directory / "42").exists()
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="the state directory must be root-owned")
def test_running_jobs_figures_so_far_are_the_epilogs_computation_now_and_change_no_file(tmp_path):
    """What the metrics show of a running job: its start file read as the Epilog reads it, with now as
    the end; the start and poll files stay as they were, and a file that does not decode is passed over."""
    os.chmod(tmp_path, 0o755)
    fd = statedir.open_dir(str(tmp_path / "state"), create=True)
    try:
        gpu = StartDevice("pci-0000:41:00.0", "gpu", "nvml-power:00000000:41:00.0", None, None)
        started = figures.clock_ns() - 60 * S
        ours = StartFile(41, figures.boot_id(), started, [tpu(), gpu], 1001)
        figures.write_start(fd, ours)
        directory = tmp_path / "state" / energy.DIR
        (directory / "41.poll").write_bytes(
            energy.encode_poll([PollState(gpu.identity, 900.0, 3, started, 50.0, start_ns=started, boot=ours.boot)])
        )
        (directory / "42").write_bytes(b"not a start file")
        before = {name: (directory / name).read_bytes() for name in os.listdir(directory)}
        busy = figures.busy_times(ours, {"usb-2-1.3": 10.0}, None)
        [(start, found)] = figures.figures_so_far(fd, "/nonexistent/libnvidia-ml.so.1", lambda _: busy)
        assert (start.job_id, start.uid) == (41, 1001)
        by_identity = {figure.identity: figure for figure in found}
        model = by_identity["usb-2-1.3"]
        assert model.method == "self-reported" and model.seconds >= 60
        assert model.joules == pytest.approx(0.5 * model.seconds + 1.5 * 10.0)
        # Polled power: the integral so far and the last sample over the stretch since (NVML cannot open).
        polled = by_identity[gpu.identity]
        assert polled.method == "integrated" and polled.joules >= 900.0 + 50.0 * 59
        assert {name: (directory / name).read_bytes() for name in os.listdir(directory)} == before
        # No energy directory at all (no job ever metered here): nothing.
        empty = statedir.open_dir(str(tmp_path / "empty"), create=True)
        try:
            assert figures.figures_so_far(empty, "libnvidia-ml.so.1", lambda _: {}) == []
        finally:
            os.close(empty)
    finally:
        os.close(fd)


def test_an_amd_gpus_polled_power_ends_with_its_hwmon_reading_now(tmp_path):
    hwmon = tmp_path / "bus" / "pci" / "devices" / "0000:03:00.0" / "hwmon" / "hwmon2"
    hwmon.mkdir(parents=True)
    (hwmon / "power1_average").write_text("150000000\n")  # µW: 150 W now
    device = StartDevice("pci-0000:03:00.0", "gpu", f"hwmon-power:{hwmon}/power1_average", None, None)
    start = start_file(device)
    state = PollState(device.identity, 5000.0, 10, start.start_ns + 50 * S, 100.0)
    [figure] = compute(start, 60, poll={device.identity: state}, sysfs_root=str(tmp_path))
    # The sampler's integral, then the last 10 s at the mean of its last sample and the reading now.
    assert (figure.method, figure.joules) == ("integrated", pytest.approx(5000.0 + (100.0 + 150.0) / 2 * 10))
    # A power file outside the sysfs root is never read: the last sample's watts carry the stretch.
    [figure] = compute(start, 60, poll={device.identity: state}, sysfs_root=str(tmp_path / "elsewhere"))
    assert figure.joules == pytest.approx(5000.0 + 100.0 * 10)


def test_a_polled_figure_is_never_stretched_over_a_long_gap_without_samples(tmp_path):
    """More than 3 sampler periods without a sample before the first, between two or after the last
    (an agent that was down) makes the figure unavailable, naming the gap; within them it counts."""
    device = StartDevice("pci-0000:03:00.0", "gpu", f"hwmon-power:{tmp_path}/power1_average", None, None)
    start = start_file(device)
    t0 = start.start_ns

    def figure(first_s: float, last_s: float, gap_s: float = 5.0, seconds: float = 600) -> DeviceEnergy:
        state = PollState(
            device.identity, 1000.0, 10, t0 + int(last_s * S), 10.0, t0 + int(first_s * S), int(gap_s * S), t0, BOOT
        )
        [found] = compute(start, seconds, poll={device.identity: state}, poll_s=5.0)
        return found

    assert figure(first_s=5, last_s=595).method == "integrated"
    assert figure(first_s=15, last_s=585, gap_s=15).method == "integrated"  # exactly 3 periods: counted
    late = figure(first_s=400, last_s=595)
    assert (late.method, late.joules) == ("unavailable", None)
    assert late.note == "no power sample for 400 s before the first sample (the sampler polls every 5 s): not counted"
    stopped = figure(first_s=5, last_s=100)  # the agent died 100 s in: not 500 s at its last reading
    assert stopped.method == "unavailable" and "500 s after the last sample" in stopped.note
    gap = figure(first_s=5, last_s=595, gap_s=300)
    assert gap.method == "unavailable" and "300 s between two samples" in gap.note
