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
``written`` (its opaque time mark). A job that held TPU shares on the node (the broker's
figures, protocol/broker_wire.py FIGURES) writes ``version=2`` with :data:`SHARD_KEYS` too:
``shards`` (its share count) and ``shard_busy_ms``, ``shard_inferences``, ``shard_model_swaps``,
``shard_queue_wait_ms``, ``shard_model_loads``; an entry without them is still written as version 1,
and both versions are read. A job whose devices here have energy figures (the Epilog's, root's:
protocol/energy.py) writes ``version=3``: ``energy_j`` is then the sum of those figures (empty when
none has joules) and ``energy_method`` how they were obtained (``measured+estimated``: protocol/energy.py
node_method), with or without the shard keys. Versions 1 and 2 carried the job's own ``energy_j`` (always
empty: nothing filled it); they are still read. Each node a job ran on writes its own entry; the
``AdminComment`` holds one ``slurm-tpu/<node>:devices=1,inferences=12,...`` item per node
(with the ``shards`` and ``shard_*`` figures where the job held shares there, ``energy_j`` and
``energy_method`` where its devices there have energy figures), separated by ``;``;
other text there (an admin's note) is kept; items without the shard figures are read as before.
"""

from __future__ import annotations

from . import Record, decimal_text as _number
from .broker_wire import FIGURES as BROKER_FIGURES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

SPOOL_DIR = "accounting-spool"  # the name of the spool, and where older slurm-tpu kept it: <state_dir>/accounting-spool
FORMAT_VERSION = 3  # written with energy figures; else 2 with shard figures, else 1
SHARDS_VERSION = 2
READ_VERSIONS = ("1", "2", "3")
PREFIX = "slurm-tpu/"  # of each of our items in an AdminComment
SEPARATOR = ";"
MAX_SPOOL_BYTES = 1024
SHARES = "shards"
ENERGY_METHOD = "energy_method"  # how the node's energy figures were obtained (protocol/energy.py node_method)
# The broker's figures of a job, as keys of the spool entry and the AdminComment item.
SHARD_KEYS = tuple(f"shard_{name}" for name in BROKER_FIGURES)
# The usage figures of an item (the energy, a figure with its method, is :func:`admin_energy`'s).
FIGURES = ("devices", "inferences", "inference_seconds", SHARES, *SHARD_KEYS)
_MILLISECONDS = ("shard_busy_ms", "shard_queue_wait_ms")  # fractional; the other shard figures are counts


class SpoolEntry(Record):
    """One node's figures for one job."""

    __slots__ = (
        "job_id",
        "node",
        "devices",
        "inferences",
        "inference_seconds",
        "energy_j",
        "written",
        "shards",
        "energy_method",
    )

    def __init__(
        self,
        job_id: int,
        node: str,
        devices: int,
        inferences: int,
        inference_seconds: float,
        energy_j: float | None = None,
        written: str = "",
        shards: dict[str, float] | None = None,
        energy_method: str = "",
    ):
        self.job_id, self.node, self.devices = job_id, node, devices
        self.inferences, self.inference_seconds, self.energy_j = inferences, inference_seconds, energy_j
        # When the collector wrote this item (its Clock's mark; '' while not written).
        self.written = written
        # A job holding TPU shares here: {SHARES: n, "shard_busy_ms": ..., ...} (every SHARD_KEYS), else None.
        self.shards = shards
        # How ``energy_j`` was obtained ('' : no energy figure: ``energy_j`` is then None).
        self.energy_method = energy_method


def shard_figures(shares: int, figures: dict | None) -> dict[str, float]:
    """The entry's ``shards`` value from the job's share count and the broker's figures (None: the broker
    gave none, they count 0)."""
    found: dict[str, float] = {SHARES: shares}
    for name, key in zip(BROKER_FIGURES, SHARD_KEYS):
        value = (figures or {}).get(name, 0)
        found[key] = float(value) if key in _MILLISECONDS else int(value)
    return found


def totals(job_id: int, node: str, devices: int, records: Iterable, energy: list | None = None) -> SpoolEntry:
    """The node's entry for a job that leased ``devices`` here, from its usage records (:class:`~.usage.UsageRecord`;
    a device the job never used has none) and its devices' energy figures (:class:`~.energy.DeviceEnergy`,
    root's; None or empty: none)."""
    from .energy import node_method  # only for a job with energy figures here

    inferences, seconds = 0, 0.0
    for record in records:
        inferences += record.inferences
        seconds += record.seconds
    joules = [figure.joules for figure in energy or () if figure.joules is not None]
    entry = SpoolEntry(job_id, node, devices, inferences, seconds, sum(joules) if joules else None)
    entry.energy_method = node_method(energy) if energy else ""
    return entry


def encode_spool(entry: SpoolEntry) -> bytes:
    """The spool file's bytes."""
    energy = "" if entry.energy_j is None else _number(entry.energy_j)
    if "\n" in entry.written:
        raise ValueError(f"a written mark holds a newline: {entry.written!r}")
    written = f"written={entry.written}\n" if entry.written else ""
    version, shards, method = 1, "", ""
    if entry.shards is not None:
        version = SHARDS_VERSION
        shards = "".join(f"{key}={_number(entry.shards.get(key, 0))}\n" for key in (SHARES, *SHARD_KEYS))
    if entry.energy_method:
        version, method = FORMAT_VERSION, f"{ENERGY_METHOD}={_method(entry.energy_method)}\n"
    return (
        f"version={version}\njob={entry.job_id}\nnode={entry.node}\ndevices={entry.devices}\n"
        f"inferences={entry.inferences}\ninference_seconds={_number(entry.inference_seconds)}\n"
        f"energy_j={energy}\n{method}{shards}{written}"
    ).encode()


def _method(text: str) -> str:
    """An energy method list (``measured+estimated``), checked: it goes into an AdminComment item."""
    from .energy import METHODS

    if not text or any(part not in METHODS for part in text.split("+")):
        raise ValueError(f"not an energy method list: {text[:60]!r}")
    return text


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
        if fields.get("version") not in READ_VERSIONS:
            raise ValueError(f"not format version {' or '.join(READ_VERSIONS)}")
        version = fields["version"]
        if version != "3" and (version == "2") != (SHARES in fields):  # version 2 is an entry with shard figures
            raise ValueError(f"format version {version} {'without' if SHARES not in fields else 'with'} shards")
        if (version == "3") != (ENERGY_METHOD in fields):  # version 3 is an entry with energy figures
            raise ValueError(f"format version {version} {'without' if version == '3' else 'with'} {ENERGY_METHOD}")
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
            _shards(fields) if SHARES in fields else None,
            _method(fields[ENERGY_METHOD]) if version == "3" else "",
        )
        if entry.energy_j is not None:
            from .energy import MAX_JOULES

            if not 0 <= entry.energy_j <= MAX_JOULES:  # NaN fails too
                raise ValueError(f"energy_j {energy!r} out of range")
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{source} is not a slurm-tpu spool entry ({exc})") from None
    if entry.job_id <= 0:
        raise ValueError(f"{source} names job {entry.job_id}")
    return entry


