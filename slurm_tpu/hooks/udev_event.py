"""The udev hook, run by udev as root on device events (``udev/slurm-tpu-udev-event``, or
``slurm-tpu udev-event`` for rules that name the console script and for replaying an event).

For an accelerator the inventory knows (ACTION, DEVPATH, DEVNAME, SUBSYSTEM from udev):

* add/change/bind: re-point its slot node, record the new node in the inventory file,
  and if a job leases the device, hand the *new* node to the job's user within the
  event, so the job never sees "permission denied" after a USB re-enumeration. If the
  lease is being revoked (access/revoke.py), this is the stick coming back: it gets idle
  ownership and leasing.end_revocation ends the release.
* remove: record that the device has no node (the epilog then drains the node if a job held it).
"""

from __future__ import annotations

import os

from ..defaults import SYSFS_ROOT
from .context import HookError, node_from_env, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def _sysfs_attribute(sysfs_root: str, parts: list[str], name: str) -> str | None:
    """A sysfs attribute of the event's device (None when gone: a remove event)."""
    path = os.path.join(sysfs_root, *parts, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 256).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def identity_for(environ: Mapping[str, str], rules, sysfs_root: str = SYSFS_ROOT, known=None) -> str | None:
    """The stable identity of the event's device, or None if it is not ours.

    ``rules`` (the families' UdevRule list) say how: for USB ``usb-`` + the topology path
    (DEVPATH's last component), for a PCIe Edge TPU and DRM nodes ``pci-`` + the PCI address
    two levels up, for a class device that is no child of its PCI device (Hailo's) ``pci-`` +
    its ``board_location`` attribute; a remove event of that kind has no sysfs left and is
    found by its DEVNAME among the ``known`` devices."""
    from ..identity import is_identity

    devpath = environ.get("DEVPATH", "")
    subsystem = environ.get("SUBSYSTEM", "")
    parts = [p for p in devpath.split("/") if p]
    if not parts or ".." in parts:
        return None
    for rule in rules:
        if rule.subsystem != subsystem or (rule.devtype and environ.get("DEVTYPE", rule.devtype) != rule.devtype):
            continue
        if rule.attribute:
            value = _sysfs_attribute(sysfs_root, parts, rule.attribute)
            if value is None:
                devname = os.path.normpath(environ.get("DEVNAME", "") or "/")
                found = [d.identity for d in (known or {}).values() if devname in d.device_nodes]
                return found[0] if found else None
            candidate = f"{rule.bus}-{value}"
        elif rule.depth and len(parts) >= rule.depth:
            candidate = f"{rule.bus}-{parts[-rule.depth]}"
        else:
            continue
        return candidate if is_identity(candidate) else None
    return None


def run(environ: Mapping[str, str]) -> int:
    from ..access import node_inventory, ownership
    from ..access.ledger import HELD, REVOKING, Lease, Ledger
    from ..access.slots import ensure_slot
    from ..protocol import audit
    from ..protocol.inventory import FILE_NAME, KnownDevice
    from . import settings as hook_settings

    action = environ.get("ACTION", "")
    # Every job on a revoked USB stick brings two events: the snapshot when current.
    settings = hook_settings.load(environ, node_from_env(environ))
    identity = identity_for(environ, settings.udev, settings.sysfs_root, settings.devices)
    if identity is None:
        return 0
    with Ledger(settings.state_dir) as ledger, ledger.locked():
        # The inventory's devices: the snapshot's copy while the file is the version it was taken from,
        # else the file (another event may have rewritten it).
        inventory = os.path.join(settings.state_dir, FILE_NAME)
        current = settings.sources.get(inventory) == hook_settings.file_key(inventory)
        device = (settings.devices if current else node_inventory.load(ledger.dir_fd)).get(identity)
        if device is None:
            return 0  # not configured on this node (gres-conf has not been run for it)
        if action == "remove":
            if device.device_nodes and node_inventory.set_device_nodes(ledger.dir_fd, identity, ()):
                ledger.audit(audit.REMOVE, identity=identity)
                settings.devices[identity] = KnownDevice(identity, device.kind, device.bus, ())
                hook_settings.store_snapshot(ledger.dir_fd, settings)
            return 0
        if action not in ("add", "change", "bind"):
            return 0
        devname = os.path.normpath(environ.get("DEVNAME", ""))
        if not os.path.isabs(devname) or ownership.node_state(devname) is None:  # not a char device
            raise HookError(f"udev-event: {identity}: DEVNAME {devname!r} is not a character device node")
        policy = settings.families.get(device.kind)
        slotted = policy is not None and policy.slot
        if slotted:  # the slot follows the device's one node; other families keep their listed nodes
            ensure_slot(settings.slot_dir, identity, devname)
        nodes = (devname,) if slotted else device.device_nodes
        # Unchanged (the usual event): no inventory.json rewrite, so no json import.
        changed = nodes != device.device_nodes and node_inventory.set_device_nodes(ledger.dir_fd, identity, nodes)
        lease = ledger.read(identity)
        # The stick is back after the epilog power-cycled its port (every fd on the old
        # usb_device is dead): this event finishes that release, so the node is idle.
        finishing = isinstance(lease, Lease) and lease.phase == REVOKING and devname not in lease.device_nodes
        uid, gid, mode = ownership.owner_for(None if finishing else lease, settings)
        for node in nodes:
            ownership.set_owner(node, identity, uid, gid, mode)
        if finishing and isinstance(lease, Lease):  # finishing: always a Lease (the isinstance is for mypy)
            from .leasing import end_revocation  # only then: the usual event need not load it

            end_revocation(ledger, lease, nodes)
        elif lease is not None or changed:
            # The uid only for a lease its job holds: one kept by an epilog, being revoked (the old
            # device's own event) or unreadable is not free, and not the job's (owner_for: root only).
            holder = {} if lease is None else {"job_id": lease.job_id}
            if isinstance(lease, Lease) and lease.phase == HELD:
                holder["uid"] = lease.uid
            ledger.audit(audit.REENUMERATE, identity=identity, **holder, nodes=list(nodes), changed=changed)
        if changed:
            # Keep the hooks' snapshot current, or the next prolog rereads the YAML config.
            settings.devices[identity] = KnownDevice(identity, device.kind, device.bus, nodes)
            hook_settings.store_snapshot(ledger.dir_fd, settings)
    return 0


def main(environ: Mapping[str, str] | None = None, probe=None) -> int:
    """Entry point (udev/slurm-tpu-udev-event and ``slurm-tpu udev-event``); 0, or 1 after one error line.
    ``probe``: the event's timing (hooks/probe.py), whose line this writes."""
    environ = os.environ if environ is None else environ
    try:
        return run(environ)
    except HookError as exc:
        say(str(exc))
    except Exception as exc:  # noqa: BLE001 - one error line for whatever went wrong, exit 1
        say(f"udev-event: {environ.get('DEVPATH', '?')}: {type(exc).__name__}: {exc}")
    finally:
        if probe is not None:
            probe.finish("udev-event")
    return 1
