"""Revocation: making every open fd and mapping of a device useless at job end.

A file mode only stops *new* opens: an fd opened during the job survives a chown, can
be in flight over a Unix socket (SCM_RIGHTS) where no /proc scan sees it, and an
``mmap`` outlives its fd. docs/security.md says what each method covers; what follows
was read in the kernel's and the driver's code (function names given, to check them
against a newer release).

USB Edge TPU (usbfs, /dev/bus/usb/BBB/DDD) — chosen: the hub port's ``disable``
attribute (drivers/usb/core/port.c ``disable_store()``, since Linux 4.20,
commit f061f43d7418 "usb: hub: port: add sysfs entry to switch port power"):

* writing ``1`` calls ``usb_disconnect(&port_dev->child)`` before the write returns,
  destroying the ``usb_device``: devio.c ``usbdev_remove()`` takes every open file's
  ``usb_dev_state`` off ``udev->filelist``, so ``connected()`` is false and every usbfs
  ioctl (``usbdev_do_ioctl()``) fails with ENODEV, for every fd, in flight or not. A
  usbfs mapping (``usbdev_mmap()``) is the fd's own DMA buffer, never device memory.
* writing ``0`` powers the port again; hub_wq enumerates a *new* usb_device, and udev
  runs ``slurm-tpu udev-event`` for it, which finishes the release.

Rejected: ``authorized`` 0 then 1 (hub.c ``usb_deauthorize_device()`` /
``usb_authorize_device()`` reconfigure the *same* usb_device: its fds work again);
``USBDEVFS_RESET`` (hub.c ``usb_reset_device()`` keeps the usb_device unless its
descriptors changed); the device's ``remove`` attribute (sysfs.c ``remove_store()`` ->
hub.c ``usb_remove_device()`` sets ``hub->removed_bits``, forgotten only on a *physical*
connect change). A hub without per-port power switching still disconnects on ``1`` but
may not re-enumerate on ``0``: the next job's prolog then fails, isolation intact.

PCIe Edge TPU (google/gasket-driver, ``apex`` on ``gasket``) — no revocation is
safe, so the driver's own count is checked instead:

* unbinding the driver (apex_driver.c ``apex_pci_remove()`` -> gasket_core.c
  ``gasket_pci_remove_device()`` -> ``gasket_free_dev()``) ``kfree()``s the gasket_dev
  every open file's ``private_data`` still points to: a later ioctl or close is a
  use-after-free in the kernel;
* a PCI function reset leaves the driver bound; fds, ioctls and BAR mappings
  (``gasket_mmap()``) keep working.
* ``gasket_open()`` makes the first writer the owner and refuses other writers EPERM;
  ``gasket_release()`` decrements ``write_open_count``. So sysfs ``write_open_count``
  (``gasket_sysfs_data_show()``) counts every writable open file, one in flight over
  SCM_RIGHTS or kept alive by a mapping (a vma holds its file) too. Read-only opens are
  not counted (``gasket_mmap_has_permissions()`` lets them map BARs read-only): the
  residual, read-only exposure.

Which method applies to a device is its family's ``revocation`` (slurm_tpu/families/,
where each family says why): ``usb-port`` (:func:`disconnect_usb`), ``gasket-writers``
(holder scan + :func:`gasket_writers`), anything else the holder scan alone. GPUs are
not revoked (no per-fd revocation in the driver).
"""

from __future__ import annotations

import os
import time

_O_WRITE = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC

# How long the kernel may take to show a disconnect in sysfs (it is synchronous
# on a real kernel; the emulated one in tests polls).
DISCONNECT_WAIT_S = 10.0


class RevokeError(Exception):
    """Revocation could not be done or verified; the message is the drain reason."""


def _write_attribute(path: str, value: bytes, identity: str) -> None:
    # No O_CREAT: a missing attribute means an older kernel, never a file we make.
    try:
        fd = os.open(path, _O_WRITE)
    except OSError as exc:
        raise RevokeError(
            f"{identity}: cannot open {path} ({exc.strerror}): this kernel cannot power-cycle "
            "the port (needs Linux >= 4.20); set devices.revoke: false to accept "
            "ownership-only isolation"
        ) from exc
    try:
        os.write(fd, value)
    except OSError as exc:
        raise RevokeError(f"{identity}: writing {value.decode()} to {path} failed ({exc.strerror})") from exc
    finally:
        os.close(fd)


def disconnect_usb(sysfs_root: str, identity: str, wait_s: float = DISCONNECT_WAIT_S) -> int | None:
    """Destroy the stick's usb_device (every usbfs fd on it dies), then power its port again.

    Returns the devnum the device had (for the audit), or None when it was already gone. Raises
    RevokeError when the disconnect cannot be done or is not seen in sysfs within ``wait_s``."""
    # usb-2-1.3 -> 2-1.3: the sysfs name, the topology path.
    device = os.path.join(sysfs_root, "bus", "usb", "devices", identity[len("usb-") :])
    try:
        # The kernel's own link from the device to its hub port; resolved now,
        # because the device directory (and the link) goes with the disconnect.
        port = os.path.realpath(os.path.join(device, "port"), strict=True)
        with open(os.path.join(device, "devnum"), "rb") as handle:
            devnum = int(handle.read().strip() or b"0")
    except FileNotFoundError:
        if not os.path.lexists(device):
            return None  # already disconnected: its fds are dead
        raise RevokeError(f"{identity}: {device} has no hub port link; cannot power-cycle it") from None
    except (OSError, ValueError) as exc:
        raise RevokeError(f"{identity}: cannot read {device}: {exc}") from exc
    disable = os.path.join(port, "disable")
    _write_attribute(disable, b"1", identity)
    try:
        deadline = time.monotonic() + wait_s
        pause = 0.0001
        while os.path.lexists(device) and _devnum(device) == devnum:
            if time.monotonic() >= deadline:
                raise RevokeError(
                    f"{identity}: still attached {wait_s:g} s after {disable} was set; its open fds may still work"
                )
            # The kernel disconnects within the write (port.c disable_store() -> usb_disconnect()),
            # so this loop runs only for an emulated core: look often at first, then back off.
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
    finally:
        # Power the port again whatever happened, or the stick stays off for good.
        _write_attribute(disable, b"0", identity)
    return devnum


def _devnum(device: str) -> int:
    try:
        with open(os.path.join(device, "devnum"), "rb") as handle:
            return int(handle.read().strip() or b"0")
    except (OSError, ValueError):
        return -1


def gasket_writers(sysfs_root: str, node: str) -> int | None:
    """How many writable files the apex driver counts open on ``/dev/apex_N``; None if unknown.
    One read(2): sysfs makes an attribute's whole text at the first read (fs/sysfs/file.c
    sysfs_kf_seq_show(), at most a page)."""
    path = os.path.join(sysfs_root, "class", "apex", os.path.basename(node), "write_open_count")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return int(os.read(fd, 4096).strip())
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
