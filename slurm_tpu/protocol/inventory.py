"""The node inventory file ``<state_dir>/inventory.json``: its name, its shape, what the hooks read of it.

It has the shape of ``slurm-tpu detect --json`` (an ``accelerators`` list with one object
per device: ``identity``, ``kind``, ``bus``, ``device_nodes``, ``usable``, and more the
hooks do not read). ``gres-conf --output`` writes it, ``udev-event`` rewrites a device's
``device_nodes`` when a USB stick re-enumerates (root, both), and every hook reads it (or
the hooks' snapshot made from it). It is the *only* source of device node paths the hooks
will chown: never gres.conf, never job input. The I/O (inside the state directory, never
through a link) is :mod:`slurm_tpu.access.node_inventory`'s; the persistent copy
(``inventory_file`` in the config) has the same shape.
"""

from __future__ import annotations

from ..defaults import INVENTORY_NAME
from . import FormatError, Record

TYPE_CHECKING = False  # annotations only: importing typing costs the hooks milliseconds per job
if TYPE_CHECKING:
    from typing import Any

FILE_NAME = INVENTORY_NAME


class KnownDevice(Record):
    """What a hook needs to know about one accelerator (no slurm_tpu.hardware import)."""

    __hash__ = Record.value_hash  # never changed once made

    __slots__ = ("identity", "kind", "bus", "device_nodes")

    def __init__(self, identity: str, kind: str, bus: str, device_nodes: tuple[str, ...]):
        self.identity, self.kind, self.bus, self.device_nodes = identity, kind, bus, tuple(device_nodes)

    @property
    def primary_node(self) -> str | None:
        return self.device_nodes[0] if self.device_nodes else None


def parse_inventory(document: dict[str, Any]) -> dict[str, KnownDevice]:
    """identity -> KnownDevice from a ``detect --json`` document (usable devices only)."""
    devices: dict[str, KnownDevice] = {}
    for item in document.get("accelerators", ()):
        if not item.get("usable", True):
            continue
        nodes = tuple(str(n) for n in item.get("device_nodes") or ())
        devices[str(item["identity"])] = KnownDevice(str(item["identity"]), str(item["kind"]), str(item["bus"]), nodes)
    return devices


def encode(document: dict[str, object]) -> bytes:
    """The file's bytes for a document (indented JSON, one newline at the end)."""
    import json

    return (json.dumps(document, indent=1) + "\n").encode()


def decode(data: bytes) -> dict[str, object]:
    """The document in the file's bytes; :class:`~slurm_tpu.protocol.FormatError` (naming the file and
    the command that rewrites it) for anything that is not a ``detect --json`` document."""
    import json

    try:
        document = json.loads(data)
    except ValueError as exc:
        raise FormatError(
            f"{FILE_NAME} in the state directory is not JSON ({exc}); "
            "rerun `slurm-tpu gres-conf --output ...` to rewrite it",
            FILE_NAME,
        ) from exc
    if not isinstance(document, dict) or not isinstance(document.get("accelerators"), list):
        raise FormatError(
            f"{FILE_NAME} in the state directory is not a `slurm-tpu detect --json` "
            "document; rerun `slurm-tpu gres-conf --output ...`",
            FILE_NAME,
        )
    return document


def set_device_nodes(document: dict[str, Any], identity: str, nodes: tuple[str, ...]) -> bool:
    """Record a device's node path(s) in the document; True when that changed it."""
    for item in document["accelerators"]:
        if item.get("identity") == identity:
            if tuple(item.get("device_nodes") or ()) == nodes:
                return False
            item["device_nodes"] = list(nodes)
            return True
    return False
