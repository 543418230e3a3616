"""slurm_tpu/energy/sampler.py, one pass at a time (Sampler.poll_once) with its clock in the test's
hands: power driven through the NVML double and a hwmon file, integrated into each job's poll file;
every problem costs that job's (or that device's) samples, never the others' nor the sampler."""

from __future__ import annotations

import os
import stat

import pytest

import nvml_double
from slurm_tpu.access import statedir
from slurm_tpu.energy.sampler import Sampler
from slurm_tpu.protocol.energy import DIR, StartDevice, StartFile, decode_poll, encode

GPU = "00000000:41:00.0"
BOOT = "6f1c2d9e-boot"
START_NS = 50 * 10**9
SECOND = 10**9

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the state directory is root's")


class Node:
    """A node's state directory, its GPUs (the double's state) and an AMD GPU's hwmon file."""

    def __init__(self, root, monkeypatch):
        self.state = root / "state"
        self.energy = self.state / DIR
        self.energy.mkdir(parents=True, mode=0o700)
        os.chmod(self.state, 0o700)
        self.gpus = root / "gpus"
        self.gpus.mkdir()
        monkeypatch.setenv(nvml_double.STATE_VARIABLE, str(self.gpus))
        self.sysfs = root / "sys"
        hwmon = self.sysfs / "devices/pci0000:00/0000:03:00.0/hwmon/hwmon2"
        hwmon.mkdir(parents=True)
        self.hwmon = hwmon / "power1_average"
        self.now = START_NS
        self.lines: list[str] = []

    def gpu_watts(self, watts: int) -> None:
        nvml_double.set_gpu(self.gpus, GPU, power_mw=watts * 1000)

    def amd_watts(self, watts: int) -> None:
        self.hwmon.write_text(f"{watts * 10**6}\n")

    def start(self, job: int, *devices: StartDevice, boot: str = BOOT) -> None:
        fd = statedir.open_dir(str(self.energy))
        try:
            statedir.write_atomic(fd, str(job), encode(StartFile(job, boot, START_NS, list(devices))), 0o600)
        finally:
            os.close(fd)

    def poll(self, job: int):
        path = self.energy / f"{job}.poll"
        return decode_poll(path.read_bytes(), str(path)) if path.exists() else None

    def sampler(self, library: str) -> Sampler:
        return Sampler(
            str(self.state), 5, library, str(self.sysfs), self.lines.append, clock=lambda: self.now, boot=BOOT
        )


@pytest.fixture
def node(tmp_path, monkeypatch):
    return Node(tmp_path, monkeypatch)


def gpu(identity: str = "gpu-a", bus: str = GPU) -> StartDevice:
    return StartDevice(identity, "gpu", f"nvml-power:{bus}", None, None)


def amd(node: Node) -> StartDevice:
    return StartDevice("amd-0", "gpu", f"hwmon-power:{node.hwmon}", None, None)


def test_polled_power_is_integrated_in_trapezoids_from_the_jobs_start(node, library):
    node.gpu_watts(100)
    node.amd_watts(50)
    counter = StartDevice("gpu-b", "gpu", "nvml-energy:00000000:81:00.0", 5.0, None)  # the Epilog's, not polled
    model = StartDevice("usb-1-2", "edgetpu", "model:0.5:2", None, (1, 2))
    node.start(7, gpu(), amd(node), counter, model)
    sampler = node.sampler(library)
    try:
        node.now = START_NS + 2 * SECOND
        assert sampler.poll_once() == 1
        polled = node.poll(7)
        # Before the first sample: the first reading over the stretch since the job's start.
        assert (polled["gpu-a"].joules, polled["gpu-a"].samples, polled["gpu-a"].last_watts) == (200, 1, 100)
        assert polled["gpu-a"].last_ns == START_NS + 2 * SECOND
        assert (polled["amd-0"].joules, polled["amd-0"].samples) == (100, 1)
        assert set(polled) == {"gpu-a", "amd-0"}
        node.gpu_watts(300)
        node.amd_watts(70)
        node.now += 4 * SECOND
        assert sampler.poll_once() == 1
        polled = node.poll(7)
        assert (polled["gpu-a"].joules, polled["gpu-a"].samples, polled["gpu-a"].last_watts) == (1000, 2, 300)
        assert (polled["amd-0"].joules, polled["amd-0"].samples) == (100 + 240, 2)
        info = os.lstat(node.energy / "7.poll")
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o600)
        assert node.lines == []
    finally:
        sampler.close()


def test_a_lost_gpu_costs_its_samples_only_and_sampling_resumes_when_it_is_back(node, library):
    node.gpu_watts(100)
    node.amd_watts(10)
    node.start(8, gpu(), amd(node))
    sampler = node.sampler(library)
    try:
        node.now += SECOND
        sampler.poll_once()
        nvml_double.set_gpu(node.gpus, GPU, power_mw=100_000, lost=True)  # fallen off the bus
        node.now += SECOND
        assert sampler.poll_once() == 1
        polled = node.poll(8)
        assert (polled["gpu-a"].samples, polled["amd-0"].samples) == (1, 2)
        assert node.lines == [
            f"energy sampler: job 8: NVML: GPU {GPU}: nvmlDeviceGetPowerUsage: GPU is lost (NVML error 15)"
        ]
        node.now += SECOND
        sampler.poll_once()
        assert len(node.lines) == 1  # the same problem is said once
        node.gpu_watts(300)  # back (NVML was opened again after the error)
        node.now += SECOND
        sampler.poll_once()
        polled = node.poll(8)
        # One trapezoid over the gap, from the last sample to this one.
        assert (polled["gpu-a"].samples, polled["gpu-a"].joules) == (2, 100 + (100 + 300) / 2 * 3)
        nvml_double.set_gpu(node.gpus, GPU, lost=True)  # lost again: a new episode, said again
        node.now += SECOND
        sampler.poll_once()
        assert len(node.lines) == 2 and node.lines[0] == node.lines[1]
    finally:
        sampler.close()


