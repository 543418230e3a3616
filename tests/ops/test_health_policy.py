"""Health policy and parsing, on literal data."""

from __future__ import annotations

from slurm_tpu.families.coral import ApexDetails
from slurm_tpu.hardware import Accelerator, Bus, Details, Inventory
from slurm_tpu.ops.health_policy import Action, Problem, decide, drain_reason, find_problems
from slurm_tpu.slurm.parse import parse_node_state


def tpu(identity: str, usable: bool = True, temperature: float | None = None) -> Accelerator:
    details = ApexDetails("apex_0", temperature, (85.0, 90.0)) if temperature is not None else Details()
    return Accelerator(
        identity=identity,
        kind="edgetpu",
        bus=Bus.PCI,
        bus_address=identity[4:],
        vendor_id="1ac1",
        product_id="089a",
        vendor="Global Unichip",
        model="Coral PCIe Accelerator",
        sys_path="/sys/x",
        device_nodes=("/dev/apex_0",),
        usable=usable,
        reason="" if usable else "no driver",
        details=details,
    )


def test_problems_missing_unusable_and_hot():
    live = Inventory((tpu("pci-a", temperature=84.9), tpu("pci-b", usable=False), tpu("pci-c", temperature=85.0)))
    problems = find_problems(["pci-a", "pci-b", "pci-c", "usb-1-1"], live)
    assert [p.identity for p in problems] == ["pci-b", "pci-c", "usb-1-1"]
    assert problems[0].message == "pci-b unusable (no driver)"
    assert problems[1].message == "pci-c at 85.0 C, above its 85 C trip point"
    assert problems[2].message == "usb-1-1 missing"
    assert find_problems([], live) == []


def test_decisions_never_override_an_admin_drain():
    missing = [Problem("usb-1-1", "usb-1-1 missing")]
    assert decide("IDLE", "", missing).action == Action.DRAIN
    assert decide("IDLE", "", missing).reason == "slurm-tpu: usb-1-1 missing"
    assert decide("IDLE+DRAIN", "maintenance", missing).action == Action.NOTHING
    assert decide("IDLE+DRAIN", "maintenance", []).action == Action.NOTHING
    assert decide("MIXED+DRAIN", "slurm-tpu: usb-1-1 missing", missing).action == Action.NOTHING
    assert decide("IDLE+DRAIN", "slurm-tpu: usb-9-9 missing", missing).action == Action.DRAIN  # new reason
    assert decide("IDLE+DRAIN", "slurm-tpu: usb-1-1 missing", []).action == Action.RESUME
    assert decide("IDLE", "", []).action == Action.NOTHING


def test_long_reasons_are_cut():
    reason = drain_reason([Problem(f"usb-{i}-1", f"usb-{i}-1 missing") for i in range(50)])
    assert reason.startswith("slurm-tpu: usb-0-1 missing; ") and len(reason) == 200 and reason.endswith("...")


def test_parse_scontrol_show_node():
    text = """NodeName=n1 Arch=x86_64 CoresPerSocket=1
   CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.00
   Gres=tpu:edgetpu_usb:2,gpu:a100:1(S:0-1)
   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Reason=slurm-tpu: usb-2-1.3 missing; pci-x at 91.0 C [root@2026-11-22T02:30:00]
"""
    assert parse_node_state(text) == {
        "state": "IDLE+DRAIN",
        "gres": "tpu:edgetpu_usb:2,gpu:a100:1(S:0-1)",
        "reason": "slurm-tpu: usb-2-1.3 missing; pci-x at 91.0 C",
    }
    assert parse_node_state("NodeName=n2\n   State=MIXED ThreadsPerCore=1\n") == {
        "state": "MIXED",
        "reason": "",
        "gres": "",
    }


def test_watcher_hold_is_resumed_only_when_the_controller_has_the_new_gres():
    hold = "slurm-tpu: accelerators changed; restart slurmctld, then slurmd on n1, to apply Gres=tpu:x:2"
    assert decide("IDLE+DRAIN", hold, [], "tpu:x:1", "tpu:x:2").action == Action.NOTHING
    assert decide("IDLE+DRAIN", hold, [], "tpu:x:2", "tpu:x:2").action == Action.RESUME
    assert decide("IDLE+DRAIN", hold, [], "gpu:a:1(S:0-1)", "gpu:a:1").action == Action.RESUME
    assert decide("IDLE+DRAIN", hold, [Problem("a", "a missing")], "tpu:x:2", "tpu:x:2").action == Action.NOTHING
    assert decide("IDLE+DRAIN", hold, [], "(null)", "").action == Action.RESUME
