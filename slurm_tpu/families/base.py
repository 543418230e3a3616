"""What an accelerator family is: everything the suite knows about one kind of device, in one
:class:`Family` subclass, so the rest of the suite never asks "is this a TPU?" (the hooks get
what they need precomputed, through their snapshot)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
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


@dataclass(frozen=True)
class FamilyDetails(Details):
    """Details whose ``detect --json`` object is their fields (a subclass may add keys to :meth:`to_json`)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Details:
        """The details :meth:`to_json` wrote: a missing key gives the field's default, a flag a bool."""
        return cls(
            **{
                f.name: bool(data.get(f.name)) if isinstance(f.default, bool) else data.get(f.name, f.default)
                for f in fields(cls)
            }
        )


@dataclass(frozen=True)
class FamilyConfig:
    """A family's site settings (``families.<kind>`` in the config, version 2): ``types`` maps what
    the family keys its GRES types by (Edge TPU: the bus; GPU: the model slug; Hailo: ``default``
    and PCI addresses) to a type name; ``lease``: whether its devices are leased to jobs."""

    gres_name: str
    types: Mapping[str, str] = field(default_factory=dict)
    features: tuple[str, ...] = ()
    lease: bool = True


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
        return {
            "gres_name": (str, f"GRES name for {self.title}s"),
            "features": (list, f"node features (Feature=) of a node with {self.title}s"),
        }

    def parse_config(self, section: Mapping[str, Any], where: str) -> FamilyConfig:
        """The family's settings from its flattened, type-checked section (``isolate``, which a family
        whose devices are not leased by default may declare, turns leasing on)."""
        prefix = f"families.{self.kind}."
        features = section.get("features", self.default_config.features)
        if not all(isinstance(item, str) and item for item in features):
            raise ConfigError(
                f"{where}: '{prefix}features' must be a list of non-empty strings", key=prefix + "features"
            )
        return FamilyConfig(
            gres_name=section.get("gres_name", self.default_config.gres_name),
            types=self.parse_types(section, where),
            features=tuple(features),
            lease=section.get("isolate", self.default_config.lease),
        )

    def parse_types(self, section: Mapping[str, Any], where: str) -> dict[str, str]:
        """The ``types`` table from the section (default: the family's defaults)."""
        return dict(self.default_config.types)

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

    # ---- hooks ----------------------------------------------------------------------
    def hook_policy(self, config: FamilyConfig) -> FamilyPolicy:
        """What the hooks need of the family under this config (precomputed into their snapshot)."""
        return FamilyPolicy(self.kind, config.gres_name, config.lease, self.slot, dict(self.revocation))
