"""NVML enrichment keeps the GPU family's typed details and their JSON shape.

NVML needs an NVIDIA driver and GPU, which this machine lacks: a stand-in pynvml
module (the boundary) answers for one bus id; everything else is the real code.
"""

from __future__ import annotations

import json
import sys
import types

from slurm_tpu.detect import enrich_with_nvml, inventory_from_snapshot
from slurm_tpu.families import inventory_from_json
from slurm_tpu.families.gpu import NvidiaDetails
from slurm_tpu.families.sysfs import Snapshot, SysDevice

GPU = SysDevice(
    sys_path="/sys/devices/pci0000:00/0000:41:00.0",
    sys_name="0000:41:00.0",
    subsystem="pci",
    driver="nvidia",
    attributes={"vendor": "0x10de", "device": "0x20b2", "class": "0x030200"},
)


def test_nvml_adds_memory_uuid_and_name_to_the_typed_details(monkeypatch):
    snapshot = Snapshot(
        {GPU.sys_path: GPU},
        driver_info={"0000:41:00.0": {"Device Minor": "0"}},
        dev_entries=frozenset({"/dev/nvidia0"}),
    )
    inventory = inventory_from_snapshot(snapshot)
    assert inventory.accelerators[0].details.to_json() == {"uuid": None, "minor_source": "procfs", "minor": 0}
    nvml = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByPciBusId=lambda bus_id: bus_id,
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(total=80 << 30),
        nvmlDeviceGetName=lambda handle: b"NVIDIA A100-SXM4-80GB",
        nvmlDeviceGetUUID=lambda handle: "GPU-1234",
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    (gpu,) = enrich_with_nvml(inventory).accelerators
    assert gpu.model == "NVIDIA A100-SXM4-80GB"
    assert gpu.details == NvidiaDetails(
        uuid="GPU-1234", minor=0, minor_source="procfs", memory_bytes=80 << 30, nvml=True
    )
    # The same keys, in the same order, as before details were typed.
    assert list(gpu.details.to_json()) == ["uuid", "minor_source", "minor", "memory_bytes", "nvml"]
    document = json.loads(json.dumps(enrich_with_nvml(inventory).to_json()))
    assert inventory_from_json(document).accelerators[0].details == gpu.details
    assert gpu.details.notes() == ["80 GiB"]


def test_the_nvidia_drivers_procfs_facts_feed_detection(tmp_path):
    """driver_info() reads the driver's per-GPU ``information`` files as the NVIDIA
    driver writes them (``Key:  value`` lines, bus ids in upper case) and detection
    takes the model, UUID and minor from them."""
    from slurm_tpu.families.gpu import FAMILY

    info = tmp_path / "0000:41:00.0".upper()
    info.mkdir()
    (info / "information").write_text(
        "Model: \t\t NVIDIA A100-SXM4-80GB\nIRQ:   \t\t 150\n"
        "GPU UUID: \t GPU-1c3c1b84-0a39-7d5c-a9e3-000000000000\n"
        "Device Minor: \t 3\nBus Location: \t 0000:41:00.0\n"
    )
    (tmp_path / "0000:42:00.0").mkdir()  # a GPU directory without its file: skipped, not an error
    facts = FAMILY.driver_info(str(tmp_path))
    assert list(facts) == ["0000:41:00.0"]
    snapshot = Snapshot({GPU.sys_path: GPU}, driver_info=facts, dev_entries=frozenset({"/dev/nvidia3"}))
    accelerator = inventory_from_snapshot(snapshot).accelerators[0]
    assert (accelerator.model, accelerator.device_nodes, accelerator.usable) == (
        "NVIDIA A100-SXM4-80GB",
        ("/dev/nvidia3",),
        True,
    )
    assert accelerator.details.to_json() == {
        "uuid": "GPU-1c3c1b84-0a39-7d5c-a9e3-000000000000",
        "minor_source": "procfs",
        "minor": 3,
    }
    assert FAMILY.driver_info(str(tmp_path / "absent")) == {}
