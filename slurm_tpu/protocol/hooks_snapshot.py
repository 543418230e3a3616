"""The root hooks' snapshot file ``<state_dir>/hooks.snapshot``.

The slow path (slurm_tpu/hooks/settings.py ``rebuild``: YAML config, inventory,
slurm.conf, gres.conf, the families) writes what every later hook needs, the
family-specific parts precomputed; the fast path reads it without importing json, re,
typing, dataclasses or the families package.

Format (the first line is :data:`FORMAT`, which names its version; a reader meets any
other first line, unknown tag or missing key with None, and the hook takes the slow path):

    slurm-tpu hooks snapshot <version>
    <tag>\t<key>=<value>\t<key>=<value>...

one record per line, keyed fields (a value runs to the next tab; it never holds a
tab or newline, and lists are comma-joined, so they never hold commas):

``src``     path, key: a source file and its version (device:inode:size:mtime_ns)
``set``     the scalar settings (:data:`SETTINGS`)
``family``, ``udev``, ``var``, ``dev``: a family's policy, how udev-event names a device, a job
            variable (in export order), a configured device; keys and types in :data:`OBJECTS`
``val``     identity, name, value: a device's entry in a job variable
``idx``     name, type, file: slurmd's IDX order of a GRES name on this node
``shard``   gres, identity, shares: one shared Edge TPU of the node (:class:`ShardPolicy`), never leased
``energy``  identity, source: where a device's energy figure comes from (protocol/energy.py SOURCES and
            its argument; the family's declaration), only while ``energy_enabled``
"""

from __future__ import annotations

from ..defaults import ACCOUNTING_SPOOL, ENERGY_POLL_S, HOLDER_SCAN_S, NODE_MODE, NVML_LIBRARY, SLOT_DIR, SYSFS_ROOT
from . import Record
from .inventory import KnownDevice

TYPE_CHECKING = False  # annotations only: importing typing costs the hooks milliseconds per job
if TYPE_CHECKING:
    from typing import Any

FILE = "hooks.snapshot"  # under the state directory
FORMAT = "slurm-tpu hooks snapshot 10"
USB_PORT, GASKET_WRITERS, SCAN = "usb-port", "gasket-writers", "scan"  # revocation methods (families/base.py)
# The ``set`` record's keys and their types.
SETTINGS = (
    ("state_dir", str),
    ("slot_dir", str),
    ("lease_mode", int),
    ("idle_uid", int),
    ("idle_gid", int),
    ("idle_mode", int),
    ("node", str),
    ("slurm_bin_dir", str),
    ("slurm_sbin_dir", str),
    ("revoke", bool),
    ("holder_scan_s", float),
    ("sysfs_root", str),
    ("accounting_spool", str),
    ("energy_enabled", bool),
    ("nvml_library", str),
    ("energy_poll_s", float),
)


class FamilyPolicy(Record):
    """What the hooks do with one family's devices. ``shared``: the identities of its devices on this
    node that the site shares (``families.<kind>.shared``): never leased, whatever GRES a job got
    them by (a shared GPU stays a ``gpu`` device in gres.conf beside its ``shard`` lines)."""

    __slots__ = ("kind", "gres_name", "leased", "slot", "revocation", "shared")

    def __init__(
        self,
        kind: str,
        gres_name: str,
        leased: bool,
        slot: bool,
        revocation: dict[str, str],
        shared: tuple[str, ...] = (),
    ):
        self.kind, self.gres_name, self.leased, self.slot = kind, gres_name, leased, slot
        self.revocation = revocation  # bus -> USB_PORT / GASKET_WRITERS (SCAN when absent)
        self.shared = tuple(shared)


class ShardPolicy(Record):
    """The node's shared Edge TPUs: the GRES that counts their shares (``tpu_shard``) and identity ->
    shares of each usable one. Their nodes keep idle ownership; the node's broker opens them."""

    __slots__ = ("gres_name", "devices")

    def __init__(self, gres_name: str, devices: dict[str, int]):
        self.gres_name, self.devices = gres_name, devices

    @property
    def total(self) -> int:
        """The node's count of the shard GRES."""
        return sum(self.devices.values())


