"""Where each device's energy figure comes from: the families' declarations, the config keys that
calibrate them, and the hooks snapshot (version 10) that carries them to the Prolog and Epilog."""

from __future__ import annotations

import pytest

from slurm_tpu.config import Config, parse_config
from slurm_tpu.errors import ConfigError
from slurm_tpu.families import family
from slurm_tpu.hooks import settings as hook_settings
from slurm_tpu.protocol import hooks_snapshot
from slurm_tpu.protocol.inventory import parse_inventory


def item(identity, kind, bus, vendor, model="m", details=None, address="", nodes=("/dev/x",)):
    return {
        "identity": identity,
        "kind": kind,
        "bus": bus,
        "bus_address": address or identity.partition("-")[2],
        "vendor_id": "10de",
        "product_id": "0001",
        "vendor": vendor,
        "model": model,
        "sys_path": f"/sys/devices/{identity}",
        "device_nodes": list(nodes),
        "details": details or {},
    }


def document(sysfs_amd: bool = False):
    return {
        "accelerators": [
            item("usb-2-1.3", "edgetpu", "usb", "Google", address="2-1.3"),
            item("pci-0000:01:00.0", "edgetpu", "pci", "Google"),
            item("pci-0000:41:00.0", "gpu", "pci", "NVIDIA", "NVIDIA A100", {"uuid": "GPU-1", "minor": 0}),
            item("pci-0000:03:00.0", "gpu", "pci", "AMD", "Radeon"),
            item("pci-0000:04:00.0", "gpu", "pci", "Intel", "Arc"),
            item("platform-17000000.gpu", "gpu", "platform", "NVIDIA", "Tegra ga10b", {"compatible": "nvidia,ga10b"}),
            item("pci-0000:05:00.0", "hailo", "pci", "Hailo"),
            item("pci-0000:06:00.0", "hailo", "pci", "Hailo"),
        ]
    }


def sources(config: Config, sysfs_root: str) -> dict[str, str]:
    settings = hook_settings.HookSettings("/run/x", node="n1")
    settings.sysfs_root = sysfs_root
    doc = document()
    settings.devices = parse_inventory(doc)
    hook_settings.apply_families(settings, config, doc)
    return settings.energy_sources


def test_each_family_declares_its_devices_source(tmp_path):
    hwmon = tmp_path / "bus" / "pci" / "devices" / "0000:03:00.0" / "hwmon" / "hwmon2"
    hwmon.mkdir(parents=True)
    (hwmon / "power1_average").write_text("42000000\n")
    config = parse_config({"version": 2, "families": {"hailo": {"types": {"by_address": {"0000:06:00.0": "hailo8l"}}}}})
    found = sources(config, str(tmp_path))
    assert found == {
        "usb-2-1.3": "model:0.5:2",
        "pci-0000:01:00.0": "model:0.3:2",
        "pci-0000:41:00.0": "nvml-energy:00000000:41:00.0",
        "pci-0000:03:00.0": f"hwmon-power:{hwmon}/power1_average",
        "pci-0000:04:00.0": "none:no power reading for Intel GPUs",
        "platform-17000000.gpu": "none:Jetson's GPU has no NVML power readings",
        "pci-0000:05:00.0": "model:0.8:2.5",
        "pci-0000:06:00.0": "model:0.6:1.6",  # Hailo-8L: the type decides (8 and 8L share a PCI id)
    }
    # An AMD GPU whose driver publishes no power1_average has none.
    (hwmon / "power1_average").unlink()
    assert sources(config, str(tmp_path))["pci-0000:03:00.0"].startswith("none:")


def test_a_sites_watts_replace_the_datasheets_by_gres_type():
    config = parse_config(
        {"version": 2, "families": {"edgetpu": {"watts": {"edgetpu_usb": {"idle": 0.65, "active": 2.4}}}}}
    )
    found = sources(config, "/nonexistent")
    assert (found["usb-2-1.3"], found["pci-0000:01:00.0"]) == ("model:0.65:2.4", "model:0.3:2")


