"""The node-local inventory file ``<state_dir>/inventory.json``.

Hooks read this instead of running detection (pyudev is slow to import and
would run on every job). It has the shape of ``slurm-tpu detect --json``;
``slurm-tpu gres-conf --output`` writes it and ``slurm-tpu udev-event`` updates a
device's node path when a USB stick re-enumerates. It is the *only* source of
device node paths the hooks will chown: never gres.conf, never job input.
"""

from __future__ import annotations

from . import statedir

FILE_NAME = "inventory.json"


class KnownDevice:
    """What a hook needs to know about one accelerator (no slurm_tpu.hardware import)."""

    __slots__ = ("identity", "kind", "bus", "device_nodes")

    def __init__(self, identity: str, kind: str, bus: str, device_nodes: tuple[str, ...]):
        self.identity = identity
        self.kind = kind  # a family kind (slurm_tpu/families): "edgetpu", "gpu", "hailo"...
        self.bus = bus  # "usb", "pci", "platform"
        self.device_nodes = tuple(device_nodes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KnownDevice) and (self.identity, self.kind, self.bus, self.device_nodes) == (
            other.identity, other.kind, other.bus, other.device_nodes)

    def __hash__(self) -> int:
        return hash((self.identity, self.device_nodes))

    def __repr__(self) -> str:
        return f"KnownDevice({self.identity!r}, {self.kind!r}, {self.bus!r}, {self.device_nodes!r})"

    @property
    def primary_node(self) -> str | None:
        return self.device_nodes[0] if self.device_nodes else None


def parse_inventory(document: dict[str, object]) -> dict[str, KnownDevice]:
    """identity -> KnownDevice from a ``detect --json`` document (usable devices only)."""
    devices: dict[str, KnownDevice] = {}
    for item in document.get("accelerators", ()):
        if not item.get("usable", True):
            continue
        nodes = tuple(str(n) for n in item.get("device_nodes") or ())
        devices[str(item["identity"])] = KnownDevice(str(item["identity"]), str(item["kind"]),
                                                     str(item["bus"]), nodes)
    return devices


def save(dir_fd: int, document: dict[str, object]) -> None:
    """Write the inventory document atomically (world-readable, like ``slurm-tpu detect``)."""
    import json

    statedir.write_atomic(dir_fd, FILE_NAME, (json.dumps(document, indent=1) + "\n").encode())


def load_document(dir_fd: int) -> dict[str, object] | None:
    """The raw document, or None when the node has no inventory file yet."""
    import json

    data = statedir.read_file(dir_fd, FILE_NAME)
    if data is None:
        return None
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise statedir.StateDirError(f"{FILE_NAME} in the state directory is not JSON ({exc}); "
                                     "rerun `slurm-tpu gres-conf --output ...` to rewrite it", FILE_NAME) from exc
    if not isinstance(document, dict) or not isinstance(document.get("accelerators"), list):
        raise statedir.StateDirError(f"{FILE_NAME} in the state directory is not a `slurm-tpu detect --json` "
                                     "document; rerun `slurm-tpu gres-conf --output ...`", FILE_NAME)
    return document


def load(dir_fd: int) -> dict[str, KnownDevice]:
    """identity -> KnownDevice; {} when there is no inventory file."""
    document = load_document(dir_fd)
    return parse_inventory(document) if document else {}


def set_device_nodes(dir_fd: int, identity: str, nodes: tuple[str, ...]) -> bool:
    """Record a device's new node path(s). True when the file changed.

    The caller holds the state lock (``Ledger.lock()``, access/ledger.py) so two udev events
    cannot lose each other's update.
    """
    document = load_document(dir_fd)
    if document is None:
        return False
    for item in document["accelerators"]:
        if item.get("identity") == identity:
            if tuple(item.get("device_nodes") or ()) == nodes:
                return False
            item["device_nodes"] = list(nodes)
            save(dir_fd, document)
            return True
    return False


def write_state_inventory(state_dir: str, document: dict[str, object]) -> None:
    """Create the state directory if needed and (re)write its inventory file."""
    import os

    from . import statedir as _statedir

    fd = _statedir.open_dir(state_dir, create=True)
    try:
        save(fd, document)
    finally:
        os.close(fd)
