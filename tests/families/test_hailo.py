"""The Hailo family on literal udev snapshots: detection, GRES, config, udev, hooks data, runner.

The real-libudev and real-cluster checks are in test_hailo_cluster.py (umockdev
nodes under tests/hardware/hailo_*.umockdev).
"""

from __future__ import annotations

import json

import pytest

from slurm_tpu.config import Config, parse_config
from slurm_tpu.detect import inventory_from_snapshot
from slurm_tpu.errors import ConfigError
from slurm_tpu.families import FAMILIES, family, inventory_from_json
from slurm_tpu.families.hailo import HailoDetails
from slurm_tpu.families.sysfs import Snapshot, SysDevice
from slurm_tpu.hooks.settings import HookSettings, apply_families
from slurm_tpu.hooks.udev_event import identity_for
from slurm_tpu.protocol import envfile
from slurm_tpu.protocol.hooks_snapshot import SCAN, format_snapshot, parse_snapshot
from slurm_tpu.protocol.inventory import parse_inventory
from slurm_tpu.render import node_features, node_gres, render_gres_conf, render_udev_rules
from slurm_tpu.runner.devices import resolve_devices
from slurm_tpu.runner.errors import UsageError

HAILO = family("hailo")


def card(address: str, driver: str = "hailo") -> SysDevice:
    return SysDevice(
        sys_path=f"/sys/devices/pci0000:00/0000:00:1c.0/{address}",
        sys_name=address,
        subsystem="pci",
        driver=driver,
        attributes={"vendor": "0x1e60", "device": "0x2864"},
    )


def chardev(index: int, address: str, virtual: bool = True, node: bool = True) -> SysDevice:
    # Raspberry Pi OS's driver (4.17-4.22) puts the class device under virtual/; 4.23 under the card.
    parent = "/sys/devices/virtual" if virtual else f"/sys/devices/pci0000:00/0000:00:1c.0/{address}"
    return SysDevice(
        sys_path=f"{parent}/hailo_chardev/hailo{index}",
        sys_name=f"hailo{index}",
        subsystem="hailo_chardev",
        device_node=f"/dev/hailo{index}" if node else "",
        attributes={"board_location": address, "device_id": "1e60:2864", "accelerator_type": "0"},
    )


def snapshot(*devices: SysDevice) -> Snapshot:
    return Snapshot({d.sys_path: d for d in devices})


TWO_CARDS = snapshot(
    card("0000:01:00.0"), card("0000:02:00.0"), chardev(0, "0000:02:00.0"), chardev(1, "0000:01:00.0")
)  # probe order is not bus order


def test_is_registered_and_paired_by_board_location_not_by_the_tree():
    assert HAILO in FAMILIES
    for layout in (
        TWO_CARDS,
        snapshot(
            card("0000:01:00.0"),
            card("0000:02:00.0"),
            chardev(0, "0000:02:00.0", virtual=False),
            chardev(1, "0000:01:00.0", virtual=False),
        ),
    ):
        found = inventory_from_snapshot(layout)
        assert [(a.identity, a.kind, a.primary_node, a.usable) for a in found] == [
            ("pci-0000:01:00.0", "hailo", "/dev/hailo1", True),
            ("pci-0000:02:00.0", "hailo", "/dev/hailo0", True),
        ]
        assert found.accelerators[0].details == HailoDetails("hailo1", 0)
        assert (found.accelerators[0].vendor, found.accelerators[0].model) == ("Hailo", "Hailo-8/8L")