class UdevRule(Record):
    """How ``slurm-tpu udev-event`` names the device of an event of ``subsystem`` (and ``devtype``
    when not ''), as a family declares it (``Family.udev_identities``).

    The identity is ``<bus>-`` and the sysfs ``attribute`` of the event's device when one is
    named (Hailo's class device is no child of its PCI device), else the DEVPATH component
    ``depth`` levels up (1: the last). A remove event is matched by its device node.
    """

    __slots__ = ("subsystem", "devtype", "bus", "depth", "attribute")

    def __init__(self, subsystem: str, devtype: str, bus: str, depth: int, attribute: str = ""):
        self.subsystem, self.devtype, self.bus, self.depth, self.attribute = subsystem, devtype, bus, depth, attribute


class EnvVariable(Record):
    """A job variable of one family (see slurm_tpu/protocol/jobenv.py)."""

    __slots__ = ("name", "kind", "unset_when_empty", "never_unset")

    def __init__(self, name: str, kind: str, unset_when_empty: bool, never_unset: bool = False):
        self.name, self.kind, self.unset_when_empty, self.never_unset = name, kind, unset_when_empty, never_unset


# The records of one object each, in written order: tag, class, the snapshot's collection
# (a dict is keyed by the first field), and the record's keys and types for the class's __slots__.
OBJECTS: tuple[tuple[str, Any, str, tuple[str, ...], tuple[type, ...]], ...] = (
    (
        "family",
        FamilyPolicy,
        "families",
        ("kind", "gres", "leased", "slot", "revoke", "shared"),
        (str, str, bool, bool, dict, tuple),
    ),
    ("udev", UdevRule, "udev", ("subsystem", "devtype", "bus", "depth", "attribute"), (str, str, str, int, str)),
    ("var", EnvVariable, "variables", ("name", "kind", "unset", "keep"), (str, str, bool, bool)),
    ("dev", KnownDevice, "devices", ("identity", "kind", "bus", "nodes"), (str, str, str, tuple)),
)


class HookSnapshot:
    """The snapshot's content (hooks/settings.py's HookSettings extends it with behaviour)."""

    def __init__(
        self,
        state_dir: str,
        slot_dir: str = SLOT_DIR,
        lease_mode: int = NODE_MODE,
        idle_uid: int = 0,
        idle_gid: int = 0,
        idle_mode: int = NODE_MODE,
        node: str = "",
        devices: dict[str, KnownDevice] | None = None,
        index: dict[str, list[tuple[str | None, str | None]]] | None = None,
        sources: dict[str, str] | None = None,
        families: dict[str, FamilyPolicy] | None = None,
    ):
        self.state_dir, self.slot_dir, self.lease_mode = state_dir, slot_dir, lease_mode
        self.idle_uid, self.idle_gid, self.idle_mode, self.node = idle_uid, idle_gid, idle_mode, node
        self.devices = devices or {}
        self.index = index or {}
        self.sources = sources or {}
        self.families = families or {}  # kind -> policy
        self.shards: ShardPolicy | None = None  # the node's shared Edge TPUs (None: it shares none)
        self.udev: list[UdevRule] = []
        self.variables: list[EnvVariable] = []
        self.values: dict[str, dict[str, str]] = {}  # identity -> variable name -> entry
        # The config's slurm.bin_dir/sbin_dir ("" when unset: slurm/installation.py decides).
        self.slurm_bin_dir, self.slurm_sbin_dir = "", ""
        # Revocation at job end (slurm_tpu/access/revoke.py) and the holder scan's time box.
        self.revoke, self.holder_scan_s, self.sysfs_root = True, HOLDER_SCAN_S, SYSFS_ROOT
        # Where the epilog spools the job's figures for the accounting collector (hooks/jobusage.py).
        self.accounting_spool = ACCOUNTING_SPOOL
        # Per-job energy (config ``energy.*``): identity -> source of each device here (empty when
        # disabled: the hooks then read nothing), the NVML library, the agent sampler's period.
        self.energy_enabled, self.nvml_library, self.energy_poll_s = True, NVML_LIBRARY, ENERGY_POLL_S
        self.energy_sources: dict[str, str] = {}

    def revocation(self, kind: str, bus: str) -> str:
        """How a device of this kind and bus is revoked at job end (SCAN: holder scan only)."""
        return self.families[kind].revocation.get(bus, SCAN) if kind in self.families else SCAN


