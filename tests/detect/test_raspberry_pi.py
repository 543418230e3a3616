"""Detection on Raspberry Pi nodes (tests/hardware/pi4_coral_usb*.umockdev, pi5_hailo8l.umockdev):
what `slurm-tpu detect` (table and --json), gres-conf, node-conf and udev-rules say of them.

The arm64 CI leg runs this file inside an emulated arm64 root (qemu-user, 5-10x slower), so each
command runs once per module (the ``ran`` cache) and nothing here depends on the machine's
architecture: the Pi's sysfs is the fixture's, read through real libudev under umockdev.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers import run_cli
from slurm_tpu.config import Config, parse_config
from slurm_tpu.errors import ConfigError
from slurm_tpu.families import family
from slurm_tpu.hardware import Accelerator, Bus

PI4, PI4_UNFLASHED, PI5 = "pi4_coral_usb", "pi4_coral_usb_unflashed", "pi5_hailo8l"
PI4_VL805 = "/sys/devices/platform/scb/fd500000.pcie/pci0000:00/0000:00:00.0/0000:01:00.0"
PI5_HAILO = "0001:01:00.0"
# The Pi 5's card mapped to hailo8l, as the admin guide says to (quoted: see test_unquoted_address_*).
MAPPED = {"version": 2, "families": {"hailo": {"types": {"by_address": {PI5_HAILO: "hailo8l"}}}}}


@pytest.fixture(scope="module")
def mapped_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pi") / "config.yaml"
    path.write_text(yaml.safe_dump(MAPPED))
    return path


_RUNS: dict[tuple[str, ...], subprocess.CompletedProcess] = {}


def ran(hardware: str, *args: str) -> subprocess.CompletedProcess:
    """``slurm-tpu ARGS`` on a described Pi, once per module and arguments (each run is a umockdev
    testbed and an interpreter start: seconds under qemu)."""
    key = (hardware, *args)
    if key not in _RUNS:
        _RUNS[key] = run_cli(list(args), hardware, timeout=300)
    done = _RUNS[key]
    assert done.returncode == 0, done.stderr
    return done


def accelerators(hardware: str) -> dict[str, dict]:
    return {a["identity"]: a for a in json.loads(ran(hardware, "detect", "--json").stdout)["accelerators"]}


def status(table: str, identity: str) -> str:
    """The STATUS cell of one device's row in the detect table."""
    line = next(line for line in table.splitlines() if line.startswith(identity + " "))
    return line[line.index(" ok") + 1 :] if " ok" in line else line


def block(text: str) -> list[str]:
    """The lines of a rendered managed block that are not its BEGIN/END comments."""
    return [line for line in text.splitlines() if line and not line.startswith("#")]


# ---- Raspberry Pi 4: a stick on a blue USB 3 port, one on a black USB 2 port ----------------------


def test_pi4_finds_both_sticks_at_their_true_port_paths():
    found = accelerators(PI4)
    assert sorted(found) == ["usb-1-1.3", "usb-2-1"]
    usb2, usb3 = found["usb-1-1.3"], found["usb-2-1"]
    # Behind the VL805's internal USB 2 hub (1-1) / on the VL805's SuperSpeed root hub (bus 2).
    assert usb2["sys_path"] == f"{PI4_VL805}/usb1/1-1/1-1.3" and usb2["bus_address"] == "1-1.3"
    assert usb3["sys_path"] == f"{PI4_VL805}/usb2/2-1" and usb3["bus_address"] == "2-1"
    assert usb2["device_nodes"] == ["/dev/bus/usb/001/004"] and usb3["device_nodes"] == ["/dev/bus/usb/002/003"]
    for stick in (usb2, usb3):
        assert stick["kind"] == "edgetpu" and stick["usable"], stick["reason"]
        assert stick["vendor_product"] == "18d1:9302" and stick["details"]["firmware_loaded"] is True


def test_pi4_usb2_stick_is_the_slow_link_and_the_table_says_so():
    found = accelerators(PI4)
    assert found["usb-1-1.3"]["details"]["usb_speed_mbps"] == 480 and found["usb-1-1.3"]["details"]["slow_link"]
    assert found["usb-2-1"]["details"]["usb_speed_mbps"] == 5000 and not found["usb-2-1"]["details"]["slow_link"]
    table = ran(PI4, "detect").stdout
    assert status(table, "usb-1-1.3") == "ok, USB 480 Mbit/s link: about 3x slower than USB 3"
    assert status(table, "usb-2-1") == "ok"
    assert table.endswith("2 accelerator(s), 2 usable, 0 unusable\n")