@pytest.mark.parametrize(
    "devices, words",
    [
        (
            (card("0000:01:00.0", driver=""),),
            ["0000:01:00.0 has no driver bound", "hailo_pci", "apt install hailo-all"],
        ),
        ((card("0000:01:00.0"),), ["driver hailo is bound to 0000:01:00.0 but created no hailo_chardev device"]),
        ((card("0000:01:00.0", driver="vfio-pci"),), ["bound to vfio-pci, not the hailo driver", "hailo_pci"]),
        ((card("0000:01:00.0"), chardev(0, "0000:01:00.0", node=False)), ["hailo0 of 0000:01:00.0 has no /dev node"]),
    ],
)
def test_unusable_cards_are_listed_with_the_fix(devices, words):
    (found,) = inventory_from_snapshot(snapshot(*devices))
    assert found.identity == "pci-0000:01:00.0" and not found.usable and found.device_nodes == ()
    assert all(w in found.reason for w in words), found.reason
    # ...and left out of gres.conf with that reason, so slurmd never waits for it.
    text = render_gres_conf(inventory_from_snapshot(snapshot(*devices)), Config(), "n1")
    assert text.startswith("# not configured: pci-0000:01:00.0 (Hailo-8/8L): ")


def test_json_round_trip_keeps_the_typed_details():
    inventory = inventory_from_snapshot(TWO_CARDS)
    document = json.loads(json.dumps(inventory.to_json()))
    assert document["accelerators"][0]["details"] == {"chardev": "hailo1", "accelerator_type": 0}
    assert inventory_from_json(document) == inventory


def test_gres_npu_hailo8_by_default_and_8l_where_the_site_says():
    inventory = inventory_from_snapshot(TWO_CARDS)
    assert render_gres_conf(inventory, Config(), "n1") == (
        "NodeName=n1 Name=npu Type=hailo8 File=/dev/slurm-tpu/pci-0000:01:00.0\n"
        "NodeName=n1 Name=npu Type=hailo8 File=/dev/slurm-tpu/pci-0000:02:00.0\n"
    )
    assert node_gres(inventory, Config()) == "npu:hailo8:2"
    assert node_features(inventory, Config()) == ["npu", "hailo", "hailo8"]
    config = parse_config(
        {
            "version": 2,
            "families": {
                "hailo": {
                    "gres_name": "hailo",
                    "types": {"by_address": {"0000:02:00.0": "hailo8l"}},
                    "features": ["ai"],
                }
            },
        }
    )
    assert node_gres(inventory, config) == "hailo:hailo8:1,hailo:hailo8l:1"
    assert node_features(inventory, config) == ["ai", "hailo8", "hailo8l"]


@pytest.mark.parametrize(
    "section, key",
    [
        ({"types": {"by_address": {"01:00": "hailo8l"}}}, "families.hailo.types.by_address"),
        ({"types": {"default": 8}}, "families.hailo.types.default"),
        ({"typo": 1}, "families.hailo.typo"),
    ],
)
def test_bad_hailo_config_names_the_key(section, key):
    with pytest.raises(ConfigError) as caught:
        parse_config({"version": 2, "families": {"hailo": section}}, where="c.yaml")
    assert caught.value.key == key and "c.yaml" in str(caught.value)


def test_version_1_configs_get_the_hailo_defaults():
    assert parse_config({"version": 1}).family("hailo") == HAILO.default_config


def test_udev_rules_own_the_hailo_nodes_after_hailos_own_rules():
    rules = render_udev_rules(Config(), "/usr/local/libexec/slurm-tpu/slurm-tpu-udev-event")
    assert (
        'ACTION!="remove", SUBSYSTEM=="hailo_chardev", KERNEL=="hailo[0-9]*", OWNER:="root", GROUP:="root", '
        'MODE:="0600", RUN+="/usr/local/libexec/slurm-tpu/slurm-tpu-udev-event"'
    ) in rules.splitlines()
    assert (
        'ACTION=="remove", SUBSYSTEM=="hailo_chardev", KERNEL=="hailo[0-9]*", '
        'RUN+="/usr/local/libexec/slurm-tpu/slurm-tpu-udev-event"'
    ) in rules.splitlines()


def hook_settings(inventory) -> HookSettings:
    settings = HookSettings("/run/x", devices=parse_inventory(inventory.to_json()))
    apply_families(settings, Config())
    return settings