@pytest.mark.parametrize(
    "watts",
    [
        {"edgetpu_usb": {"idle": 3, "active": 2}},
        {"edgetpu_usb": {"idle": -1, "active": 2}},
        {"edgetpu_usb": {"idle": 1}},
        {"edgetpu_usb": {"idle": True, "active": 2}},
        {"edgetpu_usb": {"idle": 0.5, "active": 2, "peak": 3}},
        {"edgetpu_usb": 2.0},
    ],
)
def test_a_bad_watts_entry_is_one_clear_line_naming_it(watts):
    with pytest.raises(ConfigError) as caught:
        parse_config({"version": 2, "families": {"edgetpu": {"watts": watts}}})
    assert caught.value.key == "families.edgetpu.watts.edgetpu_usb"
    assert "idle: W, active: W" in str(caught.value) and "\n" not in str(caught.value)


def test_the_energy_keys_and_their_bounds():
    assert (Config().energy.enabled, Config().energy.nvml_library, Config().energy.poll_seconds) == (
        True,
        "libnvidia-ml.so.1",
        5.0,
    )
    config = parse_config({"version": 2, "energy": {"nvml_library": "/opt/nvml/libnvidia-ml.so.1", "poll_seconds": 60}})
    assert (config.energy.nvml_library, config.energy.poll_seconds) == ("/opt/nvml/libnvidia-ml.so.1", 60.0)
    for bad in ({"poll_seconds": 0.5}, {"poll_seconds": 61}, {"nvml_library": "lib/x.so"}, {"nvml_library": ""}):
        with pytest.raises(ConfigError):
            parse_config({"version": 2, "energy": bad})


def test_the_snapshot_carries_sources_library_period_and_the_switch():
    settings = hook_settings.HookSettings("/run/x", node="n1")
    doc = document()
    settings.devices = parse_inventory(doc)
    hook_settings.apply_families(settings, Config(), doc)
    settings.nvml_library, settings.energy_poll_s = "/opt/nvml/libnvidia-ml.so.1", 2.5
    text = hooks_snapshot.format_snapshot(settings)
    assert text.startswith("slurm-tpu hooks snapshot 10\n")
    again = hooks_snapshot.parse_snapshot(text, hook_settings.HookSettings)
    assert again.energy_sources == settings.energy_sources and len(again.energy_sources) == 8
    assert (again.nvml_library, again.energy_poll_s, again.energy_enabled) == ("/opt/nvml/libnvidia-ml.so.1", 2.5, True)
    # The GPUs with a source are what the Prolog learns of a job even though GPUs are not leased.
    assert again.energy_gres() == ["gpu"]
    # Disabled: no source at all, nothing for the Prolog to learn.
    off = hook_settings.HookSettings("/run/x", node="n1")
    off.devices, off.energy_enabled = parse_inventory(doc), False
    hook_settings.apply_families(off, Config(), doc)
    again = hooks_snapshot.parse_snapshot(hooks_snapshot.format_snapshot(off), hook_settings.HookSettings)
    assert (again.energy_enabled, again.energy_sources, again.energy_gres()) == (False, {}, [])
    # A version 9 snapshot is not read (the hook takes the slow path and writes version 10).
    assert hooks_snapshot.parse_snapshot(text.replace("snapshot 10", "snapshot 9"), hook_settings.HookSettings) is None


def test_nvml_bus_ids():
    from slurm_tpu.families.gpu import nvml_bus_id

    assert nvml_bus_id("0000:41:00.0") == "00000000:41:00.0"
    assert nvml_bus_id("0001:0A:00.1") == "00000001:0a:00.1"
    assert family("gpu").default_watts == {}  # GPUs are read, never modelled


def test_an_amd_gpu_that_publishes_only_power1_input_is_read_from_it(tmp_path):
    hwmon = tmp_path / "bus" / "pci" / "devices" / "0000:03:00.0" / "hwmon" / "hwmon4"
    hwmon.mkdir(parents=True)
    (hwmon / "power1_input").write_text("42000000\n")  # RDNA3 and later: no power1_average
    assert sources(Config(), str(tmp_path))["pci-0000:03:00.0"] == f"hwmon-power:{hwmon}/power1_input"
    # Where both are published, the driver's own average is read.
    (hwmon / "power1_average").write_text("40000000\n")
    assert sources(Config(), str(tmp_path))["pci-0000:03:00.0"] == f"hwmon-power:{hwmon}/power1_average"
