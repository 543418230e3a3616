"""Reading and writing the node-local inventory file ``<state_dir>/inventory.json`` safely.

Hooks read this instead of running detection (pyudev is slow to import and
would run on every job). Its name and shape, and the :class:`KnownDevice`
records the hooks use, are :mod:`slurm_tpu.protocol.inventory`; this module
reads and writes it inside the state directory (never through a link, atomically).
"""

from __future__ import annotations

from ..protocol import FormatError, inventory
from ..protocol.inventory import FILE_NAME, KnownDevice, parse_inventory
from . import statedir


def save(dir_fd: int, document: dict[str, object]) -> None:
    """Write the inventory document atomically (world-readable, like ``slurm-tpu detect``)."""
    statedir.write_atomic(dir_fd, FILE_NAME, inventory.encode(document))


def load_document(dir_fd: int) -> dict[str, object] | None:
    """The raw document, or None when the node has no inventory file yet."""
    data = statedir.read_file(dir_fd, FILE_NAME)
    if data is None:
        return None
    try:
        return inventory.decode(data)
    except FormatError as exc:
        raise statedir.StateDirError(str(exc), FILE_NAME) from exc


def load(dir_fd: int) -> dict[str, KnownDevice]:
    """identity -> KnownDevice; {} when there is no inventory file."""
    document = load_document(dir_fd)
    return parse_inventory(document) if document else {}


def set_device_nodes(dir_fd: int, identity: str, nodes: tuple[str, ...]) -> bool:
    """Record a device's new node path(s). True when the file changed.
    The caller holds the state lock (``Ledger.locked()``, access/ledger.py) so two udev events
    cannot lose each other's update."""
    document = load_document(dir_fd)
    if document is None or not inventory.set_device_nodes(document, identity, nodes):
        return False
    save(dir_fd, document)
    return True


def write_state_inventory(state_dir: str, document: dict[str, object]) -> None:
    """Create the state directory if needed and (re)write its inventory file."""
    import os

    fd = statedir.open_dir(state_dir, create=True)
    try:
        save(fd, document)
    finally:
        os.close(fd)
