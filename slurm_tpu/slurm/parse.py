"""Pure parsers of Slurm command output and configuration, tested on captured text (a job's GRES
from ``scontrol show job -d``, which the prolog reads, is jobdetail.py's)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from .jobdetail import GresAlloc, expand_hostlist, parse_gres_detail


def parse_key_values(line: str) -> dict[str, str]:
    """``A=1 B=two`` -> {"A": "1", "B": "two"} (tokens without '=' are skipped)."""
    return {key: value for key, sep, value in (token.partition("=") for token in line.split()) if sep}


def parse_slurmd_c(text: str) -> dict[str, str]:
    """The hardware line of ``slurmd -C`` (NodeName=... CPUs=... RealMemory=...)."""
    return next((parse_key_values(line) for line in text.splitlines() if line.startswith("NodeName=")), {})


# ---- a job's GRES in JSON -------------------------------------------------------------


def _json_number(value: object) -> int | None:
    """A JSON number as 22.05 writes it (``5``) or 25.11 does (``{"set": true, "number": 5}``)."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set", True) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _allocated_hosts(resources: dict) -> list[str]:
    """Node names in allocation order: 25.11 ``nodes.allocation[].name``, 22.05 ``allocated_nodes[].nodename``."""
    nodes = resources.get("nodes")
    if isinstance(nodes, dict):  # data_parser v0.0.4x (24.05+)
        return [str(entry.get("name")) for entry in nodes.get("allocation") or ()]
    return [str(entry.get("nodename")) for entry in resources.get("allocated_nodes") or ()]


def parse_squeue_job_json(text: str, job_id: int, node: str) -> list[GresAlloc] | None:
    """A job's GRES on ``node`` from ``squeue --json -j JOB`` (22.05 and 25.11 layouts).

    JSON, unlike ``scontrol show job -d`` text, cannot be forged by a job name holding a
    newline and a fake ``GRES=...(IDX:n)`` line. None when the job (array tasks and het
    components are entries of their own) or the node is not in the document; ValueError
    on a document of neither layout.
    """
    import json

    document = json.loads(text)
    if not isinstance(document, dict) or not isinstance(document.get("jobs"), list):
        raise ValueError("squeue --json output has no 'jobs' list")
    for job in document["jobs"]:
        if _json_number(job.get("job_id")) != job_id:
            continue
        hosts = _allocated_hosts(job.get("job_resources") or {})
        details = job.get("gres_detail") or []
        if node not in hosts:
            return None
        position = hosts.index(node)
        return parse_gres_detail(details[position]) if position < len(details) else []
    return None


# ---- nodes ------------------------------------------------------------------------

NodeState = Mapping[str, str]


def parse_node_state(text: str) -> NodeState:
    """State, Reason and Gres from ``scontrol show node NAME`` (multi-line or ``-o``).

    The reason runs to the end of its line (Slurm prints it last); its `` [user@time]`` is cut off.
    """
    state, reason, gres = "", "", ""
    for raw in text.splitlines():
        line = raw.strip()
        head, sep, tail = line.partition(" Reason=")
        if line.startswith("Reason="):
            head, tail, sep = "", line[len("Reason=") :], "Reason="
        if sep:
            reason = tail
            if reason.endswith("]") and " [" in reason:
                reason = reason[: reason.rindex(" [")]
        fields = parse_key_values(head)
        state, gres = fields.get("State", state), fields.get("Gres", gres)
    return {"state": state, "reason": reason, "gres": gres}


# ---- gres.conf and slurm.conf -----------------------------------------------------


@dataclass(frozen=True)
class GresConfRecord:
    """One gres.conf line for a node: ``Name=tpu Type=edgetpu_usb File=...``."""

    name: str
    type: str | None
    files: tuple[str, ...]
    count: int
    by_name_line: bool  # a line starting with Name= (slurmd lists these before NodeName= lines)
    line: int


def config_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of a Slurm config file's lines that say something (comments and blanks dropped)."""
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if line:
            yield number, line