def _shards(fields: dict[str, str]) -> dict[str, float]:
    """An entry's shard figures (ValueError for one that is not a non-negative number)."""
    found: dict[str, float] = {SHARES: int(fields[SHARES])}
    for key in SHARD_KEYS:
        found[key] = float(fields[key]) if key in _MILLISECONDS else int(fields[key])
    if any(not 0 <= value < float("inf") for value in found.values()):  # NaN fails too
        raise ValueError("a negative shard figure")
    return found


def render_item(entry: SpoolEntry) -> str:
    """Our ``AdminComment`` item for one node: ``slurm-tpu/<node>:devices=..,inferences=..,...``."""
    figures = [
        f"devices={entry.devices}",
        f"inferences={entry.inferences}",
        f"inference_seconds={_number(entry.inference_seconds)}",
    ]
    if entry.energy_j is not None:
        figures.append(f"energy_j={_number(entry.energy_j)}")
    if entry.energy_method:
        figures.append(f"{ENERGY_METHOD}={entry.energy_method}")
    if entry.shards is not None:
        figures += [f"{key}={_number(entry.shards.get(key, 0))}" for key in (SHARES, *SHARD_KEYS)]
    return f"{PREFIX}{entry.node}:{','.join(figures)}"


def merge(admin_comment: str, entry: SpoolEntry) -> str:
    """``admin_comment`` with the node's item replaced (or added); other nodes' items and other text kept."""
    mine = f"{PREFIX}{entry.node}:"
    items = [item for item in admin_comment.split(SEPARATOR) if item and not item.startswith(mine)]
    return SEPARATOR.join([*items, render_item(entry)])


def has_item(admin_comment: str, entry: SpoolEntry) -> bool:
    """Whether ``admin_comment`` holds the node's item exactly as :func:`render_item` writes it."""
    return render_item(entry) in admin_comment.split(SEPARATOR)


def _items(admin_comment: str) -> Iterable[tuple[str, str]]:
    """(node, its figures' text) of each of our items in an ``AdminComment``."""
    for item in admin_comment.split(SEPARATOR):
        if item.startswith(PREFIX):
            node, sep, rest = item[len(PREFIX) :].partition(":")
            if sep and node:
                yield node, rest


def admin_energy(admin_comment: str) -> dict[str, tuple[float | None, str]]:
    """node -> (joules or None, methods) of each of our items that says how its energy was obtained
    (``energy_j=..,energy_method=..``: root's figures, protocol/energy.py node_method). An item without a
    known method (before per-device energy, ``energy_j`` was the job's own claim), with joules beside
    ``unavailable`` alone, or with joules no device could give (protocol/energy.py MAX_JOULES) shows none."""
    from .energy import MAX_JOULES, UNAVAILABLE

    found: dict[str, tuple[float | None, str]] = {}
    for node, rest in _items(admin_comment):
        pairs = dict(pair.partition("=")[::2] for pair in rest.split(","))
        try:
            method = _method(pairs.get(ENERGY_METHOD, ""))
            joules = float(pairs["energy_j"]) if pairs.get("energy_j") else None
        except ValueError:
            continue
        if joules is not None and (method == UNAVAILABLE or not 0 <= joules <= MAX_JOULES):  # NaN fails too
            continue
        found[node] = (joules, method)
    return found


def parse_admin_comment(admin_comment: str) -> dict[str, dict[str, float]]:
    """Our items of an ``AdminComment``: node -> figures (devices, inferences, inference_seconds[, shards
    and the shard_* figures]); anything else (an admin's text, a malformed item) is skipped. The node's
    energy, a figure only with its method: :func:`admin_energy`."""
    found: dict[str, dict[str, float]] = {}
    for node, rest in _items(admin_comment):
        figures: dict[str, float] = {}
        try:
            for pair in rest.split(","):
                key, _, value = pair.partition("=")
                if key in FIGURES:
                    counted = key not in ("inference_seconds", *_MILLISECONDS)
                    figures[key] = int(value) if counted else float(value)
        except ValueError:
            continue
        if "inferences" in figures and "inference_seconds" in figures:
            found[node] = figures
    return found