def _field(key: str, value: object) -> str:
    if isinstance(value, dict):  # bus:how,...
        value = tuple(f"{k}:{v}" for k, v in value.items())
    if isinstance(value, tuple):
        if any("," in item for item in value):
            raise ValueError(f"hooks snapshot: {key} {value!r} holds a comma")
        value = ",".join(value)
    text = ("1" if value else "0") if isinstance(value, bool) else str(value)  # str(float) is its repr
    if "\t" in text or "\n" in text:
        raise ValueError(f"hooks snapshot: {key} {text!r} holds a tab or newline")
    return f"{key}={text}"


def _record(tag: str, *pairs: tuple[str, object]) -> str:
    return "\t".join([tag, *(_field(key, value) for key, value in pairs)])


def format_snapshot(snapshot: HookSnapshot) -> str:
    """The file's text (raises ValueError when a value cannot be written: then write none)."""
    lines = [FORMAT]
    lines += [_record("src", ("path", path), ("key", key)) for path, key in sorted(snapshot.sources.items())]
    lines.append(_record("set", *((name, getattr(snapshot, name)) for name, _ in SETTINGS)))
    for tag, _, collection, keys, _ in OBJECTS:
        items = getattr(snapshot, collection)
        for item in items.values() if isinstance(items, dict) else items:
            lines.append(_record(tag, *zip(keys, item._values())))
    for identity, entries in snapshot.values.items():
        for name, value in entries.items():
            lines.append(_record("val", ("identity", identity), ("name", name), ("value", value)))
    for name, order in snapshot.index.items():
        for kind, index_file in order:
            lines.append(_record("idx", ("name", name), ("type", kind or ""), ("file", index_file or "")))
    if snapshot.shards is not None:
        gres = snapshot.shards.gres_name
        for identity, shares in snapshot.shards.devices.items():
            lines.append(_record("shard", ("gres", gres), ("identity", identity), ("shares", shares)))
    for identity, source in snapshot.energy_sources.items():
        lines.append(_record("energy", ("identity", identity), ("source", source)))
    return "\n".join(lines) + "\n"


def _value(kind: type, text: str) -> object:
    """A field's value of type ``kind`` (ValueError when it is not one)."""
    if kind is bool:
        if text not in ("0", "1"):
            raise ValueError(text)
        return text == "1"
    if kind is tuple:
        return tuple(filter(None, text.split(",")))
    if kind is dict:
        return dict(entry.split(":", 1) for entry in filter(None, text.split(",")))  # ValueError: no ':'
    return kind(text)


def parse_snapshot(text: str, cls=HookSnapshot):
    """The snapshot in ``text`` as a ``cls`` (a HookSnapshot), or None if it is not one this version wrote."""
    lines = text.split("\n")
    if not lines or lines[0] != FORMAT:
        return None
    result = cls("")
    objects = {tag: rest for tag, *rest in OBJECTS}
    seen_settings = False
    try:
        for line in lines[1:]:
            if not line:
                continue
            tag, *fields = line.split("\t")
            record = dict(item.split("=", 1) for item in fields)  # ValueError: an item without '='
            if len(record) != len(fields):  # a key given twice
                return None
            if tag == "src":
                result.sources[record["path"]] = record["key"]
            elif tag == "set":
                for name, kind in SETTINGS:
                    setattr(result, name, _value(kind, record[name]))
                seen_settings = True
            elif tag in objects:
                make, collection, keys, kinds = objects[tag]
                item = make(*(_value(kind, record[key]) for key, kind in zip(keys, kinds)))
                items = getattr(result, collection)
                if isinstance(items, dict):
                    items[record[keys[0]]] = item
                else:
                    items.append(item)
            elif tag == "val":
                result.values.setdefault(record["identity"], {})[record["name"]] = record["value"]
            elif tag == "idx":
                result.index.setdefault(record["name"], []).append((record["type"] or None, record["file"] or None))
            elif tag == "shard":
                shares, policy = int(record["shares"]), result.shards
                if policy is None:
                    policy = result.shards = ShardPolicy(record["gres"], {})
                if shares < 1 or record["gres"] != policy.gres_name:
                    return None
                policy.devices[record["identity"]] = shares
            elif tag == "energy":
                result.energy_sources[record["identity"]] = record["source"]
            else:
                return None
    except (KeyError, ValueError):
        return None
    return result if seen_settings else None
