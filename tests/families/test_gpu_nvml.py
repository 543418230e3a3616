"""NVML enrichment keeps the GPU family's typed details and their JSON shape.

NVML needs an NVIDIA driver and GPU, which this machine lacks: a stand-in pynvml
module (the boundary) answers for one bus id; everything else is the real code.
"""

from __future__ import annotations

import json
import sys
import types

from slurm_tpu.detect import inventory_from_snapshot
from slurm_tpu.detect.nvml import enrich_with_nvml
from slurm_tpu.families import inventory_from_json
from slurm_tpu.families.gpu import NvidiaDetails
from slurm_tpu.families.sysfs import Snapshot, SysDevice

GPU = SysDevice(sys_path="/sys/devices/pci0000:00/0000:41:00.0", sys_name="0000:41:00.0", subsystem="pci",
                driver="nvidia", attributes={"vendor": "0x10de", "device": "0x20b2", "class": "0x030200"})


def test_nvml_adds_memory_uuid_and_name_to_the_typed_details(monkeypatch):
    snapshot = Snapshot({GPU.sys_path: GPU}, nvidia_proc={"0000:41:00.0": {"Device Minor": "0"}},
                        dev_entries=frozenset({"/dev/nvidia0"}))
    inventory = inventory_from_snapshot(snapshot)
    assert inventory.accelerators[0].details.to_json() == {"uuid": None, "minor_source": "procfs", "minor": 0}
    nvml = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByPciBusId=lambda bus_id: bus_id,
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(total=80 << 30),
        nvmlDeviceGetName=lambda handle: b"NVIDIA A100-SXM4-80GB",
        nvmlDeviceGetUUID=lambda handle: "GPU-1234")
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    (gpu,) = enrich_with_nvml(inventory).accelerators
    assert gpu.model == "NVIDIA A100-SXM4-80GB"
    assert gpu.details == NvidiaDetails(uuid="GPU-1234", minor=0, minor_source="procfs", memory_bytes=80 << 30,
                                        nvml=True)
    # The same keys, in the same order, as before details were typed.
    assert list(gpu.details.to_json()) == ["uuid", "minor_source", "minor", "memory_bytes", "nvml"]
    document = json.loads(json.dumps(enrich_with_nvml(inventory).to_json()))
    assert inventory_from_json(document).accelerators[0].details == gpu.details
    assert gpu.details.notes() == ["80 GiB"]
