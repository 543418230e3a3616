"""The site's versioned YAML config (``/etc/slurm-tpu/config.yaml``).

The file is optional: without it every default below applies. When present it must
say its version; any key that version does not know is rejected with its dotted
name, so a typo never silently falls back to a default.

Version 2 nests the accelerator settings by family (``families.<kind>.*``, the keys
each family declares in slurm_tpu/families/). Version 1 files keep loading with the
same meaning: their ``gres.*``, ``features.*`` and ``devices.isolate_gpus`` keys are
read as the version 2 keys :data:`VERSION_1_KEYS` names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import ConfigError
from .families import FAMILIES, FamilyConfig

DEFAULT_PATH = "/etc/slurm-tpu/config.yaml"
ENV_VAR = "SLURM_TPU_CONFIG"
SUPPORTED_VERSIONS = (1, 2)
CURRENT_VERSION = 2


@dataclass(frozen=True)
class Ownership:
    """Who owns a device node, and its permission bits."""

    owner: str = "root"
    group: str = "root"
    mode: int = 0o600


@dataclass(frozen=True)
class Config:
    """Site choices. Field names mirror the YAML keys."""

    node_name: str | None = None
    # kind -> the family's settings (GRES name, types, features, leased or not).
    families: Mapping[str, FamilyConfig] = field(
        default_factory=lambda: {f.kind: f.default_config for f in FAMILIES})
    slot_dir: str = "/dev/slurm-tpu"
    state_dir: str = "/run/slurm-tpu"
    # The configured inventory, kept across reboots (/run and /dev are tmpfs).
    inventory_file: str = "/var/lib/slurm-tpu/inventory.json"
    idle: Ownership = Ownership()
    lease_mode: int = 0o600
    # At job end, make every fd of the job's devices useless (USB: the hub port is
    # power-cycled, see slurm_tpu/access/revoke.py); false keeps ownership-only isolation.
    revoke: bool = True
    # Wall-clock budget of one holder scan (every process's fds and mappings); a scan
    # that cannot finish in it drains the node instead of stretching the epilog.
    holder_scan_seconds: float = 10.0
    # Where sysfs is mounted (tests point it at a materialized testbed).
    sysfs_root: str = "/sys"
    udev_run_program: str | None = None
    # Where Slurm's programs are (None: found as slurm/installation.py says).
    slurm_bin_dir: str | None = None
    slurm_sbin_dir: str | None = None
    # How ops commands talk to Slurm: "auto" (pyslurm where it pays and matches), "scontrol", "pyslurm".
    slurm_backend: str = "auto"
    path: str | None = None  # where it was loaded from, for messages

    def family(self, kind: str) -> FamilyConfig:
        """The settings of one family (its defaults if the registry gained it after this config)."""
        found = self.families.get(kind)
        if found is None:
            from .families import family

            return family(kind).default_config
        return found


# The schema: dotted key -> (expected python type(s), description). Nested
# mappings are listed by their leaves; a mapping value listed as ``dict`` is a
# free-form name->name table.
_COMMON: dict[str, tuple[type | tuple[type, ...], str]] = {
    "version": (int, "config format version (2; 1 is still read)"),
    "node_name": (str, "Slurm NodeName of this node (default: short hostname)"),
    "devices.slot_dir": (str, "directory of stable device slot nodes"),
    "devices.idle.owner": (str, "owner of idle accelerator nodes"),
    "devices.idle.group": (str, "group of idle accelerator nodes"),
    "devices.idle.mode": ((str, int), "mode of idle accelerator nodes, e.g. '0600'"),
    "devices.lease.mode": ((str, int), "mode of a leased node, owned by the job's user"),
    "devices.revoke": (bool, "at job end make every open fd of a USB Edge TPU useless (port power-cycle)"),
    "devices.holder_scan_seconds": ((int, float), "time box of the epilog's scan for processes holding a device"),
    "sysfs_root": (str, "where sysfs is mounted (default /sys)"),
    "state_dir": (str, "lease ledger directory"),
    "inventory_file": (str, "persistent copy of the configured inventory (restored at boot)"),
    "udev.run_program": (str, "absolute path udev RUN+= runs on device events (default: the installed "
                              "slurm-tpu-udev-event; a program named slurm-tpu gets 'udev-event')"),
    "slurm.bin_dir": (str, "Slurm's client programs (scontrol, squeue); default: beside the running slurmd"),
    "slurm.sbin_dir": (str, "Slurm's daemons (slurmd, slurmstepd); default: the running slurmd's directory"),
    "slurm.backend": (str, "auto, scontrol or pyslurm: how health and the watcher talk to Slurm"),
}
SLURM_BACKENDS = ("auto", "scontrol", "pyslurm")
# Version 1 spelled the Edge TPU and GPU settings flat; each means this version 2 key.
VERSION_1_KEYS = {
    "gres.tpu_name": "families.edgetpu.gres_name",
    "gres.gpu_name": "families.gpu.gres_name",
    "gres.tpu_types.usb": "families.edgetpu.types.usb",
    "gres.tpu_types.pci": "families.edgetpu.types.pci",
    "gres.gpu_types": "families.gpu.types",
    "features.tpu": "families.edgetpu.features",
    "features.gpu": "families.gpu.features",
    "devices.isolate_gpus": "families.gpu.isolate",
}


def _family_schema() -> dict[str, tuple[type | tuple[type, ...], str]]:
    return {f"families.{f.kind}.{key}": spec for f in FAMILIES for key, spec in f.config_keys().items()}


_SCHEMAS = {
    2: {**_COMMON, **_family_schema()},
    1: {**_COMMON, **{old: _family_schema()[new] for old, new in VERSION_1_KEYS.items()}},
}
# Every key some version knows, for flattening (free-form tables stay whole).
_SCHEMA = {**_SCHEMAS[1], **_SCHEMAS[2]}


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if not isinstance(key, str):
            raise ConfigError(f"key {key!r} is not a string", key=str(key))
        if dotted in _SCHEMA or not isinstance(value, Mapping):
            flat[dotted] = value
        else:
            flat.update(_flatten(value, dotted + "."))
    return flat


def _parse_mode(value: str | int, key: str, where: str) -> int:
    text = str(value)
    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise ConfigError(
            f"{where}: {key} must be an octal mode such as '0600', not {value!r}", key=key
        )
    return mode


def parse_config(data: Any, where: str = "config") -> Config:
    """Validate a parsed YAML document and build a :class:`Config`."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: the top level must be a mapping of keys, not {type(data).__name__}")
    flat = _flatten(data)
    if "version" not in flat:
        raise ConfigError(f"{where}: missing 'version: {CURRENT_VERSION}' at the top", key="version")
    version = flat["version"]
    if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        if not isinstance(version, int) or isinstance(version, bool):
            raise ConfigError(f"{where}: 'version' has the wrong type ({type(version).__name__})", key="version")
        raise ConfigError(
            f"{where}: version {version!r} is not supported; this slurm-tpu reads versions "
            f"{', '.join(map(str, SUPPORTED_VERSIONS))}", key="version")
    schema = _SCHEMAS[version]
    for key, value in flat.items():
        if key not in schema:
            known = ", ".join(sorted(schema))
            raise ConfigError(f"{where}: unknown key '{key}' (known keys: {known})", key=key)
        expected, _ = schema[key]
        # bool is an int subclass: keep 'version: true' from passing as 1.
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            raise ConfigError(f"{where}: '{key}' has the wrong type ({type(value).__name__})", key=key)

    defaults = Config()
    if version == 1:
        families = _families(flat, where, renamed={new: old for old, new in VERSION_1_KEYS.items()})
    else:
        families = _families(flat, where)
    idle = Ownership(
        owner=flat.get("devices.idle.owner", defaults.idle.owner),
        group=flat.get("devices.idle.group", defaults.idle.group),
        mode=_parse_mode(flat.get("devices.idle.mode", "0600"), "devices.idle.mode", where),
    )
    if flat.get("slurm.backend", "auto") not in SLURM_BACKENDS:
        raise ConfigError(f"{where}: 'slurm.backend' must be one of {', '.join(SLURM_BACKENDS)}, "
                          f"not {flat['slurm.backend']!r}", key="slurm.backend")
    scan_s = flat.get("devices.holder_scan_seconds", defaults.holder_scan_seconds)
    if not 0 < scan_s <= 60:
        raise ConfigError(f"{where}: 'devices.holder_scan_seconds' must be more than 0 and at most 60, not "
                          f"{scan_s!r}", key="devices.holder_scan_seconds")
    for key in ("devices.slot_dir", "state_dir", "inventory_file", "udev.run_program", "slurm.bin_dir",
                "slurm.sbin_dir", "sysfs_root"):
        if key in flat and not os.path.isabs(flat[key]):
            raise ConfigError(f"{where}: '{key}' must be an absolute path, not {flat[key]!r}", key=key)
    return Config(
        node_name=flat.get("node_name"),
        families=families,
        slot_dir=flat.get("devices.slot_dir", defaults.slot_dir),
        state_dir=flat.get("state_dir", defaults.state_dir),
        inventory_file=flat.get("inventory_file", defaults.inventory_file),
        idle=idle,
        lease_mode=_parse_mode(flat.get("devices.lease.mode", "0600"), "devices.lease.mode", where),
        revoke=flat.get("devices.revoke", defaults.revoke),
        holder_scan_seconds=float(scan_s),
        sysfs_root=flat.get("sysfs_root", defaults.sysfs_root),
        udev_run_program=flat.get("udev.run_program"),
        slurm_bin_dir=flat.get("slurm.bin_dir"),
        slurm_sbin_dir=flat.get("slurm.sbin_dir"),
        slurm_backend=flat.get("slurm.backend", defaults.slurm_backend),
        path=None if where == "config" else where,
    )


