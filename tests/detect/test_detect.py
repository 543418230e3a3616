"""Detection through real libudev on umockdev-described nodes."""

from __future__ import annotations

from helpers import detect_json, run_cli


def by_identity(document: dict) -> dict[str, dict]:
    return {a["identity"]: a for a in document["accelerators"]}


def test_big_node_finds_exactly_the_accelerators():
    found = by_identity(detect_json("big_node"))
    assert sorted(found) == sorted(
        [
            "usb-1-1.4",
            "usb-2-1",
            "pci-0000:03:00.0",
            "pci-0000:04:00.0",
            "pci-0000:05:00.0",
            "pci-0000:06:00.0",
            "pci-0000:41:00.0",
            "pci-0000:c1:00.0",
            "pci-0000:0a:00.0",
            "platform-17000000.gpu",
        ]
    )  # the keyboard and the Intel USB controller are ignored
    assert all(a["usable"] for a in found.values()), [a["reason"] for a in found.values()]
    kinds = {i: a["kind"] for i, a in found.items()}
    assert [i for i, k in kinds.items() if k == "edgetpu"] == [
        "usb-1-1.4",
        "usb-2-1",
        "pci-0000:03:00.0",
        "pci-0000:04:00.0",
        "pci-0000:05:00.0",
        "pci-0000:06:00.0",
    ]


def test_usb_sticks_in_both_modes_and_slow_port():
    found = by_identity(detect_json("big_node"))
    waiting, loaded = found["usb-1-1.4"], found["usb-2-1"]
    assert waiting["vendor_product"] == "1a6e:089a" and waiting["details"]["firmware_loaded"] is False
    assert loaded["vendor_product"] == "18d1:9302" and loaded["details"]["firmware_loaded"] is True
    assert waiting["details"]["slow_link"] is True and waiting["details"]["usb_speed_mbps"] == 480
    assert loaded["details"]["slow_link"] is False
    assert waiting["device_nodes"] == ["/dev/bus/usb/001/007"]
    assert loaded["bus"] == "usb" and loaded["bus_address"] == "2-1"
    # CPU affinity comes from the USB controller the stick hangs off.
    assert loaded["numa_node"] == 0 and loaded["local_cpus"] == "0"


def test_pcie_cards_report_node_temperature_and_serial():
    found = by_identity(detect_json("big_node"))
    card = found["pci-0000:05:00.0"]
    assert card["device_nodes"] == ["/dev/apex_3"]  # apex numbering is not bus order
    assert card["details"]["temperature_c"] == 44.0
    assert card["details"]["trip_points_c"] == [85.0, 90.0, 95.0]
    assert card["details"]["unique_id"] == "a1b2c3d4e5f60003"
    assert card["vendor_product"] == "1ac1:089a" and card["driver"] == "apex"


def test_nvidia_minors_and_uuid_come_from_the_driver_procfs():
    found = by_identity(detect_json("big_node"))
    first, second = found["pci-0000:41:00.0"], found["pci-0000:c1:00.0"]
    assert first["device_nodes"] == ["/dev/nvidia1"] and second["device_nodes"] == ["/dev/nvidia0"]
    assert first["details"]["minor_source"] == "procfs"
    assert first["details"]["uuid"] == "GPU-4b1c2a1e-7d0f-4c3b-9a55-0f6d2f0c1a11"
    assert first["model"] == "NVIDIA A100-SXM4-80GB"
    assert second["numa_node"] == 1 and second["local_cpus"] == "1"


def test_nvidia_without_procfs_falls_back_to_pci_order_and_flags_missing_nodes():
    found = by_identity(detect_json("big_node", extra=False))
    first, second = found["pci-0000:41:00.0"], found["pci-0000:c1:00.0"]
    assert first["details"]["minor_source"] == "pci-order"
    assert first["device_nodes"] == ["/dev/nvidia0"] and second["device_nodes"] == ["/dev/nvidia1"]
    assert first["model"] == "A100 SXM4 80GB"  # from the PCI database name
    # No /dev/nvidiaN: present but unusable, with the reason and the fix.
    assert not first["usable"] and "/dev/nvidia0 is missing" in first["reason"]
    assert "nvidia-modprobe" in first["reason"]
    # The Jetson GPU has no node without /dev/nvhost-gpu either.
    assert not found["platform-17000000.gpu"]["usable"]


def test_amd_and_jetson_gpus():
    found = by_identity(detect_json("big_node"))
    amd = found["pci-0000:0a:00.0"]
    assert amd["vendor"] == "AMD" and amd["model"] == "Radeon RX 6800"
    assert amd["device_nodes"] == ["/dev/dri/renderD128", "/dev/dri/card0"]  # not the DP connector
    assert amd["details"]["memory_bytes"] == 17163091968
    jetson = found["platform-17000000.gpu"]
    assert jetson["bus"] == "platform" and jetson["model"] == "Tegra ga10b"
    assert jetson["device_nodes"] == ["/dev/nvhost-gpu"]


def test_empty_node():
    document = detect_json("empty_node")
    assert document["accelerators"] == []
    table = run_cli(["detect"], "empty_node")
    assert table.returncode == 0 and "No accelerators found on this node (looked for: Edge TPUs, GPUs" in table.stdout


def test_pcie_card_without_driver_is_listed_unusable_with_the_fix():
    (card,) = detect_json("pcie_no_driver")["accelerators"]
    assert card["identity"] == "pci-0000:03:00.0" and not card["usable"]
    assert "no driver bound" in card["reason"] and "modprobe apex" in card["reason"]
    assert card["numa_node"] is None  # numa_node=-1 means "unknown"
    gres = run_cli(["gres-conf", "--node", "n1"], "pcie_no_driver")
    assert "Name=tpu" not in gres.stdout
    assert "# not configured: pci-0000:03:00.0" in gres.stdout


def test_reenumeration_keeps_the_identity():
    before = detect_json("usb_stick_before")["accelerators"]
    after = detect_json("usb_stick_after")["accelerators"]
    assert [a["identity"] for a in before] == [a["identity"] for a in after] == ["usb-2-1.3"]
    assert before[0]["device_nodes"] != after[0]["device_nodes"]
    assert before[0]["details"]["firmware_loaded"] is False and after[0]["details"]["firmware_loaded"] is True
    # ...so the generated gres.conf does not change across the firmware load.
    rendered = [run_cli(["gres-conf", "--node", "n1"], f"usb_stick_{m}").stdout for m in ("before", "after")]
    assert rendered[0] == rendered[1] and "File=/dev/slurm-tpu/usb-2-1.3" in rendered[0]


def test_table_flags_slow_usb_and_firmware():
    table = run_cli(["detect"], "big_node").stdout
    line = next(line for line in table.splitlines() if line.startswith("usb-1-1.4"))
    assert "480 Mbit/s" in line and "firmware not loaded" in line
    assert "10 accelerator(s), 10 usable, 0 unusable" in table
