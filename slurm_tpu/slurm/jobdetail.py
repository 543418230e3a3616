"""A job's GRES indices on one node, from ``scontrol show job -d`` text (no ``re``, ``json`` or
``dataclasses``: the prolog imports it on every job)."""

from __future__ import annotations

from ..protocol import Record


class ForgedOutputError(ValueError):
    """scontrol output that only a forged job string explains: ask again in JSON."""


class SiblingsOnNode(Exception):
    """Other tasks of the job's array (or components of its het job) also have lines for the node;
    ``selector`` (``123_4``, ``123+1``) asks ``scontrol show job -d`` for the job alone."""

    def __init__(self, selector: str):
        super().__init__(selector)
        self.selector = selector


class GresAlloc(Record):
    """One ``name:type:count(IDX:...)`` item of a job's per-node GRES detail."""

    __hash__ = Record.value_hash  # never changed once made

    __slots__ = ("name", "type", "count", "indices")

    def __init__(self, name: str, type: str | None, count: int, indices: tuple[int, ...]):
        self.name, self.type, self.count, self.indices = name, type, count, tuple(indices)


def _split_top_level(text: str, open_char: str = "[", close_char: str = "]") -> list[str]:
    parts: list[str] = []
    depth = start = 0
    for position, char in enumerate(text):
        if char == open_char:
            depth += 1
        elif char == close_char:
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced '{close_char}' in '{text}'")
        elif char == "," and depth == 0:
            parts.append(text[start:position])
            start = position + 1
    if depth:
        raise ValueError(f"unbalanced '{open_char}' in '{text}'")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def expand_hostlist(expression: str) -> list[str]:
    """``n[1-3,5],gpu01`` -> [n1, n2, n3, n5, gpu01] (leading zeros kept: ``[01-02]``); also gres.conf
    ``File=`` ranges (``/dev/nvidia[0-1]``). ValueError on malformed brackets or ranges."""
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
    prefix, body, rest = text[:start], text[start + 1 : end], text[end + 1 :]
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
    """``tpu:edgetpu_usb:1(IDX:0),gpu:1(IDX:0-1),tpu_shard(CNT:2)`` -> [GresAlloc...] (a count-only
    item, without ``(IDX:...)`` or with ``(CNT:n)``, has no indices); ValueError on anything else."""
    items = []
    for token in _split_top_level(text, "(", ")"):
        head, paren, tail = token.partition("(")
        name, *rest = head.split(":")
        if not name or len(rest) > 2:
            raise ValueError(f"cannot parse GRES item '{token}'")
        # name[:type][:count]: a lone second part is the count when it is a number.
        count_text = rest.pop() if len(rest) == 2 or (rest and rest[0].isdigit()) else None
        kind = rest[0] if rest else None
        indices: tuple[int, ...] = ()
        if paren and tail.startswith("CNT:") and tail.endswith(")"):
            # A GRES with no device files (a counted one such as tpu_shard): Slurm writes its count,
            # ``tpu_shard(CNT:2)``, where a GRES with files has indices.
            if count_text is not None or not tail[4:-1].isdigit():
                raise ValueError(f"cannot parse GRES item '{token}'")
            count_text, paren = tail[4:-1], ""
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


def _header(line: str) -> dict[str, str]:
    """``JobId=5 ArrayJobId=5 ArrayTaskId=2 JobName=...`` -> fields before JobName (Slurm's own text)."""
    fields = {}
    for token in line.split(" "):
        key, sep, value = token.partition("=")
        if key == "JobName" or not sep:
            break
        fields[key] = value
    return fields


def _covers(line: str, node: str) -> bool:
    hosts = line[len("Nodes=") :].split(" ", 1)[0]
    try:
        return node in expand_hostlist(hosts)
    except ValueError:
        return True  # unparseable: treat as a possible forgery of ours


def parse_scontrol_job_detail(text: str, node: str, job_id: int, narrowed: bool = False) -> list[GresAlloc] | None:
    """Job ``job_id``'s GRES on ``node`` from ``scontrol show job -d`` text (22.05 and 25.11 alike).

    The text is a list of records, each starting with a ``JobId=`` line, with per-node
    detail lines such as ``     Nodes=n1 CPU_IDs=0 Mem=0 GRES=tpu:x:1(IDX:0)``. Asked for
    an array's master id (a het job's leader), Slurm lists every task (component) as a
    record of its own. A job name (or 25.11's ``SubmitLine=``) holding newlines can forge
    lines *and whole records* (tests/slurm/captured/*/show_job_d_forged.txt), but cannot
    change the first line (the job asked for, its JobId/ArrayTaskId/HetJobOffset before
    the name) nor remove Slurm's own detail line. Hence:

    - the job's record (the first) with one line for ``node`` and no line for
      ``node`` anywhere else: that line is Slurm's (a forged record before it
      would have taken Slurm's line with it);
    - lines for ``node`` in other records too: when the first line says the job is
      array task T (or het component O) raise SiblingsOnNode with the selector
      ``JOB_T`` (``JOB+O``) that lists the job alone; otherwise ForgedOutputError;
    - ``narrowed`` (the text answers such a selector): any other record, or more
      than one line for ``node``, is ForgedOutputError.

    ForgedOutputError means: ask again in JSON, which cannot be forged. None: not on ``node``.
    """
    records: list[tuple[dict[str, str], list[str]]] = []
    for line in text.splitlines():
        if line.startswith("JobId="):
            records.append((_header(line), []))
            continue
        stripped = line.strip()
        if stripped.startswith("Nodes=") and " CPU_IDs=" in stripped and _covers(stripped, node):
            if not records:
                raise ForgedOutputError(f"a detail line for {node} before any JobId= line")
            records[-1][1].append(stripped)
    if not records:
        return None
    first = records[0][0]
    if first.get("JobId") != str(job_id):
        raise ForgedOutputError(f"scontrol listed job {first.get('JobId')} first, not {job_id}")
    if sum(1 for header, _ in records if header.get("JobId") == str(job_id)) > 1:
        raise ForgedOutputError(f"more than one JobId={job_id} record")
    own = records[0][1]
    if len(own) > 1:
        raise ForgedOutputError(f"{len(own)} detail lines of job {job_id} cover node {node}")
    if narrowed and len(records) > 1:
        raise ForgedOutputError(f"{len(records)} records for a single job or task")
    if any(lines for _, lines in records[1:]):
        task, offset = first.get("ArrayTaskId", ""), first.get("HetJobOffset", "")
        if first.get("ArrayJobId") == str(job_id) and task.isdigit():
            raise SiblingsOnNode(f"{job_id}_{task}")
        if first.get("HetJobId") == str(job_id) and offset.isdigit():
            raise SiblingsOnNode(f"{job_id}+{offset}")
        raise ForgedOutputError(f"detail lines for {node} in records of other jobs")
    if not own:
        return None
    for token in own[0].split(" "):
        if token.startswith("GRES="):
            return parse_gres_detail(token[len("GRES=") :])
    return []
