"""USB descriptors for the umockdev hardware descriptions, and a reader to check them.

libusb (and so the real libedgetpu) enumerates a USB device from its sysfs
``descriptors`` attribute: the 18-byte device descriptor followed by each
configuration descriptor with its interfaces, endpoints and class descriptors,
exactly as the kernel exposes them. Without it, libusb skips the device; without it on
a hub, libusb cannot link a device to its parent and reports ``3-1.4.2`` as ``3-2``.
umockdev stores binary attributes as ``H: descriptors=<hex>``.

The bytes are built here from the USB 2.0/3.x specifications (chapter 9 layouts,
SuperSpeed endpoint companions), the DFU 1.1 specification, and what libedgetpu's
driver reads (``driver/usb``: vendor-specific interface with bulk OUT 1, bulk IN 1 and
2, interrupt IN 3 once the firmware runs; a DFU interface, class 0xFE subclass 1, with
its functional descriptor before). They are not a byte dump of a physical stick.

``python tests/usb_descriptors.py KIND SPEED`` prints the hex for one kind.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass

SUPERSPEED = 5000  # sysfs "speed" in Mbit/s; 480 high speed, 12 full speed
ROOT_HUB_BCD_DEVICE = 0x0601  # the kernel puts its version here (6.1, Debian bookworm)


def device_descriptor(
    bcd_usb: int,
    device_class: int,
    subclass: int,
    protocol: int,
    max_packet0: int,
    vendor: int,
    product: int,
    bcd_device: int,
    strings: tuple[int, int, int] = (0, 0, 0),
) -> bytes:
    """The 18-byte device descriptor (one configuration)."""
    return struct.pack(
        "<BBHBBBBHHHBBBB",
        18,
        1,
        bcd_usb,
        device_class,
        subclass,
        protocol,
        max_packet0,
        vendor,
        product,
        bcd_device,
        *strings,
        1,
    )


def interface(number: int, endpoints: int, cls: int, subclass: int, protocol: int) -> bytes:
    return struct.pack("<BBBBBBBBB", 9, 4, number, 0, endpoints, cls, subclass, protocol, 0)


def endpoint(address: int, attributes: int, max_packet: int, interval: int) -> bytes:
    return struct.pack("<BBBBHB", 7, 5, address, attributes, max_packet, interval)


def ss_companion(max_burst: int = 0, bytes_per_interval: int = 0) -> bytes:
    """SuperSpeed endpoint companion: follows every endpoint of a SuperSpeed device."""
    return struct.pack("<BBBBH", 6, 0x30, max_burst, 0, bytes_per_interval)


def configuration(body: bytes, interfaces: int, attributes: int, max_power: int) -> bytes:
    """A configuration descriptor (value 1) with its interfaces etc. after it."""
    return struct.pack("<BBHBBBBB", 9, 2, 9 + len(body), interfaces, 1, 0, attributes, max_power) + body


BULK, INTERRUPT = 2, 3


def _hub(speed: int, vendor: int, product: int, bcd_device: int, root: bool) -> bytes:
    """A hub: class 9, one interface with one interrupt IN endpoint (status change)."""
    if speed >= SUPERSPEED:
        device = device_descriptor(0x0300, 9, 0, 3, 9, vendor, product, bcd_device, (3, 2, 1) if root else (1, 2, 0))
        body = interface(0, 1, 9, 0, 0) + endpoint(0x81, INTERRUPT, 4 if root else 2, 12) + ss_companion(0, 2)
        power = 0  # self-powered (root hub or not)
    else:
        device = device_descriptor(0x0200, 9, 0, 1, 64, vendor, product, bcd_device, (3, 2, 1) if root else (0, 0, 0))
        body = interface(0, 1, 9, 0, 0) + endpoint(0x81, INTERRUPT, 4 if root else 1, 12)
        power = 0 if root else 1
    return device + configuration(body, 1, 0xE0, power)


def root_hub(speed: int, bcd_device: int = ROOT_HUB_BCD_DEVICE) -> bytes:
    """The kernel's root hub: 1d6b:0003 on a SuperSpeed bus, 1d6b:0002 on a USB 2 bus; ``bcd_device``
    is the kernel's version (Raspberry Pi OS bookworm's 6.12 kernel: 0x0612)."""
    return _hub(speed, 0x1D6B, 3 if speed >= SUPERSPEED else 2, bcd_device, root=True)


def hub(speed: int) -> bytes:
    """An external 4-port hub (Genesys Logic GL3523 on SuperSpeed, GL850G on USB 2)."""
    if speed >= SUPERSPEED:
        return _hub(speed, 0x05E3, 0x0626, 0x0663, root=False)
    return _hub(speed, 0x05E3, 0x0608, 0x6070, root=False)


def smsc_hub() -> bytes:
    """The Raspberry Pi 3's on-board hub (SMSC LAN9514, 0424:9514), high speed."""
    return device_descriptor(0x0200, 9, 0, 2, 64, 0x0424, 0x9514, 0x0200) + configuration(
        interface(0, 1, 9, 0, 1) + endpoint(0x81, INTERRUPT, 1, 12), 1, 0xE0, 1
    )


def vl805_hub() -> bytes:
    """The Raspberry Pi 4's USB 2 hub inside its VL805 xHCI controller (VIA Labs 2109:3431, at ``1-1``:
    the USB 2 lines of all four ports), as ``lsusb -v`` shows it on a Pi 4: bcdUSB 2.10, single TT,
    bcdDevice 4.21 (4.20 with older VL805 firmware), only iProduct ("USB2.0 Hub"), self-powered with
    MaxPower 100 mA, 25-byte configuration with one interrupt IN endpoint."""
    return device_descriptor(0x0210, 9, 0, 1, 64, 0x2109, 0x3431, 0x0421, (0, 1, 0)) + configuration(
        interface(0, 1, 9, 0, 0) + endpoint(0x81, INTERRUPT, 1, 12), 1, 0xE0, 50
    )


