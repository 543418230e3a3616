"""The accelerator identity grammar, in one place: ``<bus>-<address>`` (``usb-2-1.3``, ``pci-0000:03:00.0``,
``platform-<name>``).

Identities name ledger files, slot nodes, usage records and job variables' entries, so they
are kept to ASCII letters and digits and ``:._-``, no ``..``, no comma, at most
:data:`MAX_LENGTH` characters. Plain string checks (no ``re``): the root hooks use this on
every udev event.
"""

from __future__ import annotations

BUSES = ("usb", "pci", "platform")
MAX_LENGTH = 128
_ALLOWED = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:._-")


def is_identity(text: str) -> bool:
    """Whether ``text`` is a well-formed accelerator identity."""
    bus, sep, address = text.partition("-")
    return (
        bool(sep)
        and bus in BUSES
        and bool(address)
        and len(text) <= MAX_LENGTH
        and ".." not in text
        and all(c in _ALLOWED for c in address)
    )