def test_pi4_has_four_cpus_one_core_each_and_no_numa():
    document = json.loads(ran(PI4, "detect", "--json").stdout)
    assert document["online_cpus"] == "0-3"
    assert document["core_of_cpu"] == {"0": 0, "1": 1, "2": 2, "3": 3}  # 4 Cortex-A72, no SMT
    for stick in document["accelerators"]:
        # The VL805's own local_cpulist; numa_node -1 (no NUMA on a Pi) means unknown, not node 0.
        assert stick["local_cpus"] == "0-3" and stick["numa_node"] is None
    table = ran(PI4, "detect").stdout
    for identity in ("usb-1-1.3", "usb-2-1"):  # the NUMA column, between DEVICE NODE and STATUS
        line = next(line for line in table.splitlines() if line.startswith(identity + " "))
        assert re.search(r" /dev/bus/usb/\d{3}/\d{3} +- +ok", line), line


def test_pi4_gres_conf_node_line_and_udev_rules():
    gres = block(ran(PI4, "gres-conf", "--node", "pi4").stdout)
    assert gres == [
        "NodeName=pi4 Name=tpu Type=edgetpu_usb File=/dev/slurm-tpu/usb-1-1.3",
        "NodeName=pi4 Name=tpu Type=edgetpu_usb File=/dev/slurm-tpu/usb-2-1",
    ]  # no Cores=: a stick has no CPU affinity worth binding on a 4-core Pi
    node = block(ran(PI4, "node-conf", "--node", "pi4", "--no-hardware").stdout)
    assert node == ["NodeName=pi4 Gres=tpu:edgetpu_usb:2 Feature=tpu,edgetpu,edgetpu_usb"]
    rules = ran(PI4, "udev-rules", "--run-program", "/usr/libexec/slurm-tpu/slurm-tpu-udev-event").stdout
    # Both of the stick's USB ids get a rule (the un-flashed id re-enumerates as the flashed one).
    for vendor, product in (("1a6e", "089a"), ("18d1", "9302")):
        assert f'ATTR{{idVendor}}=="{vendor}", ATTR{{idProduct}}=="{product}"' in rules
    assert 'ENV{PRODUCT}=="1a6e/89a/*|18d1/9302/*"' in rules  # removal, by the PRODUCT udev property


def test_pi4_sticks_keep_their_identities_across_the_firmware_load():
    """After boot both sticks wait for their firmware (1a6e:089a); the first job's libedgetpu loads it
    and each re-enumerates as 18d1:9302 with a new devnum, in the same port: gres.conf stays as it was."""
    before, after = accelerators(PI4_UNFLASHED), accelerators(PI4)
    assert sorted(before) == sorted(after)
    for identity, stick in before.items():
        assert stick["vendor_product"] == "1a6e:089a" and stick["details"]["firmware_loaded"] is False
        assert stick["device_nodes"] != after[identity]["device_nodes"]
        assert stick["details"]["usb_speed_mbps"] == after[identity]["details"]["usb_speed_mbps"]
    table = ran(PI4_UNFLASHED, "detect").stdout
    assert status(table, "usb-1-1.3") == (
        "ok, USB 480 Mbit/s link: about 3x slower than USB 3, firmware not loaded yet"
    )
    assert status(table, "usb-2-1") == "ok, firmware not loaded yet"
    assert ran(PI4_UNFLASHED, "gres-conf", "--node", "pi4").stdout == ran(PI4, "gres-conf", "--node", "pi4").stdout


# ---- Raspberry Pi 5: a Hailo-8L on the M.2 HAT+ (PCIe 0001:01:00.0), a stick on RP1 ------------------


def test_pi5_finds_the_hailo_card_and_the_rp1_stick():
    found = accelerators(PI5)
    assert sorted(found) == [f"pci-{PI5_HAILO}", "usb-2-1"]
    card = found[f"pci-{PI5_HAILO}"]
    assert card["kind"] == "hailo" and card["usable"], card["reason"]
    assert card["sys_path"] == f"/sys/devices/platform/axi/1000110000.pcie/pci0001:00/0001:00:00.0/{PI5_HAILO}"
    assert card["device_nodes"] == ["/dev/hailo0"] and card["details"]["chardev"] == "hailo0"
    assert card["vendor_product"] == "1e60:2864" and card["model"] == "Hailo-8/8L" and card["driver"] == "hailo"
    stick = found["usb-2-1"]  # RP1's first xHCI, its SuperSpeed bus: a platform device, no PCI parent
    assert stick["sys_path"].startswith("/sys/devices/platform/axi/1000120000.pcie/1f00200000.usb/xhci-hcd.0/usb2/")
    assert stick["details"]["usb_speed_mbps"] == 5000 and not stick["details"]["slow_link"]
    assert stick["local_cpus"] is None and stick["numa_node"] is None
    document = json.loads(ran(PI5, "detect", "--json").stdout)
    assert document["online_cpus"] == "0-3" and document["core_of_cpu"] == {"0": 0, "1": 1, "2": 2, "3": 3}


