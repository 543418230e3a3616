"""What an accelerator family is: everything the suite knows about one kind of device, in one
:class:`Family` subclass, so the rest of the suite never asks "is this a TPU?" (the hooks get
what they need precomputed, through their snapshot)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ConfigError
from ..hardware import Accelerator, Details

# How a device's open files are made useless at job end (slurm_tpu/access/revoke.py): USB_PORT
# power-cycles the hub port; GASKET_WRITERS is the holder scan plus the apex driver's count of
# writable files; SCAN the holder scan only.
from ..protocol.hooks_snapshot import GASKET_WRITERS, SCAN, USB_PORT, FamilyPolicy, UdevRule  # noqa: F401 - re-exported
from .sysfs import Snapshot


class Candidate:
    """The view of one udev device a family's :meth:`Family.wanted` gets (lazy attributes)."""

    subsystem: str
    devtype: str

    def attribute(self, name: str) -> str:
        """A sysfs attribute as stripped text ('' when absent)."""
        raise NotImplementedError

    def properties(self) -> Mapping[str, str]:
        """The udev properties."""
        raise NotImplementedError


SHARED_ALL = "all"  # families.<kind>.shared: every device of the family
DEFAULT_SHARES, MAX_SHARES = 4, 64  # families.<kind>.shares_per_device
# Slurm's own shared GRES names (gres_is_shared_name(): GPU-only, tied to gres/gpu by its code).
SLURM_SHARED_NAMES = ("shard", "mps")
MAX_MODEL_W = 1000.0  # families.<kind>.watts: no device a power model stands for draws more
_GRES_NAME_UNSAFE = frozenset(",:=/ \t()\"'")  # what slurm.conf Gres= and GresTypes split or quote on


