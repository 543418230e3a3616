"""slurm_tpu/energy/nvml.py against the NVML double (tests/nvml_double): a GPU's counter and power
read by bus id, NOT_SUPPORTED as None, and every other failure one line naming what failed."""

from __future__ import annotations

import pytest

import nvml_double
from slurm_tpu.energy.nvml import Nvml, NvmlError

GPU_A, GPU_B = "00000000:41:00.0", "00000000:81:00.0"


def test_reads_a_gpus_energy_counter_and_power_by_bus_id(library, gpus):
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=123_456_789_012, power_mw=250_500)
    nvml_double.set_gpu(gpus, GPU_B, energy_mj=7, power_mw=60_000)
    with Nvml(library) as nvml:
        assert nvml.energy_mj(GPU_A) == 123_456_789_012
        assert nvml.power_w(GPU_A) == 250.5
        assert nvml.energy_mj(GPU_B) == 7
        # Every read is a new reading: the counter moved on.
        nvml_double.set_gpu(gpus, GPU_A, energy_mj=123_456_790_000, power_mw=300_000)
        assert nvml.energy_mj(GPU_A) == 123_456_790_000
        assert nvml.power_w(GPU_A) == 300.0


def test_a_reading_the_gpu_does_not_have_is_none(library, gpus):
    nvml_double.set_gpu(gpus, GPU_A, power_mw=90_000)  # pre-Volta: power, no energy counter
    nvml_double.set_gpu(gpus, GPU_B)  # a Jetson-like GPU: neither
    with Nvml(library) as nvml:
        assert nvml.energy_mj(GPU_A) is None
        assert nvml.power_w(GPU_A) == 90.0
        assert nvml.energy_mj(GPU_B) is None
        assert nvml.power_w(GPU_B) is None


def test_the_bus_id_forms_nvml_accepts_name_the_same_gpu(library, gpus):
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=42)
    with Nvml(library) as nvml:
        assert nvml.energy_mj("0000:41:00.0") == 42  # the legacy 4-digit domain
        assert nvml.energy_mj("41:00.0") == 42  # bus:device.function


def test_an_unknown_bus_id_is_one_line_naming_it(library, gpus):
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=1)
    with Nvml(library) as nvml, pytest.raises(NvmlError) as caught:
        nvml.energy_mj("00000000:42:00.0")
    assert str(caught.value) == (
        "NVML: GPU 00000000:42:00.0: nvmlDeviceGetTotalEnergyConsumption: Not Found (NVML error 6)"
    )
    assert (caught.value.key, caught.value.code) == ("00000000:42:00.0", 6)


def test_a_bus_id_that_is_not_one_is_refused_on_one_line(library, gpus):
    with Nvml(library) as nvml:
        for bad in ("not-a-bus\nid", "", "0:1:2:3:4"):
            with pytest.raises(NvmlError) as caught:
                nvml.power_w(bad)
            message = str(caught.value)
            assert "\n" not in message and "Invalid Argument (NVML error 2)" in message
            assert caught.value.key == bad


def test_a_gpu_that_fell_off_the_bus_is_an_error_not_a_reading(library, gpus):
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=5, power_mw=1000)
    nvml_double.set_gpu(gpus, GPU_B, energy_mj=5, lost=True)
    with Nvml(library) as nvml:
        assert nvml.energy_mj(GPU_A) == 5
        nvml_double.remove_gpu(gpus, GPU_A)
        with pytest.raises(NvmlError) as caught:
            nvml.power_w(GPU_A)
        assert str(caught.value) == f"NVML: GPU {GPU_A}: nvmlDeviceGetPowerUsage: GPU is lost (NVML error 15)"
        with pytest.raises(NvmlError, match="GPU is lost"):
            nvml.energy_mj(GPU_B)


def test_a_library_that_does_not_exist_is_named(tmp_path):
    missing = str(tmp_path / "libnvidia-ml.so.1")
    with pytest.raises(NvmlError) as caught:
        Nvml(missing)
    assert str(caught.value).startswith(f"cannot load NVML ({missing}): ")
    assert "\n" not in str(caught.value) and caught.value.key == missing


def test_a_library_that_is_not_nvml_is_named(tmp_path):
    import ctypes.util

    libc = ctypes.util.find_library("c")
    with pytest.raises(NvmlError) as caught:
        Nvml(libc)
    assert str(caught.value).startswith(f"{libc} is not a usable NVML: ")


def test_no_driver_is_an_error_naming_the_library(library, tmp_path, monkeypatch):
    monkeypatch.setenv(nvml_double.STATE_VARIABLE, str(tmp_path / "no-driver"))
    with pytest.raises(NvmlError) as caught:
        Nvml(library)
    assert str(caught.value) == f"NVML ({library}) did not start: Driver Not Loaded (NVML error 9)"


def test_initialisations_are_counted_and_a_closed_one_reads_nothing(library, gpus):
    nvml_double.set_gpu(gpus, GPU_A, energy_mj=9)
    first, second = Nvml(library), Nvml(library)
    first.close()
    first.close()  # once only: the second stays initialised
    assert second.energy_mj(GPU_A) == 9
    with pytest.raises(NvmlError) as caught:
        first.energy_mj(GPU_A)
    assert str(caught.value) == f"NVML ({library}) is closed: GPU {GPU_A} not read"
    second.close()


def test_without_a_variable_the_double_reads_the_state_beside_it(library, monkeypatch):
    from pathlib import Path

    monkeypatch.delenv(nvml_double.STATE_VARIABLE, raising=False)
    beside = Path(library).parent / "state"
    nvml_double.set_gpu(beside, GPU_B, energy_mj=77)
    try:
        with Nvml(library) as nvml:
            assert nvml.energy_mj(GPU_B) == 77
    finally:
        nvml_double.remove_gpu(beside, GPU_B)