def _families(flat: Mapping[str, Any], where: str, renamed: Mapping[str, str] | None = None
              ) -> dict[str, FamilyConfig]:
    """kind -> settings; ``renamed`` maps a version 2 key to the version 1 key the file used."""
    found = {}
    for family in FAMILIES:
        prefix = f"families.{family.kind}."
        section = {}
        for key in family.config_keys():
            source = (renamed or {}).get(prefix + key, prefix + key)
            if source in flat:
                section[key] = flat[source]
        try:
            found[family.kind] = family.parse_config(section, where)
        except ConfigError as exc:
            if renamed and exc.key in renamed:  # name the key as the file spells it
                old = renamed[exc.key]
                raise ConfigError(str(exc).replace(f"'{exc.key}'", f"'{old}'"), path=exc.path, key=old) from None
            raise
    return found


def load_config(path: str | None = None) -> Config:
    """Load the config from ``path``, ``$SLURM_TPU_CONFIG`` or the default path.

    A missing file is an error only when it was named explicitly; the default path
    may be absent (all defaults apply).
    """
    explicit = path or os.environ.get(ENV_VAR)
    target = explicit or DEFAULT_PATH
    try:
        with open(target, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        if explicit:
            raise ConfigError(
                f"config file {target} does not exist: create it or drop --config/{ENV_VAR}",
                path=target,
            ) from None
        return Config()
    except OSError as exc:
        raise ConfigError(f"config file {target} cannot be read: {exc.strerror}", path=target) from exc
    import yaml  # deferred: hooks that never read a config skip the import

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"config file {target}{line}: {problem}; fix the YAML syntax", path=target) from exc
    return parse_config(data, where=target)
