"""Which device a Slurm GRES index (``IDX:n``) is, on one node.

Slurm numbers a node's devices of one GRES name 0, 1, 2... in the order slurmd builds its
merged device list, which is *not* gres.conf order when a node has several types. Verified
against slurmd 22.05.8 (gres.c ``_merge_config``) and a real cluster: for each
``name:type:count`` of the node's slurm.conf ``Gres=``, in written order, slurmd takes the
gres.conf records of that type in file order (``Name=`` lines before ``NodeName=`` lines),
expanding ``File=`` ranges, until ``count`` devices are taken. Example:
``Gres=tpu:edgetpu_pci:2,tpu:edgetpu_usb:2`` with gres.conf lines usb0, pci[1-2], usb3
gives IDX 0,1 = pci1,pci2 and IDX 2,3 = usb0,usb3.
"""

from __future__ import annotations

from collections.abc import Sequence

from .parse import GresConfRecord


def device_order(
    name: str, records: Sequence[GresConfRecord], node_gres: Sequence[tuple[str, str | None, int]] | None
) -> list[tuple[str | None, str | None]]:
    """(type, file) for each index of GRES ``name`` on the node, index = position (file None: a
    count-only device). ``node_gres``: the node's slurm.conf ``Gres=`` items, or None when
    slurm.conf does not describe the node: then the types are taken in order of first
    appearance in gres.conf (what ``slurm-tpu node-conf`` writes).
    """
    mine = [r for r in records if r.name == name]
    pool = sorted(mine, key=lambda r: not r.by_name_line)  # slurmd reads Name= lines before NodeName= lines
    if node_gres is None:
        types: list[str | None] = []
        for record in pool:
            if record.type not in types:
                types.append(record.type)
        wanted = [(t, sum(r.count for r in pool if r.type == t)) for t in types]
    else:
        entries: list[tuple[str | None, int]] = [(t, c) for n, t, c in node_gres if n == name]
        typed: list[tuple[str | None, int]] = [(t, c) for t, c in entries if t is not None]
        wanted = typed or entries
    order: list[tuple[str | None, str | None]] = []
    for type_name, count in wanted:
        remaining = count
        while remaining > 0:
            match = next((r for r in pool if type_name is None or (r.type or "").lower() == type_name.lower()), None)
            if match is None:
                break
            pool.remove(match)
            take = min(match.count, remaining)
            files: list[str | None] = list(match.files[:take]) if match.files else [None] * take
            order.extend((match.type or type_name, f) for f in files)
            remaining -= take
        order.extend((type_name, None) for _ in range(remaining))
    return order