def _keys(line: str) -> dict[str, str]:
    return {key.lower(): value for key, value in parse_key_values(line).items()}


def _matches_node(expression: str | None, node: str) -> bool:
    if expression is None:
        return True
    try:
        return node in expand_hostlist(expression)
    except ValueError:
        return False


def parse_gres_conf(text: str, node: str) -> list[GresConfRecord]:
    """The gres.conf records that apply to ``node``, in file order, ``File=`` ranges expanded
    (``Include`` is not followed: the caller reads included files if needed)."""
    records = []
    for number, line in config_lines(text):
        fields = _keys(line)
        if "name" not in fields or not _matches_node(fields.get("nodename"), node):
            continue
        files = tuple(expand_hostlist(fields["file"])) if "file" in fields else ()
        count = len(files) if files else int(fields.get("count", "1").rstrip("KMGkmg") or 1)
        if "count" in fields and files and fields["count"].isdigit():
            count = min(count, int(fields["count"]))
        by_name_line = not line.lower().startswith("nodename=")
        records.append(GresConfRecord(fields["name"], fields.get("type"), files, count, by_name_line, number))
    return records


def parse_node_gres(text: str, node: str) -> list[tuple[str, str | None, int]] | None:
    """(name, type, count) of ``node``'s slurm.conf ``Gres=`` (``NodeName=DEFAULT``'s applying), in
    written order; None when no NodeName line names the node (configless, an unread Include)."""
    fields = node_line_fields(text, node)
    if fields is None:
        return None
    return parse_gres_items(([value for key, value in fields.items() if key.lower() == "gres"] or [""])[-1])


def parse_gres_items(value: str) -> list[tuple[str, str | None, int]]:
    """(name, type, count) of each item of a ``Gres=`` value (``tpu:edgetpu_usb:2,gpu:1``; the count may
    carry a unit suffix, 4K), in written order; ``(null)`` is none."""
    result = []
    for item in value.split(","):
        if not item or item.lower() == "(null)":
            continue
        parts = item.split(":")
        count_text = parts[-1] if len(parts) > 1 and parts[-1][:1].isdigit() else "1"
        count = int(re.sub(r"[^0-9].*$", "", count_text) or 1)
        kind = parts[1] if len(parts) > 2 or (len(parts) == 2 and not parts[1][:1].isdigit()) else None
        result.append((parts[0], kind, count))
    return result


def include_paths(text: str, base_dir: str) -> list[str]:
    """Files named by ``Include``/``include`` lines (relative to ``base_dir``)."""
    paths = []
    for _, line in config_lines(text):
        keyword, _, rest = line.partition(" ")
        if keyword.lower() == "include" and rest.strip():
            path = rest.strip()
            paths.append(path if path.startswith("/") else f"{base_dir}/{path}")
    return paths


def parse_slurm_conf_options(text: str) -> dict[str, str]:
    """slurm.conf's options (``Prolog``, ``GresTypes``...) keyed in lower case, last one wins.

    NodeName, PartitionName, NodeSet, DownNodes and Include lines are skipped (pass the
    included files' text appended if they matter).
    """
    options: dict[str, str] = {}
    for _, line in config_lines(text):
        head = line.split("=", 1)[0].lower()
        if head in ("nodename", "partitionname", "nodeset", "downnodes") or line.lower().startswith("include "):
            continue
        options.update(_keys(line))
    return options


def node_line_fields(text: str, node: str) -> dict[str, str] | None:
    """The attributes of ``node``'s NodeName line (``NodeName=DEFAULT`` values under them), keys as
    written; None when no line names the node."""
    default: dict[str, str] = {}
    found: dict[str, str] | None = None
    for _, line in config_lines(text):
        if not line.lower().startswith("nodename="):
            continue
        fields = parse_key_values(line)
        name = next(value for key, value in fields.items() if key.lower() == "nodename")
        if name.upper() == "DEFAULT":
            default.update(fields)
        elif _matches_node(name, node):
            found = {**default, **fields}
    return found
