"""slurm_tpu/energy/hwmon.py: an AMD GPU's hwmon power file (µW) read as watts, through sysfs's own
links, and never through a link that leads out of the sysfs root."""

from __future__ import annotations

import os

import pytest

from slurm_tpu.energy.hwmon import power_w

PCI = "devices/pci0000:00/0000:00:03.1/0000:03:00.0"


@pytest.fixture
def sysfs(tmp_path):
    """A sysfs tree: the GPU's hwmon directory under its PCI device, reached through /sys/class/drm."""
    root = tmp_path / "sys"
    hwmon = root / PCI / "hwmon" / "hwmon4"
    hwmon.mkdir(parents=True)
    (hwmon / "power1_average").write_text("41250000\n")  # 41.25 W
    drm = root / "class" / "drm" / "card0"
    drm.mkdir(parents=True)
    os.symlink(os.path.relpath(root / PCI, drm), drm / "device")
    return root


def test_reads_watts_through_sysfs_links(sysfs):
    assert power_w(str(sysfs / "class/drm/card0/device/hwmon/hwmon4/power1_average"), str(sysfs)) == 41.25
    assert power_w(str(sysfs / PCI / "hwmon/hwmon4/power1_average"), str(sysfs)) == 41.25


def test_a_newer_kernels_power_input_file_reads_too(sysfs):
    (sysfs / PCI / "hwmon/hwmon4/power1_input").write_text("0\n")
    assert power_w(str(sysfs / PCI / "hwmon/hwmon4/power1_input"), str(sysfs)) == 0.0


def test_a_link_that_leads_out_of_the_sysfs_root_is_refused(sysfs, tmp_path):
    outside = tmp_path / "elsewhere" / "hwmon" / "hwmon9"
    outside.mkdir(parents=True)
    (outside / "power1_average").write_text("5000000\n")
    card = sysfs / "class" / "drm" / "card1"
    card.mkdir()
    os.symlink(tmp_path / "elsewhere", card / "device")
    assert power_w(str(card / "device/hwmon/hwmon9/power1_average"), str(sysfs)) is None
    # The file itself a link, even to a power file inside the root: never followed.
    hwmon = sysfs / PCI / "hwmon" / "hwmon5"
    hwmon.mkdir()
    os.symlink(sysfs / PCI / "hwmon/hwmon4/power1_average", hwmon / "power1_average")
    assert power_w(str(hwmon / "power1_average"), str(sysfs)) is None


def test_what_is_not_a_power_reading_is_none(sysfs):
    hwmon = sysfs / PCI / "hwmon" / "hwmon4"
    assert power_w(str(hwmon / "power2_average"), str(sysfs)) is None  # absent (the GPU unbound)
    (hwmon / "name").write_text("amdgpu\n")
    assert power_w(str(hwmon / "name"), str(sysfs)) is None  # not a power file
    (hwmon / "power1_average").write_text("N/A\n")
    assert power_w(str(hwmon / "power1_average"), str(sysfs)) is None
    (hwmon / "power1_average").write_text("-5\n")
    assert power_w(str(hwmon / "power1_average"), str(sysfs)) is None
    assert power_w("power1_average", str(sysfs)) is None  # relative: not a sysfs path
    (hwmon / "power3_average").mkdir()
    assert power_w(str(hwmon / "power3_average"), str(sysfs)) is None  # not a regular file
