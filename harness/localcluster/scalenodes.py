"""Mixed simulated nodes for large local clusters (the scale benchmark and its CI test).

Every node kind is cut from the umockdev descriptions the tests already use
(tests/isolation/hardware, tests/hardware): whole blocks are kept or dropped,
never edited, so each device stays exactly as its file describes it (USB
descriptors, sysfs links, the apex driver binding) and detection goes through
the real ``slurm-tpu detect`` under umockdev as for every other cluster.

=========  ======================================================  ==========
kind       devices                                                 Edge TPUs
=========  ======================================================  ==========
usb1       one USB stick (``2-1.3`` behind a hub)                   1
pcie1      one PCIe card (``0000:03:00.0``)                        1
mixed2     the stick and the card                                  2
pcie4      four PCIe cards (apex numbering not in bus order)       4
mixed4     two sticks (one awaiting firmware) and two cards        4
none       a USB controller and a keyboard                         0
=========  ======================================================  ==========
"""

from __future__ import annotations

import os

from .cluster import NodeSpec

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ISOLATION = os.path.join(_REPO, "tests", "isolation", "hardware")
_HARDWARE = os.path.join(_REPO, "tests", "hardware")

# kind -> (source file, sysfs path fragments whose blocks are dropped)
_BIG_NODE_OTHERS = ("/1-2", "0000:40:", "0000:c0:", "0000:0a:", "17000000.gpu")
KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "usb1": (os.path.join(_ISOLATION, "n4_one_tpu.umockdev"), ()),
    "pcie1": (os.path.join(_ISOLATION, "n1_two_tpus.umockdev"), ("/usb2/2-1",)),
    "mixed2": (os.path.join(_ISOLATION, "n1_two_tpus.umockdev"), ()),
    "pcie4": (os.path.join(_HARDWARE, "big_node.umockdev"), ("/usb2/2-1", "/usb1/1-1", *_BIG_NODE_OTHERS)),
    "mixed4": (os.path.join(_HARDWARE, "big_node.umockdev"), ("0000:05:00.0", "0000:06:00.0", *_BIG_NODE_OTHERS)),
    "none": (os.path.join(_HARDWARE, "empty_node.umockdev"), ()),
}
TPUS = {"usb1": 1, "pcie1": 1, "mixed2": 2, "pcie4": 4, "mixed4": 4, "none": 0}
USB_STICKS = {"usb1": 1, "pcie1": 0, "mixed2": 1, "pcie4": 0, "mixed4": 2, "none": 0}

# The repeating pattern of a large cluster: 15 Edge TPUs per 8 nodes, one node without any.
PATTERN = ("usb1", "pcie1", "mixed2", "mixed2", "usb1", "pcie4", "mixed4", "none")


def umockdev_text(kind: str) -> str:
    """The umockdev description of one node kind (blocks of its source file, some dropped)."""
    source, dropped = KINDS[kind]
    with open(source, encoding="utf-8") as handle:
        blocks = [b.strip() for b in handle.read().split("\n\n") if b.strip()]
    kept = [b for b in blocks if not any(fragment in b.splitlines()[0] for fragment in dropped)]
    return "\n\n".join(kept) + "\n"


def write_kinds(directory: str, kinds: set[str]) -> dict[str, str]:
    """Write one ``<kind>.umockdev`` per kind into ``directory`` (no ``.extra``: no GPU procfs); kind -> path."""
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for kind in sorted(kinds):
        path = os.path.join(directory, f"{kind}.umockdev")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(umockdev_text(kind))
        paths[kind] = path
    return paths


def layout(count: int, pattern: tuple[str, ...] = PATTERN) -> list[tuple[str, str]]:
    """(node name, kind) for ``count`` nodes, cycling through ``pattern``: s01, s02..."""
    width = max(2, len(str(count)))
    return [(f"s{i + 1:0{width}d}", pattern[i % len(pattern)]) for i in range(count)]


def node_specs(nodes: list[tuple[str, str]], directory: str) -> list[NodeSpec]:
    """NodeSpecs for ``layout()``'s nodes, their hardware files written into ``directory``."""
    paths = write_kinds(directory, {kind for _, kind in nodes})
    # One CPU per Edge TPU at least: four one-CPU jobs fit a node with four TPUs.
    return [NodeSpec(name, paths[kind], cpus=max(2, TPUS[kind])) for name, kind in nodes]
