"""Hailo-8 / Hailo-8L NPUs on PCIe (Raspberry Pi AI Kit / AI HAT+): the ``hailo_pci`` driver.

The driver (``hailo``) binds PCI ``1e60:2864`` (both models) and makes a class device
``hailoN`` in ``hailo_chardev`` with the node ``/dev/hailoN``. N is the probe order, not
the bus order, and on Raspberry Pi OS's driver (4.17-4.22) the class device is *not* a
child of the PCI device (4.23 parents it): the only link is its ``board_location``
attribute, the PCI address, which is also HailoRT's device id. sysfs cannot tell a
Hailo-8 from a Hailo-8L, so the GRES type is ``hailo8`` unless the site maps an address
to ``hailo8l``. The driver reports no temperature: health sees presence and usability.

Leased like an Edge TPU (slot node, ownership, holder scan at job end) but not revoked,
from the driver's remove path (raspberrypi/linux drivers/media/pci/hailo/src/pcie.c
``hailo_pcie_remove()``, src/fops.c, vdma/memory.c):

* an unbind destroys the node, unmaps the BARs, sets ``board->pDev = NULL`` and
  ``vdma.dev = NULL``, and later ``ioctl``/``mmap`` on old fds return ENODEV. That would
  be a revocation, but it is not safe:
* closing such an fd afterwards runs ``hailo_vdma_file_context_finalize()`` ->
  ``hailo_desc_list_release(controller->dev, ...)`` -> ``dma_free_coherent()`` with the
  device pointer already NULL (a kernel oops when the job's process exits);
  ``hailo_fw_control()`` drops the board mutex before it writes the BARs, and the ioctl
  entry checks ``pDev`` before taking the mutex (a racing unbind unmaps them under it);
  remove releases the mutex before reading ``ref_count`` (a last close can free the board first).
* a function reset only calls ``hailo_pci_reset_prepare()``: the file contexts stay valid.

So the epilog's holder scan decides and a survivor drains the node; the driver counts no open
files, so an fd in flight over a Unix socket is the residual exposure, as for GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..hardware import Accelerator, Details
from .base import Candidate, Family, FamilyConfig, JobVariable, UdevRule
from .sysfs import Snapshot, SysDevice, int_or_none, pci_accelerator

KIND = "hailo"
PCI_ID = ("0x1e60", "0x2864")  # Hailo-8 and Hailo-8L
MODEL = "Hailo-8/8L"  # what detection can say (see above)
DRIVER = "hailo"
CLASS = "hailo_chardev"
DEVICES_VARIABLE = "SLURM_TPU_HAILO_DEVICES"  # HailoRT's device id of each card: its PCI address
DRIVER_FIX = (
    "load the hailo_pci module (modprobe hailo_pci; Raspberry Pi OS: apt install hailo-all; "
    "elsewhere HailoRT's PCIe driver, hailort-drivers)"
)


@dataclass(frozen=True)
class HailoDetails(Details):
    """A Hailo card: its class device (``hailoN``) and the driver's accelerator type (0: NNC)."""

    chardev: str | None = None
    accelerator_type: int | None = None


def hailo_card(device: SysDevice, snapshot: Snapshot) -> Accelerator | None:
    """An Accelerator for a Hailo PCIe card, usable only with hailo_pci bound and its /dev/hailoN."""
    if (device.attributes.get("vendor"), device.attributes.get("device")) != PCI_ID:
        return None
    address = device.sys_name
    # Paired by board_location, never by the sysfs tree (see the module docstring).
    chardevs = [d for d in snapshot.of_subsystem(CLASS) if d.attributes.get("board_location") == address]
    details = HailoDetails()
    nodes: tuple[str, ...] = ()
    reason = ""
    if not device.driver:
        reason = f"Hailo PCI device {address} has no driver bound: {DRIVER_FIX}"
    elif device.driver != DRIVER:
        reason = (
            f"Hailo PCI device {address} is bound to {device.driver}, not the hailo driver: unbind it and {DRIVER_FIX}"
        )
    elif not chardevs:
        reason = (
            f"driver hailo is bound to {address} but created no {CLASS} device (/dev/hailoN): "
            "its firmware may have failed to load (see dmesg); reload hailo_pci"
        )
    else:
        chardev = chardevs[0]
        details = HailoDetails(chardev.sys_name, int_or_none(chardev.attributes.get("accelerator_type")))
        if chardev.device_node:
            nodes = (chardev.device_node,)
        else:
            reason = f"Hailo device {chardev.sys_name} of {address} has no /dev node"
    return pci_accelerator(device, KIND, "Hailo", MODEL, nodes, reason, details)


