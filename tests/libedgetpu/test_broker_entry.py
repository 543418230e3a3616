"""A TPU shard's "broker:<endpoint>" entry in EDGETPU_VISIBLE_DEVICES, as the REAL libedgetpu (our
patches) lists it on a node with whole Edge TPUs (big_node.umockdev): after the job's whole devices,
as one USB Edge TPU named by its endpoint, never hiding or reordering a whole one. Forwarding itself
(a broker answering) is tests/broker/test_forwarding.py."""

from __future__ import annotations

from libedgetpu_support import run_probe

from helpers import HARDWARE

NODE = HARDWARE / "big_node.umockdev"
ENDPOINT = "/run/slurm-tpu/broker/jobs/5.sock"


def listed(library: str, visible: str) -> list[str]:
    return run_probe("visible_probe.py", NODE, [library, "list"], {"EDGETPU_VISIBLE_DEVICES": visible})["listed"]


def test_the_shard_comes_after_the_jobs_whole_tpus(library):
    visible = f"/dev/apex_2,/sys/bus/usb/devices/2-1,broker:{ENDPOINT}"
    assert listed(library, visible) == ["pci:/dev/apex_2", "usb:/sys/bus/usb/devices/2-1", f"usb:broker:{ENDPOINT}"]


def test_a_shard_alone_is_the_only_tpu_listed(library):
    assert listed(library, f"broker:{ENDPOINT}") == [f"usb:broker:{ENDPOINT}"]
    assert listed(library, f" broker:{ENDPOINT} ,broker:{ENDPOINT}") == [f"usb:broker:{ENDPOINT}"]  # once


def test_without_a_broker_entry_nothing_changes(library):
    assert listed(library, "/dev/apex_3") == ["pci:/dev/apex_3"]
