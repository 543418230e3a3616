"""A GPU job's figures (slurm_tpu/energy/figures.py) read through the NVML double (tests/nvml_double):
the counter's delta, a counter that goes back, a GPU without the counter, NVML failing at either end."""

from __future__ import annotations

import os

import pytest

import nvml_double
from slurm_tpu.energy import figures
from slurm_tpu.protocol.energy import PollState, StartDevice

GPU_A, GPU_B = "00000000:41:00.0", "00000000:81:00.0"
S = 10**9


def gpu(bus_id: str = GPU_A) -> StartDevice:
    return StartDevice(f"pci-{bus_id[4:]}", "gpu", f"nvml-energy:{bus_id}", None, None)


def end(start, library, seconds: float = 120.0, **kwargs):
    kwargs.setdefault("boot", start.boot)
    return figures.device_figures(start, library, end_ns=start.start_ns + int(seconds * S), **kwargs)


def test_a_jobs_figure_is_its_own_gpus_counter_delta(library, gpus):
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=123_456_789_012, power_mw=250_000)
    nvml_double.set_gpu(gpus, GPU_B, energy_mj=5_000_000, power_mw=60_000)
    start, problems = figures.start_readings(41, [gpu(GPU_A)], library)
    assert problems == [] and start.devices[0].start == 123_456_789_012
    # The node's other GPU burns far more meanwhile: none of it is this job's.
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=123_456_789_012 + 987_654)
    nvml_double.set_gpu(gpus, GPU_B, energy_mj=5_000_000 + 10**9)
    [figure] = end(start, library)
    assert (figure.identity, figure.method, figure.seconds) == ("pci-0000:41:00.0", "measured", 120.0)
    assert figure.joules == pytest.approx(987.654, abs=1e-3)


def test_a_counter_that_goes_back_is_unavailable_never_negative(library, gpus):
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=10**9)
    start, _ = figures.start_readings(41, [gpu()], library)
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=1_000)  # the driver reloaded: the counter restarted
    [figure] = end(start, library)
    assert (figure.joules, figure.method) == (None, "unavailable")
    assert "went back" in figure.note and "driver reload" in figure.note


def test_a_different_boot_is_unavailable(library, gpus):
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=1_000)
    start, _ = figures.start_readings(41, [gpu()], library)
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=2_000_000)
    [figure] = end(start, library, boot="another-boot")
    assert (figure.joules, figure.method) == (None, "unavailable") and "rebooted" in figure.note


def test_a_jump_no_gpu_could_draw_is_refused(library, gpus):
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=0)
    start, _ = figures.start_readings(41, [gpu()], library)
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=2**63)  # a wrapped or corrupt counter
    [figure] = end(start, library, seconds=60)
    assert (figure.joules, figure.method) == (None, "unavailable") and "implausible" in figure.note


def test_a_gpu_without_the_counter_is_polled_power(library, gpus):
    nvml_double.set_gpu(gpus, GPU_A, power_mw=100_000)  # pre-Volta
    start, problems = figures.start_readings(41, [gpu()], library)
    assert problems == [] and start.devices[0].source == f"nvml-power:{GPU_A}"
    [figure] = end(start, library)
    assert (figure.method, figure.note) == ("unavailable", figures.NO_AGENT)
    # With the sampler's integral: its joules, plus the last stretch at the mean of its last sample
    # and the power read now.
    state = PollState("pci-0000:41:00.0", 11_000.0, 23, start.start_ns + 110 * S, 120.0)
    [figure] = end(start, library, poll={"pci-0000:41:00.0": state})
    assert figure.method == "integrated"
    assert figure.joules == pytest.approx(11_000.0 + (120.0 + 100.0) / 2 * 10)


def test_nvml_failing_at_either_end_costs_only_the_figure(library, gpus, tmp_path):
    start, problems = figures.start_readings(41, [gpu()], str(tmp_path / "no-libnvidia-ml.so.1"))
    assert len(problems) == 1 and "cannot load NVML" in problems[0]
    assert start.devices[0].source.startswith("none:NVML at job start: cannot load NVML")
    [figure] = end(start, library)
    assert figure.method == "unavailable" and figure.note.startswith("NVML at job start")
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=5)
    start, _ = figures.start_readings(41, [gpu()], library)
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=6, lost=True)
    [figure] = end(start, library)
    assert figure.method == "unavailable" and figure.note.startswith("NVML at job end")


def test_a_slow_nvml_init_within_the_deadline_still_gives_the_figure(library, gpus):
    nvml_double.set_driver(gpus, init_delay_ms=300)  # a GPU without persistence mode: a slow init
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=1_000_000)
    start, problems = figures.start_readings(41, [gpu()], library)
    assert problems == [] and start.devices[0].start == 1_000_000
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=1_500_000)
    [figure] = end(start, library)
    assert (figure.method, figure.joules) == ("measured", pytest.approx(500.0))


def test_a_hung_nvml_costs_only_the_figures_that_need_it(library, gpus):
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=1_000_000)
    start, _ = figures.start_readings(41, [gpu()], library)
    nvml_double.set_driver(gpus, hang=True)
    model = StartDevice("usb-2-1.3", "edgetpu", "model:0.5:2", None, None)
    start.devices.append(model)
    found = {f.identity: f for f in end(start, library, seconds=100, deadline_s=0.5)}
    assert found["pci-0000:41:00.0"].method == "unavailable"
    assert found["pci-0000:41:00.0"].note == "the device reads at job end did not answer within 0.5 s: killed"
    assert (found["usb-2-1.3"].method, found["usb-2-1.3"].joules) == ("estimated", pytest.approx(50.0))


def test_the_guard_returns_a_childs_value_or_says_why_there_is_none():
    from slurm_tpu.energy import guard

    assert guard.call(lambda: {"a": (1.5, "", None)}, "reads") == ({"a": (1.5, "", None)}, "")

    def fails():
        raise OSError("no such sensor")

    assert guard.call(fails, "reads") == (None, "reads failed: OSError: no such sensor")
    value, why = guard.call(lambda: os._exit(3), "reads")
    assert value is None and why == "reads ended without an answer (exit status 3)"