class HailoFamily(Family):
    """Hailo-8/8L NPUs: GRES ``npu``, leased with slot nodes, holder scan at job end."""

    kind = KIND
    title = "Hailo NPU"
    attributes = {"pci": ("vendor", "device"), CLASS: ("board_location", "device_id", "accelerator_type")}
    watched = ("pci", CLASS)
    default_config = FamilyConfig("npu", {"default": "hailo8"}, ("npu", "hailo"))
    slot = True
    revocation: Mapping[str, str] = {}  # holder scan only: see the module docstring
    udev_identities = (UdevRule(CLASS, "", "pci", 0, "board_location"),)
    variables = (JobVariable(DEVICES_VARIABLE, lambda identity, node: identity[len("pci-") :]),)
    runner = ""
    # Never shared (no shard_gres): HailoRT's own multi-process service is the way to share a card.
    runner_note = (
        "this job's Hailo device(s) ({devices}, in ${variable}) run .hef models with HailoRT, not "
        "TFLite: run your HEF with HailoRT, one device id per -s (hailortcli run model.hef -s "
        '"${{{variable}%%,*}}" takes the first)'
    )
    # Energy: the boards' INA231 sensor is not read here (hailortcli measure-power needs HailoRT), so
    # the model's datasheet figures: Hailo-8 2.5 W typical, Hailo-8L about 1.6 W; idle not published.
    default_watts = {"hailo8": (0.8, 2.5), "hailo8l": (0.6, 1.6)}
    extra_config_keys = {
        "types.default": (str, "GRES type of a Hailo card (hailo8: sysfs cannot tell 8 from 8L)"),
        "types.by_address": (dict, "PCI address (0000:01:00.0) -> GRES type, e.g. hailo8l"),
    }

    def wanted(self, device: Candidate) -> bool:
        if device.subsystem == "pci":
            return (device.attribute("vendor"), device.attribute("device")) == PCI_ID
        return device.subsystem == CLASS

    def find(self, snapshot: Snapshot) -> list[Accelerator]:
        """Every Hailo card, by PCI address."""
        found = (hailo_card(d, snapshot) for d in snapshot.of_subsystem("pci"))
        return sorted((a for a in found if a), key=lambda a: a.bus_address)

    def details_from_json(self, item: Mapping[str, Any]) -> Details:
        return HailoDetails.from_json(item.get("details") or {})

    def parse_types(self, section: Mapping[str, Any], where: str) -> dict[str, str]:
        types = {"default": section.get("types.default", self.default_config.types["default"])}
        by_address = section.get("types.by_address", {})
        for address, name in by_address.items():
            if isinstance(address, (int, float)) and not isinstance(address, bool):
                # YAML 1.1 (PyYAML) reads an unquoted 0001:01:00.0 as a base-60 number (3660.0): the
                # address is lost, so say what happened instead of naming a number the admin never wrote.
                raise ConfigError(
                    f"{where}: 'families.hailo.types.by_address' has an unquoted PCI address, which YAML "
                    f'read as the number {address!r}: quote it, e.g. "0001:01:00.0": {name}',
                    key="families.hailo.types.by_address",
                )
            if not (isinstance(address, str) and isinstance(name, str) and name and address.count(":") == 2):
                raise ConfigError(
                    f"{where}: 'families.hailo.types.by_address' must map PCI addresses such as "
                    f"0000:01:00.0 to type names, not {address!r}: {name!r}",
                    key="families.hailo.types.by_address",
                )
            types[address.lower()] = name
        return types

    def gres_type(self, config: FamilyConfig, accelerator: Accelerator) -> str:
        """The type the site maps the card's address to, else the default (``hailo8``)."""
        return config.types.get(accelerator.bus_address.lower(), config.types["default"])

    def status_notes(self, config: FamilyConfig, accelerator: Accelerator) -> list[str]:
        """The GRES type the card gets, and where it comes from: sysfs cannot tell a Hailo-8 from a
        Hailo-8L, so an unmapped card silently becomes the default type (``hailo8``), wrong for the
        Raspberry Pi AI Kit's 8L; say so with the exact key to set."""
        address = accelerator.bus_address.lower()
        if address in config.types:
            return [f"type {config.types[address]} (families.hailo.types.by_address)"]
        if config.types["default"] != self.default_config.types["default"]:  # the site chose its default
            return [f"type {config.types['default']} (families.hailo.types.default)"]
        return [
            f"type {config.types['default']} (sysfs cannot tell Hailo-8 from 8L: for an 8L set "
            f'families.hailo.types.by_address {{"{address}": hailo8l}})'
        ]

    def watts_key(self, config: FamilyConfig, accelerator: Accelerator) -> str:
        """The model, as its GRES type says (8 and 8L share a PCI id: the type decides)."""
        return "hailo8l" if self.gres_type(config, accelerator).lower() == "hailo8l" else "hailo8"

    def udev_rules(self, config: FamilyConfig, own: str, run: str) -> list[str]:
        match = f'SUBSYSTEM=="{CLASS}", KERNEL=="hailo[0-9]*"'
        return [
            "# Hailo-8/8L (hailo_pci driver, /dev/hailoN). Hailo's own 51-hailo-udev.rules gives these mode",
            "# 0666; this later file's := makes the idle ownership final.",
            f'ACTION!="remove", {match}, {own}, {run}',
            f'ACTION=="remove", {match}, {run}',
        ]


FAMILY = HailoFamily()