def test_no_nvml_costs_the_gpus_samples_and_nvml_is_opened_once_it_can_be(node, library):
    node.amd_watts(20)
    node.start(9, gpu(), amd(node))
    os.rmdir(node.gpus)  # the double's "no driver"
    sampler = node.sampler(library)
    try:
        node.now += SECOND
        sampler.poll_once()
        assert set(node.poll(9)) == {"amd-0"}
        assert node.lines == [f"energy sampler: NVML ({library}) did not start: Driver Not Loaded (NVML error 9)"]
        node.gpu_watts(150)  # the driver is loaded
        node.now += SECOND
        sampler.poll_once()
        assert node.poll(9)["gpu-a"].last_watts == 150
    finally:
        sampler.close()


def test_a_bad_or_foreign_file_costs_its_job_only(node, library, tmp_path):
    node.gpu_watts(100)
    node.start(10, gpu())
    node.start(11, gpu(), boot="another-boot")  # its times are of another boot
    (node.energy / "12").write_bytes(b"not a start file\n")
    os.symlink(node.energy / "10", node.energy / "13")  # a link is never followed
    node.start(14, gpu())
    (node.energy / "14.poll").write_bytes(b"garbage\n")  # left as it is: the Epilog says unavailable
    node.start(15, gpu("gpu-x", "00000000:99:00.0"))  # no such GPU
    sampler = node.sampler(library)
    try:
        node.now += SECOND
        assert sampler.poll_once() == 1
        assert node.poll(10)["gpu-a"].samples == 1
        assert not (node.energy / "11.poll").exists()
        assert not (node.energy / "12.poll").exists()
        assert not (node.energy / "13.poll").exists()
        assert (node.energy / "14.poll").read_bytes() == b"garbage\n"
        assert not (node.energy / "15.poll").exists()
        assert sorted(node.lines) == [
            "energy sampler: energy/14.poll is not a slurm-tpu power poll file (not format version 2): "
            "left as it is, job 14 is not sampled",
            "energy sampler: job 11's start file is from another boot: not sampled",
            "energy sampler: job 12: FormatError: energy/12 is not a slurm-tpu energy start file "
            "(line 'not a start file' is not key=value)",
            "energy sampler: job 13: StateDirError: 13 in the state directory is a symlink; refusing to read it",
            "energy sampler: job 15: NVML: GPU 00000000:99:00.0: nvmlDeviceGetPowerUsage: Not Found (NVML error 6)",
        ]
    finally:
        sampler.close()


def test_a_poll_file_whose_job_ended_is_removed_and_no_energy_dir_is_nothing_to_do(node, library):
    node.gpu_watts(100)
    (node.energy / "16.poll").write_bytes(b"")  # the Epilog took job 16's start file as we wrote this
    sampler = node.sampler(library)
    try:
        assert sampler.poll_once() == 0
        assert os.listdir(node.energy) == []
        os.rmdir(node.energy)
        assert sampler.poll_once() == 0
        assert node.lines == []
    finally:
        sampler.close()


def test_a_period_that_would_never_wait_is_refused(node, library):
    for period in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="period must be over 0 s"):
            Sampler(str(node.state), period, library)


def test_a_requeued_job_id_starts_its_integral_anew_whatever_the_last_run_left(node, library):
    """The reviewer's race (/tmp/review-energy/stale.py): the sampler writes run 1's integral after
    run 1's Epilog took its files and run 2's Prolog wrote its start file. Run 2 never inherits it."""
    from slurm_tpu.energy import figures

    node.amd_watts(100)
    node.start(7, amd(node))
    sampler = node.sampler(library)
    try:
        for _ in range(3):
            node.now += 500 * SECOND
            assert sampler.poll_once() == 1
        run1 = (node.energy / "7.poll").read_bytes()
        assert node.poll(7)["amd-0"].joules == pytest.approx(150_000)
        # Run 1 ends, run 2 starts 1 s later (its Prolog removes run 1's poll file) ...
        node.now += SECOND
        fd = statedir.open_dir(str(node.state))
        try:
            assert figures.take_start(fd, 7)[0] is not None
            figures.write_start(fd, StartFile(7, BOOT, node.now, [amd(node)]))
            assert not (node.energy / "7.poll").exists()
            # ... and the sampler, which read run 1's files before, writes run 1's integral now.
            (node.energy / "7.poll").write_bytes(run1)
            os.chmod(node.energy / "7.poll", 0o600)
            start2 = node.now
            # Run 2's Epilog without a sample of its own: the stale file is not counted.
            _, poll, why = figures.take_start(fd, 7)
            assert poll is None and "earlier run of job 7" in why
            figures.write_start(fd, StartFile(7, BOOT, start2, [amd(node)]))
            (node.energy / "7.poll").write_bytes(run1)
            os.chmod(node.energy / "7.poll", 0o600)
        finally:
            os.close(fd)
        # The sampler's next pass restarts from run 2's start: 100 s at 100 W, not run 1's 150 kJ on top.
        node.now += 100 * SECOND
        assert sampler.poll_once() == 1
        state = node.poll(7)["amd-0"]
        assert (state.joules, state.samples, state.start_ns) == (pytest.approx(10_000), 1, start2)
    finally:
        sampler.close()
