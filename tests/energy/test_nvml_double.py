"""The NVML double keeps NVML's observable rules (the public nvml.h): reference-counted init, calls
before init refused, GPUs found at init in PCI order, NVML's return codes for short buffers and bad
arguments. Called through ctypes directly, as any NVML client would."""

from __future__ import annotations

import ctypes

import pytest

import nvml_double


class PciInfo(ctypes.Structure):
    """nvmlPciInfo_t (nvml.h): what nvmlDeviceGetPciInfo_v3 fills."""

    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


@pytest.fixture
def nvml(tmp_path, monkeypatch):
    """A freshly built double (its own process-wide state) with three GPUs, written out of order."""
    try:
        path = nvml_double.build(tmp_path / "lib")
    except RuntimeError as exc:
        pytest.skip(str(exc))
    state = tmp_path / "gpus"
    nvml_double.set_gpu(state, "00000000:c1:00.0", energy_mj=3, uuid="GPU-c")
    nvml_double.set_gpu(state, "00000000:01:00.0", energy_mj=1, uuid="GPU-a")
    nvml_double.set_gpu(state, "00000000:41:00.0", energy_mj=2, uuid="GPU-b")
    (state / "README").write_text("not a GPU\n")
    monkeypatch.setenv(nvml_double.STATE_VARIABLE, str(state))
    lib = ctypes.CDLL(str(path))
    lib.nvmlErrorString.restype = ctypes.c_char_p
    return lib


def test_calls_before_init_and_a_shutdown_too_many_are_uninitialized(nvml):
    count = ctypes.c_uint()
    assert nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 1  # NVML_ERROR_UNINITIALIZED
    assert nvml.nvmlShutdown() == 1
    assert nvml.nvmlInit_v2() == 0
    assert nvml.nvmlInit_v2() == 0
    assert nvml.nvmlShutdown() == 0
    assert nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 and count.value == 3  # still initialised once
    assert nvml.nvmlShutdown() == 0
    assert nvml.nvmlShutdown() == 1
    assert nvml.nvmlErrorString(1) == b"Uninitialized"


def test_gpus_are_in_pci_order_with_their_bus_ids_and_uuids(nvml):
    assert nvml.nvmlInit_v2() == 0
    try:
        seen = []
        for index in range(3):
            handle, info, uuid = ctypes.c_void_p(), PciInfo(), ctypes.create_string_buffer(96)
            assert nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0
            assert nvml.nvmlDeviceGetPciInfo_v3(handle, ctypes.byref(info)) == 0
            assert nvml.nvmlDeviceGetUUID(handle, uuid, 96) == 0
            seen.append((info.busId.decode(), uuid.value.decode()))
        assert seen == [
            ("00000000:01:00.0", "GPU-a"),
            ("00000000:41:00.0", "GPU-b"),
            ("00000000:C1:00.0", "GPU-c"),
        ]
        handle = ctypes.c_void_p()
        assert nvml.nvmlDeviceGetHandleByIndex_v2(3, ctypes.byref(handle)) == 2  # INVALID_ARGUMENT
        assert nvml.nvmlDeviceGetHandleByPciBusId_v2(b"00000000:C1:00.0", ctypes.byref(handle)) == 0
        short = ctypes.create_string_buffer(4)
        assert nvml.nvmlDeviceGetUUID(handle, short, 4) == 7  # INSUFFICIENT_SIZE
        assert nvml.nvmlDeviceGetTotalEnergyConsumption(handle, None) == 2
        assert nvml.nvmlDeviceGetTotalEnergyConsumption(ctypes.c_void_p(8), ctypes.byref(ctypes.c_ulonglong())) == 2
    finally:
        nvml.nvmlShutdown()