@dataclass(frozen=True)
class FamilyConfig:
    """A family's site settings (``families.<kind>`` in the config, version 2): ``types`` maps what
    the family keys its GRES types by (Edge TPU: the bus; GPU: the model slug; Hailo: ``default``
    and PCI addresses) to a type name; ``lease``: whether its devices are leased to jobs."""

    gres_name: str
    types: Mapping[str, str] = field(default_factory=dict)
    features: tuple[str, ...] = ()
    lease: bool = True
    # Sharing (only a family with a ``Family.shard_gres``): which devices are shared (identities,
    # GRES type names, or ``all``), how many shares each offers, and the shard GRES's name ("": the
    # family's own, ``Family.shard_gres``).
    shared: tuple[str, ...] = ()
    shares_per_device: int = DEFAULT_SHARES
    shard_gres: str = ""
    # Energy (a family with ``Family.default_watts``): GRES type -> (idle W, active W), the site's
    # calibration (a USB meter reading) over the family's datasheet defaults.
    watts: Mapping[str, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class JobVariable:
    """One variable of the job environment a family exports (see protocol/jobenv.py); ``value`` gives
    a device's entry from its identity and primary device node.

    A job without such devices gets ``unset NAME`` with ``unset_when_empty``, else ``export NAME=``.
    ``never_unset``: a library's view of the devices (``EDGETPU_VISIBLE_DEVICES``), which reads
    unset as "every device": never ``unset``, even for a job with no device here.
    """

    name: str
    value: Callable[[str, str | None], str]
    unset_when_empty: bool = True
    never_unset: bool = False


class Family:
    """One accelerator family. Subclasses set the class attributes and implement detection."""

    kind: str = ""
    title: str = ""  # for messages: "Edge TPU", "GPU", "Hailo NPU"
    # udev subsystems detection enumerates for this family -> the sysfs attributes it copies (pci is shared).
    attributes: Mapping[str, tuple[str, ...]] = {}
    watched: tuple[str, ...] = ()  # udev subsystems whose events the watcher (slurm-tpu watch) listens to
    default_config: FamilyConfig = FamilyConfig("")
    # Whether gres.conf File= is the slot node (devices whose /dev node can change or
    # vanish, and every leased kind: the prolog maps File= back to an identity).
    slot: bool = True
    cores: bool = False  # gres.conf Cores= from the device's local CPUs
    revocation: Mapping[str, str] = {}  # bus -> USB_PORT, GASKET_WRITERS (SCAN when absent)
    udev_identities: tuple[UdevRule, ...] = ()  # how udev-event names the family's devices
    variables: tuple[JobVariable, ...] = ()
    # The runner backend for these devices ("edgetpu", "gpu"), or "" with ``runner_note`` saying what to use.
    runner: str = ""
    runner_note: str = ""
    # Config keys of the family's own beside gres_name and features (relative to ``families.<kind>.``).
    extra_config_keys: Mapping[str, tuple[type | tuple[type, ...], str]] = {}
    # Sharing: the GRES that counts the shares of the family's shared devices ("": its devices are
    # never shared, and it has no ``shared``/``shares_per_device`` keys), and how Slurm is told.
    # ``shard_per_file`` False: one count-only GRES line per node (no File=, untyped), and a shared
    # device is no longer a whole GRES (our ``tpu_shard``: nothing in Slurm ties it to a device).
    # True: Slurm's own gres/shard, one ``Count=<shares> File=<node>`` line per device beside the
    # device's whole GRES line (Slurm then never gives one device to whole and shard jobs at once).
    shard_gres: str = ""
    shard_per_file: bool = False
    # Energy: a family with no sensor the suite reads is modelled (protocol/energy.py ``estimated``):
    # its devices' (idle W, active W) by :meth:`watts_key`, datasheet figures, not measured here. Empty:
    # :meth:`energy_source` says where the figure comes from.
    default_watts: Mapping[str, tuple[float, float]] = {}

    # ---- detection ----------------------------------------------------------------
    def wanted(self, device: Candidate) -> bool:
        """Whether detection should record this udev device for the family."""
        raise NotImplementedError

    def event_relevant(self, subsystem: str, properties: Mapping[str, str]) -> bool:
        """Whether a udev event can change this family's devices (only its properties: a removed
        device's sysfs attributes are gone)."""
        return subsystem in self.watched

    def find(self, snapshot: Snapshot) -> list[Accelerator]:
        """The family's accelerators in a snapshot, in a deterministic order."""
        raise NotImplementedError

    def unannounced_nodes(self) -> set[str]:
        """The family's /dev nodes that no udev device announces (read when a snapshot is taken)."""
        return set()

    def driver_info(self) -> dict[str, dict[str, str]]:
        """Per-device facts a driver publishes outside sysfs, keyed by bus address (snapshot time)."""
        return {}

    def details_from_json(self, item: Mapping[str, Any]) -> Details:
        """The typed details of one ``detect --json`` item of this family."""
        return Details()

    def status_notes(self, config: FamilyConfig, accelerator: Accelerator) -> list[str]:
        """What ``detect``'s table says of a usable device under the site's config, beside its
        details' own notes (which know no config): e.g. a GRES type the hardware cannot tell."""
        return []

    # ---- runner -----------------------------------------------------------------------
    def runner_refusal(self, environ: Mapping[str, str]) -> str | None:
        """Why the TFLite runner cannot use this job's devices of a family without a runner backend,
        or None: ``runner_note`` with ``devices`` (the first variable's value) and ``variable`` (its name)."""
        if self.runner or not self.variables:
            return None
        first = self.variables[0].name
        devices = environ.get(first, "")
        return self.runner_note.format(devices=devices, variable=first) if devices else None

    # ---- config ---------------------------------------------------------------------
    def config_keys(self) -> dict[str, tuple[type | tuple[type, ...], str]]:
        """Keys of the family's config section (relative to ``families.<kind>.``)."""
        keys: dict[str, tuple[type | tuple[type, ...], str]] = {
            "gres_name": (str, f"GRES name for {self.title}s"),
            "features": (list, f"node features (Feature=) of a node with {self.title}s"),
        }
        if self.shard_gres:
            keys["shared"] = (
                list,
                f"{self.title}s many jobs share through the counted GRES {self.shard_gres}: device identities "
                f"(as `slurm-tpu detect` names them), GRES type names, or [{SHARED_ALL}]",
            )
            keys["shares_per_device"] = (
                int,
                f"{self.shard_gres} count of each shared {self.title} (1 to {MAX_SHARES})",
            )
        if self.default_watts:
            defaults = ", ".join(f"{key} {idle:g}/{active:g} W" for key, (idle, active) in self.default_watts.items())
            keys["watts"] = (
                dict,
                f"GRES type -> {{idle: W, active: W}} of one {self.title}, for its energy estimate "
                f"(calibrate with a meter; defaults are datasheet figures, not measured here: {defaults})",
            )
        return {**keys, **self.extra_config_keys}

    def parse_config(self, section: Mapping[str, Any], where: str) -> FamilyConfig:
        """The family's settings from its flattened, type-checked section (``isolate``, which a family
        whose devices are not leased by default may declare, turns leasing on)."""
        prefix = f"families.{self.kind}."
        features = section.get("features", self.default_config.features)
        if not all(isinstance(item, str) and item for item in features):
            raise ConfigError(
                f"{where}: '{prefix}features' must be a list of non-empty strings", key=prefix + "features"
            )
        gres_name = section.get("gres_name", self.default_config.gres_name)
        shared, shares, shard_gres = self.parse_sharing(section, where, gres_name)
        return FamilyConfig(
            gres_name=gres_name,
            types=self.parse_types(section, where),
            features=tuple(features),
            lease=section.get("isolate", self.default_config.lease),
            shared=shared,
            shares_per_device=shares,
            shard_gres=shard_gres,
            watts=self.parse_watts(section, where),
        )

    def parse_watts(self, section: Mapping[str, Any], where: str) -> dict[str, tuple[float, float]]:
        """``watts``: GRES type -> (idle, active) from ``{idle: W, active: W}``; ConfigError names the bad entry."""
        found: dict[str, tuple[float, float]] = {}
        for name, value in section.get("watts", {}).items():
            key = f"families.{self.kind}.watts.{name}"
            numbers = isinstance(value, Mapping) and set(value) == {"idle", "active"}
            numbers = numbers and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values())
            if not (
                isinstance(name, str) and name and numbers and 0 <= value["idle"] <= value["active"] <= MAX_MODEL_W
            ):
                raise ConfigError(
                    f"{where}: '{key}' must be {{idle: W, active: W}} with 0 <= idle <= active <= "
                    f"{MAX_MODEL_W:g}, not {value!r}",
                    key=key,
                )
            found[name] = (float(value["idle"]), float(value["active"]))
        return found

    def parse_sharing(self, section: Mapping[str, Any], where: str, gres_name: str) -> tuple[tuple[str, ...], int, str]:
        """(shared, shares_per_device, shard GRES name) from the section; ConfigError names the bad key."""
        prefix = f"families.{self.kind}."
        shared = section.get("shared", ())
        if not all(isinstance(item, str) and item and "," not in item for item in shared):
            raise ConfigError(
                f"{where}: '{prefix}shared' must be a list of device identities or GRES type names "
                f"(or [{SHARED_ALL}]), not {list(shared)!r}",
                key=prefix + "shared",
            )
        if SHARED_ALL in shared and len(shared) > 1:
            raise ConfigError(
                f"{where}: '{prefix}shared' is either [{SHARED_ALL}] or a list of devices and types, not both",
                key=prefix + "shared",
            )
        shares = section.get("shares_per_device", DEFAULT_SHARES)
        if not 1 <= shares <= MAX_SHARES:
            raise ConfigError(
                f"{where}: '{prefix}shares_per_device' must be 1 to {MAX_SHARES}, not {shares!r}",
                key=prefix + "shares_per_device",
            )
        name = section.get("shard_gres_name", "")
        if name:
            why = ""
            if set(name) & _GRES_NAME_UNSAFE:
                why = "holds a character slurm.conf splits on"
            elif name.lower() in SLURM_SHARED_NAMES:
                why = "is Slurm's own GPU-only shared GRES"
            elif name.lower() == gres_name.lower():
                why = f"is the whole devices' GRES name ('{prefix}gres_name')"
            if why:
                raise ConfigError(f"{where}: '{prefix}shard_gres_name' {name!r} {why}", key=prefix + "shard_gres_name")
        return tuple(dict.fromkeys(shared)), shares, "" if name == self.shard_gres else name  # "": the family's

    def parse_types(self, section: Mapping[str, Any], where: str) -> dict[str, str]:
        """The ``types`` table from the section (default: the family's defaults)."""
        return dict(self.default_config.types)

    # ---- sharing --------------------------------------------------------------------
    def shard_name(self, config: FamilyConfig) -> str:
        """The GRES that counts this family's shares under ``config`` ("": the family never shares)."""
        return (config.shard_gres or self.shard_gres) if self.shard_gres else ""

    def shares(self, config: FamilyConfig, identity: str, gres_type: str) -> int:
        """The shares a usable device (its identity and GRES type) offers under ``config``; 0: a whole device."""
        if not self.shard_gres or not config.shared:
            return 0
        chosen = SHARED_ALL in config.shared or identity in config.shared or gres_type in config.shared
        return config.shares_per_device if chosen else 0

    def device_shares(self, config: FamilyConfig, accelerator: Accelerator) -> int:
        """:meth:`shares` of one accelerator."""
        if not self.shard_gres or not config.shared:
            return 0
        return self.shares(config, accelerator.identity, self.gres_type(config, accelerator))

    # ---- rendering ------------------------------------------------------------------
    def gres_type(self, config: FamilyConfig, accelerator: Accelerator) -> str:
        """The GRES type of one device."""
        raise NotImplementedError

    def features(self, config: FamilyConfig, accelerators: list[Accelerator]) -> list[str]:
        """Node features for a node with these usable devices of the family (not empty)."""
        return [*config.features, *(self.gres_type(config, a) for a in accelerators)]

    def udev_rules(self, config: FamilyConfig, own: str, run: str) -> list[str]:
        """Rule lines (comments included) giving idle ownership and running the udev hook."""
        return []

    # ---- energy ---------------------------------------------------------------------
    def watts_key(self, config: FamilyConfig, accelerator: Accelerator) -> str:
        """Which of :attr:`default_watts` a device is (default: its GRES type)."""
        return self.gres_type(config, accelerator)

    def energy_source(self, config: FamilyConfig, accelerator: Accelerator, sysfs_root: str) -> str:
        """Where a device's energy figure comes from (protocol/energy.py SOURCES, with its argument):
        here the power model, the site's watts for the device's GRES type over the family's defaults."""
        from ..protocol.energy import MODEL, NO_SOURCE

        watts = config.watts.get(self.gres_type(config, accelerator)) or self.default_watts.get(
            self.watts_key(config, accelerator)
        )
        if watts is None:
            return f"{NO_SOURCE}:no power reading or power model for {self.title}s"
        return f"{MODEL}:{watts[0]:g}:{watts[1]:g}"

    # ---- hooks ----------------------------------------------------------------------
    def hook_policy(self, config: FamilyConfig) -> FamilyPolicy:
        """What the hooks need of the family under this config (precomputed into their snapshot)."""
        return FamilyPolicy(self.kind, config.gres_name, config.lease, self.slot, dict(self.revocation))
