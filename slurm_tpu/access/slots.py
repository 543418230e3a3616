"""Slot nodes: the stable device paths gres.conf names for Edge TPUs (docs/architecture.md).

A slot is a char device node ``<slot_dir>/<identity>``, root:root 0600, with the major:minor
of the device's current node, re-pointed (mknod + rename) whenever udev reports the device
again and never deleted: slurmd must never find a ``File=`` path missing. Nobody opens a slot.
"""

from __future__ import annotations

import os
import stat

from ..errors import DeviceError
from ..identity import is_identity
from .ownership import node_state, strip_acl


def _slot_path(slot_dir: str, identity: str) -> str:
    """``<slot_dir>/<identity>`` for a well-formed identity (slurm_tpu/identity.py), the directory made
    if missing; DeviceError for a bad identity or a slot directory that is no plain directory."""
    if not is_identity(identity):
        raise DeviceError(f"'{identity}' is not an accelerator identity (e.g. usb-2-1.3, pci-0000:03:00.0)", identity)
    try:
        info = os.lstat(slot_dir)
    except FileNotFoundError:
        os.makedirs(slot_dir, mode=0o755, exist_ok=True)
    else:
        if not stat.S_ISDIR(info.st_mode):
            # A planted symlink or file here must not redirect our mknod/rename.
            raise DeviceError(f"slot directory {slot_dir} is not a plain directory; remove it", slot_dir)
    return os.path.join(slot_dir, identity)


# An inert placeholder: char 0:0 reaches no driver (open gives ENXIO). Used for a
# configured device that is absent at boot, so slurmd still finds every File=.
PLACEHOLDER_RDEV = os.makedev(0, 0)


def _make_slot(slot_dir: str, identity: str, rdev: int) -> None:
    path = os.path.join(slot_dir, identity)
    tmp = os.path.join(slot_dir, f".{identity}.{os.getpid()}")
    try:
        os.mknod(tmp, stat.S_IFCHR | 0o600, rdev)
        # A default ACL on the slot directory would be inherited by the new node
        # (fs/posix_acl.c posix_acl_create): slots are root's alone, whatever the directory says.
        strip_acl(tmp)
        os.chmod(tmp, 0o600)  # umask may have narrowed or the old mode lingered
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise DeviceError(
            f"{identity}: cannot create slot node {path}: {exc.strerror} (slot nodes need root)", identity
        ) from exc


def ensure_placeholder_slot(slot_dir: str, identity: str) -> bool:
    """Make sure ``<slot_dir>/<identity>`` exists; create an inert node if not. True if created."""
    if os.path.lexists(_slot_path(slot_dir, identity)):
        return False
    _make_slot(slot_dir, identity, PLACEHOLDER_RDEV)
    return True


def ensure_slot(slot_dir: str, identity: str, device_node: str) -> bool:
    """Make ``<slot_dir>/<identity>`` a node with ``device_node``'s major:minor; True when the slot
    was created or re-pointed, False when it was right."""
    path = _slot_path(slot_dir, identity)
    try:
        source = os.stat(device_node)
    except OSError as exc:
        raise DeviceError(f"{identity}: cannot stat its device node {device_node}: {exc.strerror}", identity) from exc
    if not stat.S_ISCHR(source.st_mode):
        raise DeviceError(f"{identity}: {device_node} is not a character device", identity)
    current = node_state(path)
    if current is not None and (current.rdev, current.mode, current.uid) == (source.st_rdev, 0o600, 0):
        return False
    _make_slot(slot_dir, identity, source.st_rdev)
    return True
