"""This node's Container Device Interface (CDI) specs: one per leased family, for ``podman run --device``.

Podman (>= 4.1), Docker (>= 25), containerd and CRI-O read CDI specs from ``/etc/cdi`` and
``/var/run/cdi``; ``slurm-tpu cdi`` writes ours there (``slurm-tpu-<kind>.json``, JSON so that the
hooks' Python needs no YAML). A spec file has one ``kind``, so each family gets its own:
``slurm-tpu.dev/edgetpu``, ``slurm-tpu.dev/hailo`` and, only where ``families.gpu.isolate``
leases GPUs, ``slurm-tpu.dev/gpu`` (elsewhere NVIDIA's own spec, ``nvidia-ctk cdi generate``, is
the way, and ours lists no GPU). Each device is named by its identity, which is also what the
task prolog puts in ``SLURM_TPU_CDI_DEVICES`` (protocol/jobenv.py :func:`cdi_name`).

What a device's edits give a container:

- a PCIe Edge TPU: its ``/dev/apex_N`` node; a Hailo NPU: its ``/dev/hailoN``; a leased GPU: its nodes;
- a USB Edge TPU: the host's ``/dev/bus/usb`` directory. The stick's node changes when its
  firmware loads (1a6e:089a -> 18d1:9302, a new devnum) and libusb opens
  ``/dev/bus/usb/BBB/DDD`` from sysfs (the host's in a rootless container), so a static node
  would be lost; the directory follows, and ownership decides which node opens (the job's
  user owns the job's, every other stays root's 0600);
- for the whole kind: the node's libedgetpu (the patched one ``install --libedgetpu`` put in
  place) bind-mounted read-only over the image's, at ``/usr/lib/<multiarch>/libedgetpu.so.1``
  (where Coral's Debian package puts it, so the image's loader finds it with nothing set), and
  the host's libhailort likewise for Hailo.

Isolation is not the spec's: a rootless container opens host nodes with the user's own uid, so
naming another job's device (``--device``, ``-v /dev/bus/usb:...``) gives a node that does not open.

The job's variables (``EDGETPU_VISIBLE_DEVICES``, ``SLURM_TPU_*``) are not in the spec: a spec
is the node's, not the job's, and a runtime applies each device's ``env`` after the user's, the
last device's winning, so a two-device job would see one. containers.conf's ``env`` passes the
job's own values through (docs/admin-guide.md, "Containers").

A device node keeps its host path in the container: a rootless runtime cannot make nodes and
bind-mounts each from its ``path`` on the host (runc), so CDI's ``hostPath`` (0.5.0) would be
ignored there; ``dev_root`` (tests: nodes materialised away from ``/dev``) only says where the
USB nodes' directory is. So ``cdiVersion`` is 0.3.0, the first with everything used here (device
nodes, mounts with options; Podman 4.1 reads it). Pure: no I/O.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from ..config import Config
from ..hardware import Accelerator, Bus, Inventory
from ..protocol.jobenv import cdi_kind

CDI_VERSION = "0.3.0"
CDI_DIR = "/var/run/cdi"  # the runtimes' directory for generated specs (a tmpfs: gone at reboot)
CDI_DIRS = ("/etc/cdi", CDI_DIR)  # where runtimes read specs; /etc/cdi survives a reboot
SPEC_PREFIX = "slurm-tpu-"  # <CDI_DIR>/slurm-tpu-<kind>.json
USB_DIR = "/dev/bus/usb"
# The CDI spec's name rules (container-device-interface pkg/parser): a vendor is a DNS-like
# name, a class alphanumerics with '-' and '_', a device name also '.' and ':', each beginning
# and ending with an alphanumeric.
_VENDOR = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_CLASS = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_-]*[A-Za-z0-9])?$")
_DEVICE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_READ_ONLY_BIND = ["ro", "nosuid", "nodev", "bind"]


def spec_file_name(kind: str) -> str:
    """The file a family's spec goes to in the CDI directory."""
    return f"{SPEC_PREFIX}{kind}.json"


