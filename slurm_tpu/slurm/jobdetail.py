"""A job's GRES indices on one node, from ``scontrol show job -d`` text.

Deliberately light (no ``re``, ``json``, ``dataclasses``): the prolog imports it
on every job. ``parse.py`` re-exports these names for everything else.
"""

from __future__ import annotations


class ForgedOutputError(ValueError):
    """scontrol output holds more than one detail line for the node (a job string forged one)."""


class GresAlloc:
    """One ``name:type:count(IDX:...)`` item of a job's per-node GRES detail."""

    __slots__ = ("name", "type", "count", "indices")

    def __init__(self, name: str, type: str | None, count: int, indices: tuple[int, ...]):
        self.name, self.type, self.count, self.indices = name, type, count, tuple(indices)

    def _key(self) -> tuple:
        return (self.name, self.type, self.count, self.indices)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GresAlloc) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"GresAlloc(name={self.name!r}, type={self.type!r}, count={self.count}, indices={self.indices})"


def _split_top_level(text: str, open_char: str = "[", close_char: str = "]") -> list[str]:
    parts, depth, current = [], 0, []
    for char in text:
        if char == open_char:
            depth += 1
        elif char == close_char:
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced '{close_char}' in '{text}'")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise ValueError(f"unbalanced '{open_char}' in '{text}'")
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def expand_hostlist(expression: str) -> list[str]:
    """``n[1-3,5],gpu01`` -> [n1, n2, n3, n5, gpu01] (leading zeros kept: ``[01-02]``).

    Also expands device ranges in gres.conf ``File=`` (``/dev/nvidia[0-1]``).
    Raises ValueError on malformed brackets or ranges.
    """
    names: list[str] = []
    for part in _split_top_level(expression):
        names.extend(_expand_one(part))
    return names


def _expand_one(text: str) -> list[str]:
    start = text.find("[")
    if start < 0:
        if "]" in text:
            raise ValueError(f"unbalanced ']' in '{text}'")
        return [text]
    end = text.find("]", start)
    if end < 0:
        raise ValueError(f"unbalanced '[' in '{text}'")
    prefix, body, rest = text[:start], text[start + 1:end], text[end + 1:]
    values: list[str] = []
    for item in body.split(","):
        low, sep, high = item.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"bad range '{item}' in '{text}'")
        if not sep:
            values.append(low)
            continue
        width = len(low) if low.startswith("0") else 0
        if int(high) < int(low) or int(high) - int(low) > 100000:
            raise ValueError(f"bad range '{item}' in '{text}'")
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    tails = _expand_one(rest)
    return [prefix + value + tail for value in values for tail in tails]


def parse_gres_detail(text: str) -> list[GresAlloc]:
    """``tpu:edgetpu_usb:1(IDX:0),gpu:1(IDX:0-1)`` -> [GresAlloc...].

    Items without an ``(IDX:...)`` part (count-only GRES) have no indices.
    Raises ValueError on anything else.
    """
    items = []
    for token in _split_top_level(text, "(", ")"):
        head, paren, tail = token.partition("(")
        parts = head.split(":")
        if not parts[0] or len(parts) > 3:
            raise ValueError(f"cannot parse GRES item '{token}'")
        name, kind, count_text = parts[0], None, None
        if len(parts) == 3:
            kind, count_text = parts[1], parts[2]
        elif len(parts) == 2:
            if parts[1].isdigit():
                count_text = parts[1]
            else:
                kind = parts[1]
        indices: tuple[int, ...] = ()
        if paren:
            if not tail.startswith("IDX:") or not tail.endswith(")"):
                raise ValueError(f"cannot parse GRES item '{token}'")
            idx = tail[4:-1]
            if idx and idx != "N/A":
                if not all(c.isdigit() or c in ",-" for c in idx):
                    raise ValueError(f"cannot parse GRES item '{token}'")
                indices = tuple(int(i) for i in expand_hostlist(f"[{idx}]"))
        if count_text is not None and not count_text.isdigit():
            raise ValueError(f"cannot parse GRES item '{token}'")
        count = int(count_text) if count_text is not None else max(len(indices), 1)
        items.append(GresAlloc(name, kind or None, count, indices))
    return items


def parse_scontrol_job_detail(text: str, node: str) -> list[GresAlloc] | None:
    """The job's GRES on ``node`` from ``scontrol show job -d JOB`` text.

    Per-node detail lines look like ``Nodes=n1 CPU_IDs=0 Mem=0 GRES=tpu:x:1(IDX:0)``.
    A job name, comment or path holding a newline can forge such a line, but
    cannot remove Slurm's own: so more than one line covering ``node`` means
    forged output and raises ForgedOutputError (the caller asks again in JSON).
    None when no line covers the node (job not on this node).
    """
    found: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("Nodes=") or " CPU_IDs=" not in stripped:
            continue
        hosts = stripped[len("Nodes="):].split(" ", 1)[0]
        try:
            covers = node in expand_hostlist(hosts)
        except ValueError:
            covers = True  # unparseable: treat as a possible forgery of ours
        if covers:
            found.append(stripped)
    if len(found) > 1:
        raise ForgedOutputError(f"{len(found)} detail lines cover node {node}")
    if not found:
        return None
    for token in found[0].split(" "):
        if token.startswith("GRES="):
            return parse_gres_detail(token[len("GRES="):])
    return []