def test_hooks_lease_it_with_slots_scan_holders_and_export_the_pci_address():
    settings = hook_settings(inventory_from_snapshot(TWO_CARDS))
    policy = settings.families["hailo"]
    assert (policy.gres_name, policy.leased, policy.slot) == ("npu", True, True)
    assert settings.revocation("hailo", "pci") == SCAN  # unbind is unsafe: see families/hailo.py
    assert settings.values["pci-0000:02:00.0"] == {"SLURM_TPU_HAILO_DEVICES": "0000:02:00.0"}
    # Through the snapshot file's one writer and one reader, unchanged.
    again = parse_snapshot(format_snapshot(settings), HookSettings)
    assert again.values == settings.values and again.families["hailo"].slot

    class Lease:
        def __init__(self, identity, kind):
            self.identity, self.kind = identity, kind

    env = envfile.render([Lease("pci-0000:02:00.0", "hailo"), Lease("pci-0000:01:00.0", "hailo")], settings)
    assert "export SLURM_TPU_HAILO_DEVICES=0000:02:00.0,0000:01:00.0\n" in env  # allocation order
    assert "export SLURM_TPU_DEVICES=\n" in env  # Edge TPU variables keep meaning Edge TPUs only
    tpu_only = envfile.render([Lease("usb-2-1.3", "edgetpu")], settings)
    assert "unset SLURM_TPU_HAILO_DEVICES\n" in tpu_only
    assert "unset SLURM_TPU_HAILO_DEVICES\n" in envfile.render_unset(settings)


def test_udev_event_names_the_card_by_board_location_and_a_removal_by_its_node(tmp_path):
    settings = hook_settings(inventory_from_snapshot(TWO_CARDS))
    device = tmp_path / "devices" / "virtual" / "hailo_chardev" / "hailo0"
    device.mkdir(parents=True)
    (device / "board_location").write_text("0000:02:00.0")
    add = {
        "ACTION": "add",
        "SUBSYSTEM": "hailo_chardev",
        "DEVPATH": "/devices/virtual/hailo_chardev/hailo0",
        "DEVNAME": "/dev/hailo0",
    }
    assert identity_for(add, settings.udev, str(tmp_path), settings.devices) == "pci-0000:02:00.0"
    (device / "board_location").write_text("../../etc")  # never a path, never outside the grammar
    assert identity_for(add, settings.udev, str(tmp_path), settings.devices) is None
    (device / "board_location").unlink()
    remove = dict(add, ACTION="remove")
    assert identity_for(remove, settings.udev, str(tmp_path), settings.devices) == "pci-0000:02:00.0"
    assert identity_for(dict(remove, DEVNAME="/dev/hailo7"), settings.udev, str(tmp_path), settings.devices) is None


def test_the_runner_says_hailo_runs_hef_models_with_hailort():
    with pytest.raises(UsageError) as caught:
        resolve_devices(None, {"SLURM_TPU_HAILO_DEVICES": "0000:01:00.0", "SLURM_TPU_DEVICES": ""})
    message = str(caught.value)
    assert "\n" not in message and ".hef" in message and "HailoRT" in message and "not TFLite" in message
    assert "0000:01:00.0" in message and "$SLURM_TPU_HAILO_DEVICES" in message
    # An Edge TPU in the same job, or an explicit --device, still runs.
    both = {
        "SLURM_TPU_HAILO_DEVICES": "0000:01:00.0",
        "SLURM_TPU_DEVICES": "usb-2-1.3",
        "SLURM_TPU_EDGETPU_PATHS": "usb:/sys/bus/usb/devices/2-1.3",
    }
    assert [d.kind for d in resolve_devices(None, both)] == ["edgetpu"]
    assert [d.kind for d in resolve_devices(["cpu"], {"SLURM_TPU_HAILO_DEVICES": "0000:01:00.0"})] == ["cpu"]