def _device_edits(accelerator: Accelerator, dev_root: str) -> dict[str, Any]:
    if accelerator.kind == "edgetpu" and accelerator.bus is Bus.USB:
        edits: dict[str, Any] = {
            "mounts": [
                {
                    "hostPath": os.path.join(dev_root, "bus", "usb"),
                    "containerPath": USB_DIR,
                    "options": ["nosuid", "noexec", "rbind"],
                }
            ]
        }
    else:
        edits = {"deviceNodes": [{"path": node, "permissions": "rw"} for node in accelerator.device_nodes]}
    return edits


def render_cdi(
    inventory: Inventory,
    config: Config,
    libraries: Mapping[str, tuple[str, str]] | None = None,
    dev_root: str = "/dev",
) -> dict[str, dict[str, Any]]:
    """kind -> the CDI spec (a JSON object) for each leased family with a usable device here.

    ``libraries``: kind -> (host path, container path) of the node's runtime library that the
    kind's containers get read-only (libedgetpu, libhailort); ``dev_root``: where the inventory's
    nodes live (``/dev``; the tests' materialised nodes elsewhere), which the container sees as ``/dev``.
    """
    specs: dict[str, dict[str, Any]] = {}
    for accelerator in inventory.usable():
        if not config.family(accelerator.kind).lease or not accelerator.device_nodes:
            continue
        spec = specs.setdefault(
            accelerator.kind,
            {"cdiVersion": CDI_VERSION, "kind": cdi_kind(accelerator.kind), "devices": []},
        )
        spec["devices"].append({"name": accelerator.identity, "containerEdits": _device_edits(accelerator, dev_root)})
    for kind, spec in specs.items():
        library = (libraries or {}).get(kind)
        if library:
            host, inside = library
            spec["containerEdits"] = {
                "mounts": [{"hostPath": host, "containerPath": inside, "options": list(_READ_ONLY_BIND)}]
            }
        problems = validate_spec(spec)
        if problems:  # an identity outside the grammar: a bug, never a file a runtime would refuse
            raise ValueError(f"CDI spec for {kind}: {'; '.join(problems)}")
    return specs


def validate_spec(spec: dict[str, Any]) -> list[str]:
    """What in ``spec`` breaks the CDI spec's rules (empty when nothing): version, kind, device
    names (valid, unique), absolute paths, each device with at least one edit."""
    problems = []
    if spec.get("cdiVersion") != CDI_VERSION:
        problems.append(f"cdiVersion {spec.get('cdiVersion')!r} is not {CDI_VERSION}")
    vendor, _, klass = str(spec.get("kind", "")).partition("/")
    if not (_VENDOR.match(vendor) and "." in vendor and _CLASS.match(klass)):
        problems.append(f"kind {spec.get('kind')!r} is not vendor.tld/class")
    devices = spec.get("devices") or []
    if not devices:
        problems.append("no devices")
    names = [d.get("name", "") for d in devices]
    problems += [f"device name {n!r} is not valid" for n in names if not _DEVICE.match(n)]
    problems += [f"device name {n!r} appears twice" for n in sorted(set(names)) if names.count(n) > 1]
    for owner, edits in [("spec", spec.get("containerEdits") or {})] + [
        (d.get("name", "?"), d.get("containerEdits") or {}) for d in devices
    ]:
        if owner != "spec" and not edits:
            problems.append(f"device {owner} has no edits")
        for node in edits.get("deviceNodes", []):
            for key in ("path", "hostPath"):
                if key in node and not str(node[key]).startswith("/"):
                    problems.append(f"{owner}: device node {key} {node[key]!r} is not absolute")
        for mount in edits.get("mounts", []):
            for key in ("hostPath", "containerPath"):
                if not str(mount.get(key, "")).startswith("/"):
                    problems.append(f"{owner}: mount {key} {mount.get(key)!r} is not absolute")
        for entry in edits.get("env", []):
            if "=" not in entry:
                problems.append(f"{owner}: env entry {entry!r} is not NAME=VALUE")
    return problems
