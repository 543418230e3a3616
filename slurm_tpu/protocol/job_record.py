"""A job's accelerator usage in Slurm's own job record: the spool entry and the ``AdminComment`` text.

The epilog (root) spools one file per job, ``<accounting_spool>/<job id>`` (config
``accounting_spool``, default ``/var/lib/slurm-tpu/accounting-spool``: persistent, so an entry
outlives a reboot; root's 0600 in a 0700 directory, written atomically; only where a collector
runs). The collector (``slurm-tpu accounting-collect``, root) sets the job's ``AdminComment``
with ``sacctmgr``, marks the entry ``written=`` with when it wrote, and removes it once a later
run, at least its window after that write, finds the node's item still there
(slurm_tpu/ops/accounting.py says why that is final). Why there (admin-only, works after the
job ended, no RPC on the epilog's path): docs/accounting.md.

The spool entry is ``key=value`` lines (no JSON: the epilog imports this module under the
hooks' import budget): ``version=1``, ``job``, ``node``, ``devices``, ``inferences``,
``inference_seconds``, ``energy_j`` (empty: no sensor) and, once the collector wrote the item,
``written`` (its opaque time mark). Each node a job ran on writes its own entry; the
``AdminComment`` holds one ``slurm-tpu/<node>:devices=1,inferences=12,...`` item per node,
separated by ``;``; other text there (an admin's note) is kept.
"""

from __future__ import annotations

from . import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

SPOOL_DIR = "accounting-spool"  # the name of the spool, and where older slurm-tpu kept it: <state_dir>/accounting-spool
FORMAT_VERSION = 1
PREFIX = "slurm-tpu/"  # of each of our items in an AdminComment
SEPARATOR = ";"
MAX_SPOOL_BYTES = 1024
FIGURES = ("devices", "inferences", "inference_seconds", "energy_j")


class SpoolEntry(Record):
    """One node's figures for one job."""

    __slots__ = ("job_id", "node", "devices", "inferences", "inference_seconds", "energy_j", "written")

    def __init__(
        self,
        job_id: int,
        node: str,
        devices: int,
        inferences: int,
        inference_seconds: float,
        energy_j: float | None = None,
        written: str = "",
    ):
        self.job_id, self.node, self.devices = job_id, node, devices
        self.inferences, self.inference_seconds, self.energy_j = inferences, inference_seconds, energy_j
        # When the collector wrote this item (its Clock's mark; '' while not written).
        self.written = written


def totals(job_id: int, node: str, devices: int, records: Iterable) -> SpoolEntry:
    """The node's entry for a job that leased ``devices`` here, from its usage records (:class:`~.usage.UsageRecord`;
    a device the job never used has none)."""
    inferences, seconds, energy = 0, 0.0, None
    for record in records:
        inferences += record.inferences
        seconds += record.seconds
        if record.energy_j is not None:
            energy = (energy or 0.0) + record.energy_j
    return SpoolEntry(job_id, node, devices, inferences, seconds, energy)


def _number(value: float) -> str:
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return text or "0"


def encode_spool(entry: SpoolEntry) -> bytes:
    """The spool file's bytes."""
    energy = "" if entry.energy_j is None else _number(entry.energy_j)
    if "\n" in entry.written:
        raise ValueError(f"a written mark holds a newline: {entry.written!r}")
    written = f"written={entry.written}\n" if entry.written else ""
    return (
        f"version={FORMAT_VERSION}\njob={entry.job_id}\nnode={entry.node}\ndevices={entry.devices}\n"
        f"inferences={entry.inferences}\ninference_seconds={_number(entry.inference_seconds)}\n"
        f"energy_j={energy}\n{written}"
    ).encode()


def decode_spool(raw: bytes, source: str) -> SpoolEntry:
    """A spool file's entry; ValueError naming ``source`` and what is wrong."""
    if len(raw) > MAX_SPOOL_BYTES:
        raise ValueError(f"{source} is over {MAX_SPOOL_BYTES} bytes")
    fields: dict[str, str] = {}
    for line in raw.decode("ascii", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key] = value
    try:
        if fields.get("version") != str(FORMAT_VERSION):
            raise ValueError(f"not format version {FORMAT_VERSION}")
        node = fields["node"]
        if not node or any(c in node for c in f"{SEPARATOR}:,= \n/"):
            raise ValueError(f"node name {node!r} cannot go into an AdminComment")
        energy = fields.get("energy_j", "")
        entry = SpoolEntry(
            int(fields["job"]),
            node,
            int(fields["devices"]),
            int(fields["inferences"]),
            float(fields["inference_seconds"]),
            float(energy) if energy else None,
            fields.get("written", ""),
        )
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{source} is not a slurm-tpu spool entry ({exc})") from None
    if entry.job_id <= 0:
        raise ValueError(f"{source} names job {entry.job_id}")
    return entry


def render_item(entry: SpoolEntry) -> str:
    """Our ``AdminComment`` item for one node: ``slurm-tpu/<node>:devices=..,inferences=..,...``."""
    figures = [
        f"devices={entry.devices}",
        f"inferences={entry.inferences}",
        f"inference_seconds={_number(entry.inference_seconds)}",
    ]
    if entry.energy_j is not None:
        figures.append(f"energy_j={_number(entry.energy_j)}")
    return f"{PREFIX}{entry.node}:{','.join(figures)}"


def merge(admin_comment: str, entry: SpoolEntry) -> str:
    """``admin_comment`` with the node's item replaced (or added); other nodes' items and other text kept."""
    mine = f"{PREFIX}{entry.node}:"
    items = [item for item in admin_comment.split(SEPARATOR) if item and not item.startswith(mine)]
    return SEPARATOR.join([*items, render_item(entry)])


def has_item(admin_comment: str, entry: SpoolEntry) -> bool:
    """Whether ``admin_comment`` holds the node's item exactly as :func:`render_item` writes it."""
    return render_item(entry) in admin_comment.split(SEPARATOR)


def parse_admin_comment(admin_comment: str) -> dict[str, dict[str, float]]:
    """Our items of an ``AdminComment``: node -> figures (devices, inferences, inference_seconds[, energy_j]);
    anything else (an admin's text, a malformed item) is skipped."""
    found: dict[str, dict[str, float]] = {}
    for item in admin_comment.split(SEPARATOR):
        if not item.startswith(PREFIX):
            continue
        node, sep, rest = item[len(PREFIX) :].partition(":")
        if not sep or not node:
            continue
        figures: dict[str, float] = {}
        try:
            for pair in rest.split(","):
                key, _, value = pair.partition("=")
                if key in FIGURES:
                    figures[key] = int(value) if key in ("devices", "inferences") else float(value)
        except ValueError:
            continue
        if "inferences" in figures and "inference_seconds" in figures:
            found[node] = figures
    return found
