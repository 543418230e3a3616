"""Simulated node hardware: umockdev description -> inventory with real device nodes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from dataclasses import replace

from slurm_tpu.families import inventory_from_json
from slurm_tpu.hardware import Inventory

from .. import module_command

# Majors 240-254 are reserved for local/experimental use: no real driver answers
# them, so the nodes we make can be opened/owned but reach no hardware.
EXPERIMENTAL_MAJOR = 240


def detect_under_umockdev(umockdev_file: str, slurm_tpu: list[str], python: str) -> Inventory:
    """Run the real ``slurm-tpu detect --json`` against a umockdev testbed.

    Files that no udev device announces (NVIDIA procfs, driver-made nodes) are
    taken from ``<name>.extra/`` beside the umockdev file when it exists.
    """
    extra = os.path.splitext(umockdev_file)[0] + ".extra"
    completed = subprocess.run(
        [
            "umockdev-run",
            "--device",
            umockdev_file,
            "--",
            *module_command(python, "harness.localcluster.testbed", extra, "--", *slurm_tpu, "detect", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"detect under umockdev failed for {umockdev_file}: {completed.stderr.strip()}")
    return inventory_from_json(json.loads(completed.stdout))


def materialize(inventory: Inventory, dev_root: str, minor_start: int = 0) -> Inventory:
    """Create a real char device for each device node, under ``dev_root``.

    ``/dev/bus/usb/002/005`` becomes ``<dev_root>/bus/usb/002/005`` (root:root
    0600, the idle policy), and the returned inventory names the new paths.
    These nodes reach no driver (EXPERIMENTAL_MAJOR); a PCIe Edge TPU's node is
    where the emulated apex driver (apex.py) bind-mounts its pseudo-terminal
    when the cluster starts.
    """
    minor = minor_start
    accelerators = []
    for accelerator in inventory:
        nodes = []
        for node in accelerator.device_nodes:
            relative = os.path.relpath(node, "/dev")
            target = os.path.join(dev_root, relative)
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            if os.path.lexists(target):
                os.unlink(target)
            os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(EXPERIMENTAL_MAJOR, minor))
            os.chmod(target, 0o600)
            minor += 1
            nodes.append(target)
        accelerators.append(replace(accelerator, device_nodes=tuple(nodes)))
    return replace(inventory, accelerators=tuple(accelerators))


def _usb_hub_and_port(port_path: str) -> tuple[str, str, int]:
    """``2-1.3`` -> (hub device ``2-1``, its interface ``2-1:1.0``, port 3); ``2-1`` -> (``usb2``, ``2-0:1.0``, 1)."""
    if "." in port_path:
        hub, _, number = port_path.rpartition(".")
        return hub, f"{hub}:1.0", int(number)
    bus, _, number = port_path.partition("-")
    return f"usb{bus}", f"{bus}-0:1.0", int(number)


def usb_sysfs_device(sys_root: str, port_path: str, busnum: int, devnum: int, devname: str) -> str:
    """Create (or recreate) a USB device in a materialized sysfs; returns its DEVPATH.

    The layout follows the kernel's: ``bus/usb/devices/<port path>`` links to the
    device directory (``busnum``, ``devnum``, ``uevent`` with DEVNAME), whose
    ``port`` link names the hub port device (``<hub>-port<N>/disable``,
    drivers/usb/core/port.c). The hub port survives a disconnect; the device
    directory does not.
    """
    hub, interface, number = _usb_hub_and_port(port_path)
    hub_dir = os.path.join(sys_root, "devices", "emulated-usb", hub)
    port_dir = os.path.join(hub_dir, interface, f"{hub}-port{number}")
    os.makedirs(port_dir, exist_ok=True)
    disable = os.path.join(port_dir, "disable")
    if not os.path.exists(disable):
        with open(disable, "w", encoding="ascii") as handle:
            handle.write("0\n")
    device = os.path.join(hub_dir, port_path)
    os.makedirs(device, exist_ok=True)
    for name, value in (("busnum", busnum), ("devnum", devnum), ("uevent", f"DEVNAME={devname}")):
        with open(os.path.join(device, name), "w", encoding="ascii") as handle:
            handle.write(f"{value}\n")
    link = os.path.join(device, "port")
    if not os.path.lexists(link):
        os.symlink(os.path.relpath(port_dir, device), link)
    bus_dir = os.path.join(sys_root, "bus", "usb", "devices")
    os.makedirs(bus_dir, exist_ok=True)
    bus_link = os.path.join(bus_dir, port_path)
    if not os.path.lexists(bus_link):
        os.symlink(os.path.relpath(device, bus_dir), bus_link)
    return "/" + os.path.relpath(device, sys_root)


def apex_cards(inventory: Inventory) -> list[str]:
    """The device nodes of ``inventory``'s PCIe Edge TPUs: what the emulated apex driver (apex.py) serves."""
    return [a.device_nodes[0] for a in inventory if a.kind == "edgetpu" and a.bus.value == "pci" and a.device_nodes]


def materialize_sysfs(inventory: Inventory, sys_root: str) -> None:
    """The sysfs the hooks' revocation reads and writes, for ``inventory``'s Edge TPUs.

    USB sticks get their device directory and hub port (see usb_sysfs_device).
    PCIe apex devices get an empty ``class/apex``: the emulated apex driver
    (apex.py, started with the cluster) mounts ``apex_N/write_open_count`` there,
    answered from the device's real open files. Until it runs the attribute is
    missing, which the hooks take as "the driver cannot say": not free.
    """
    for accelerator in inventory:
        if accelerator.kind != "edgetpu" or not accelerator.device_nodes:
            continue
        node = accelerator.device_nodes[0]
        if accelerator.bus.value == "usb":
            parts = node.rstrip("/").split("/")
            usb_sysfs_device(sys_root, accelerator.identity[len("usb-") :], int(parts[-2]), int(parts[-1]), node)
    if apex_cards(inventory):
        os.makedirs(os.path.join(sys_root, "class", "apex"), exist_ok=True)