def test_pi5_hailo_is_npu_hailo8_by_default_and_detect_says_how_to_map_an_8l():
    gres = block(ran(PI5, "gres-conf", "--node", "pi5").stdout)
    assert f"NodeName=pi5 Name=npu Type=hailo8 File=/dev/slurm-tpu/pci-{PI5_HAILO}" in gres
    node = block(ran(PI5, "node-conf", "--node", "pi5", "--no-hardware").stdout)
    assert node == ["NodeName=pi5 Gres=tpu:edgetpu_usb:1,npu:hailo8:1 Feature=tpu,edgetpu,edgetpu_usb,npu,hailo,hailo8"]
    note = status(ran(PI5, "detect").stdout, f"pci-{PI5_HAILO}")
    assert note == (
        "ok, type hailo8 (sysfs cannot tell Hailo-8 from 8L: for an 8L set "
        f'families.hailo.types.by_address {{"{PI5_HAILO}": hailo8l}})'
    )
    assert status(ran(PI5, "detect").stdout, "usb-2-1") == "ok"  # no type note for a stick


def test_pi5_hailo_mapped_by_address_is_hailo8l(mapped_config):
    config = str(mapped_config)
    gres = block(ran(PI5, "--config", config, "gres-conf", "--node", "pi5").stdout)
    assert gres == [
        "NodeName=pi5 Name=tpu Type=edgetpu_usb File=/dev/slurm-tpu/usb-2-1",
        f"NodeName=pi5 Name=npu Type=hailo8l File=/dev/slurm-tpu/pci-{PI5_HAILO}",
    ]
    node = block(ran(PI5, "--config", config, "node-conf", "--node", "pi5", "--no-hardware").stdout)
    assert node == [
        "NodeName=pi5 Gres=tpu:edgetpu_usb:1,npu:hailo8l:1 Feature=tpu,edgetpu,edgetpu_usb,npu,hailo,hailo8l"
    ]
    table = ran(PI5, "--config", config, "detect").stdout
    assert status(table, f"pci-{PI5_HAILO}") == "ok, type hailo8l (families.hailo.types.by_address)"


# ---- the product pieces behind those lines, on literal data (no testbed) --------------------------


def hailo_card(address: str = PI5_HAILO) -> Accelerator:
    return Accelerator(
        identity=f"pci-{address}",
        kind="hailo",
        bus=Bus.PCI,
        bus_address=address,
        vendor_id="1e60",
        product_id="2864",
        vendor="Hailo",
        model="Hailo-8/8L",
        sys_path=f"/sys/bus/pci/devices/{address}",
        device_nodes=("/dev/hailo0",),
    )


def test_hailo_type_note_follows_the_config():
    hailo = family("hailo")
    assert "for an 8L set" in hailo.status_notes(Config().family("hailo"), hailo_card())[0]
    mapped = parse_config(MAPPED).family("hailo")
    assert hailo.status_notes(mapped, hailo_card()) == ["type hailo8l (families.hailo.types.by_address)"]
    # Another card on the same node is not the mapped one: it still gets the hint.
    assert "for an 8L set" in hailo.status_notes(mapped, hailo_card("0002:01:00.0"))[0]
    # A site whose every card is an 8L sets the default: no hint to map addresses one by one.
    every = parse_config({"version": 2, "families": {"hailo": {"types": {"default": "hailo8l"}}}}).family("hailo")
    assert hailo.status_notes(every, hailo_card()) == ["type hailo8l (families.hailo.types.default)"]
    assert family("edgetpu").status_notes(Config().family("edgetpu"), hailo_card()) == []


def test_unquoted_address_in_by_address_says_to_quote_it():
    """YAML 1.1 reads an unquoted 0001:01:00.0 as the base-60 number 3660.0: the error must say so."""
    document = yaml.safe_load("version: 2\nfamilies: {hailo: {types: {by_address: {0001:01:00.0: hailo8l}}}}\n")
    assert list(document["families"]["hailo"]["types"]["by_address"]) == [3660.0]  # what PyYAML does
    with pytest.raises(ConfigError) as caught:
        parse_config(document, "pi5.yaml")
    assert "unquoted PCI address" in str(caught.value) and "3660.0" in str(caught.value)
    assert 'quote it, e.g. "0001:01:00.0": hailo8l' in str(caught.value)
