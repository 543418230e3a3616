"""The node inventory file (slurm_tpu.protocol.inventory): what the hooks read of it, and bytes that are not one."""

from __future__ import annotations

import json

import pytest

from slurm_tpu.protocol import FormatError
from slurm_tpu.protocol.inventory import FILE_NAME, KnownDevice, decode, encode, parse_inventory, set_device_nodes

DOCUMENT = {
    "online_cpus": "0-3",
    "accelerators": [
        {
            "identity": "usb-2-1.3",
            "kind": "edgetpu",
            "bus": "usb",
            "device_nodes": ["/dev/bus/usb/002/005"],
            "usable": True,
            "model": "Coral USB Accelerator",
        },
        {"identity": "pci-0000:03:00.0", "kind": "edgetpu", "bus": "pci", "device_nodes": ["/dev/apex_0"]},
        {
            "identity": "pci-0000:41:00.0",
            "kind": "gpu",
            "bus": "pci",
            "device_nodes": ["/dev/nvidia0"],
            "usable": False,
        },
    ],
}


def test_round_trip_keeps_what_the_hooks_do_not_read():
    data = encode(DOCUMENT)
    assert data.endswith(b"}\n") and json.loads(data) == DOCUMENT
    assert decode(data) == DOCUMENT
    assert FILE_NAME == "inventory.json"


def test_the_hooks_see_usable_devices_only():
    devices = parse_inventory(DOCUMENT)
    assert list(devices) == ["usb-2-1.3", "pci-0000:03:00.0"]  # usable unless it says otherwise
    assert devices["usb-2-1.3"] == KnownDevice("usb-2-1.3", "edgetpu", "usb", ("/dev/bus/usb/002/005",))
    assert devices["pci-0000:03:00.0"].primary_node == "/dev/apex_0"


def test_a_devices_nodes_change_only_when_they_differ():
    document = json.loads(encode(DOCUMENT))
    assert not set_device_nodes(document, "usb-2-1.3", ("/dev/bus/usb/002/005",))
    assert set_device_nodes(document, "usb-2-1.3", ("/dev/bus/usb/002/006",))
    assert document["accelerators"][0]["device_nodes"] == ["/dev/bus/usb/002/006"]
    assert not set_device_nodes(document, "usb-9-9", ())  # not a device of this node


@pytest.mark.parametrize(
    "data, words",
    [
        (b"{not json", "inventory.json in the state directory is not JSON"),
        (b"[1, 2]", "is not a `slurm-tpu detect --json` document"),
        (b'{"accelerators": {}}', "is not a `slurm-tpu detect --json` document"),
    ],
)
def test_what_is_no_inventory_is_refused_in_one_line(data, words):
    with pytest.raises(FormatError) as caught:
        decode(data)
    assert words in str(caught.value) and "slurm-tpu gres-conf --output" in str(caught.value)
    assert "\n" not in str(caught.value) and caught.value.source == FILE_NAME