def coral_runtime(speed: int) -> bytes:
    """A Coral USB Accelerator running its firmware (18d1:9302): one vendor interface,
    bulk OUT 0x01, bulk IN 0x81 (output activations) and 0x82 (events), interrupt IN 0x83."""
    if speed >= SUPERSPEED:
        device = device_descriptor(0x0310, 0, 0, 0, 9, 0x18D1, 0x9302, 0x0100)
        body = interface(0, 4, 0xFF, 0xFF, 0xFF)
        for address, kind, size, interval in (
            (0x01, BULK, 1024, 0),
            (0x81, BULK, 1024, 0),
            (0x82, BULK, 1024, 0),
            (0x83, INTERRUPT, 8, 8),
        ):
            body += endpoint(address, kind, size, interval)
            body += ss_companion(15 if kind == BULK else 0, 8 if kind == INTERRUPT else 0)
        return device + configuration(body, 1, 0x80, 112)  # 112 x 8 mA = 896 mA
    device = device_descriptor(0x0210, 0, 0, 0, 64, 0x18D1, 0x9302, 0x0100)
    body = interface(0, 4, 0xFF, 0xFF, 0xFF)
    for address, kind, size, interval in (
        (0x01, BULK, 512, 0),
        (0x81, BULK, 512, 0),
        (0x82, BULK, 512, 0),
        (0x83, INTERRUPT, 8, 4),
    ):
        body += endpoint(address, kind, size, interval)
    return device + configuration(body, 1, 0x80, 250)  # 250 x 2 mA = 500 mA


def coral_bootloader(speed: int) -> bytes:
    """A Coral USB Accelerator waiting for its firmware (1a6e:089a): a DFU 1.1 interface
    (class 0xFE, subclass 1, protocol 2 = DFU mode, no endpoints) and its functional
    descriptor (can download and upload, will detach, 256-byte transfers)."""
    bcd_usb, max_packet0 = (0x0310, 9) if speed >= SUPERSPEED else (0x0210, 64)
    device = device_descriptor(bcd_usb, 0, 0, 0, max_packet0, 0x1A6E, 0x089A, 0x0100)
    functional = struct.pack("<BBBHHH", 9, 0x21, 0x0B, 255, 256, 0x0110)
    power = 112 if speed >= SUPERSPEED else 250
    return device + configuration(interface(0, 0, 0xFE, 0x01, 0x02) + functional, 1, 0x80, power)


def hid_keyboard() -> bytes:
    """A full-speed boot keyboard (Logitech 046d:c31c): HID interface, interrupt IN 0x81."""
    device = device_descriptor(0x0110, 0, 0, 0, 8, 0x046D, 0xC31C, 0x6400, (1, 2, 0))
    hid = struct.pack("<BBHBBBH", 9, 0x21, 0x0110, 0, 1, 0x22, 65)
    return device + configuration(interface(0, 1, 3, 1, 1) + hid + endpoint(0x81, INTERRUPT, 8, 10), 1, 0xA0, 45)


KINDS = {
    "root-hub": root_hub,
    "hub": hub,
    "coral-runtime": coral_runtime,
    "coral-bootloader": coral_bootloader,
    "smsc-hub": lambda speed: smsc_hub(),
    "vl805-hub": lambda speed: vl805_hub(),
    "pi-root-hub": lambda speed: root_hub(speed, 0x0612),
    "keyboard": lambda speed: hid_keyboard(),
}


# -- reading them back (for the tests that check the hardware files) ---------------------------


@dataclass(frozen=True)
class Descriptors:
    """What matters of a ``descriptors`` attribute, decoded."""

    bcd_usb: int
    device_class: int
    max_packet0: int
    vendor: str  # "18d1", as sysfs idVendor
    product: str
    config_total_length: int
    config_bytes: int  # bytes present after the device descriptor
    interface_classes: tuple[int, ...]
    endpoints: tuple[tuple[int, int], ...]  # (bEndpointAddress, transfer type)


def parse(data: bytes) -> Descriptors:
    """Decode a ``descriptors`` attribute; raises ValueError when it is malformed."""
    if len(data) < 18 + 9 or data[0] != 18 or data[1] != 1:
        raise ValueError("no 18-byte device descriptor at the start")
    (_, _, bcd_usb, device_class, _, _, max_packet0, vendor, product, _, _, _, _, configurations) = struct.unpack_from(
        "<BBHBBBBHHHBBBB", data
    )
    if configurations != 1:
        raise ValueError(f"bNumConfigurations is {configurations}, these descriptions hold one")
    config = data[18:]
    if config[1] != 2:
        raise ValueError("no configuration descriptor after the device descriptor")
    total = struct.unpack_from("<H", config, 2)[0]
    classes, endpoints, cursor = [], [], 0
    while cursor < len(config):
        length, kind = config[cursor], config[cursor + 1]
        if length == 0 or cursor + length > len(config):
            raise ValueError(f"descriptor at offset {18 + cursor} overruns the data")
        if kind == 4:
            classes.append(config[cursor + 5])
        elif kind == 5:
            endpoints.append((config[cursor + 2], config[cursor + 3] & 3))
        cursor += length
    return Descriptors(
        bcd_usb,
        device_class,
        max_packet0,
        f"{vendor:04x}",
        f"{product:04x}",
        total,
        len(config),
        tuple(classes),
        tuple(endpoints),
    )


if __name__ == "__main__":
    kind, speed = sys.argv[1], int(sys.argv[2])
    print(KINDS[kind](speed).hex())
