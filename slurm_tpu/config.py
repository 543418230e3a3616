"""The site's versioned YAML config (``/etc/slurm-tpu/config.yaml``).

The file is optional (without it every default applies). When present it must say its
version, and a key that version does not know is rejected with its dotted name, so a typo
never silently falls back to a default. Version 2 nests the accelerator settings by family
(``families.<kind>.*``, declared by each family); version 1 files keep loading, their flat
keys read as the version 2 keys :data:`VERSION_1_KEYS` names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from .defaults import (
    ACCOUNTING_SPOOL,
    CONFIG_ENV as ENV_VAR,
    CONFIG_PATH as DEFAULT_PATH,
    ENERGY_POLL_S,
    HOLDER_SCAN_S,
    IDLE_GROUP,
    IDLE_OWNER,
    INVENTORY_FILE,
    NODE_MODE,
    NVML_LIBRARY,
    SLOT_DIR,
    STATE_DIR,
    SYSFS_ROOT,
)
from .errors import ConfigError
from .families import FAMILIES, FamilyConfig

SUPPORTED_VERSIONS = (1, 2)
CURRENT_VERSION = 2
SLURM_BACKENDS = ("auto", "scontrol", "pyslurm")


# ---- how a key's value is checked and converted: (value, dotted key, where) after the type
# check -> the Config's value, or ConfigError naming the key.


def parse_mode(value: str | int, key: str, where: str) -> int:
    text = str(value)
    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise ConfigError(f"{where}: {key} must be an octal mode such as '0600', not {value!r}", key=key)
    return mode


def _absolute_path(value: str, key: str, where: str) -> str:
    if not os.path.isabs(value):
        raise ConfigError(f"{where}: '{key}' must be an absolute path, not {value!r}", key=key)
    return value


def _slurm_backend(value: str, key: str, where: str) -> str:
    if value not in SLURM_BACKENDS:
        raise ConfigError(f"{where}: '{key}' must be one of {', '.join(SLURM_BACKENDS)}, not {value!r}", key=key)
    return value


def _scan_seconds(value: int | float, key: str, where: str) -> float:
    if not 0 < value <= 60:
        raise ConfigError(f"{where}: '{key}' must be more than 0 and at most 60, not {value!r}", key=key)
    return float(value)


@dataclass(frozen=True)
class Key:
    """One YAML key of the config, declared once, beside the Config field it fills: ``types`` what
    YAML may give for it, ``help`` its one-line meaning (docs/configuration.md is made from these),
    ``convert`` how a value is checked and turned into the field's (None: taken as it is)."""

    name: str
    types: type | tuple[type, ...]
    help: str
    convert: Callable[[Any, str, str], Any] | None = None


def setting(
    name: str,
    types: type | tuple[type, ...],
    help: str,
    default: Any,
    convert: Callable[[Any, str, str], Any] | None = None,
) -> Any:
    """A Config field that one YAML key sets (its default applies when the file does not say)."""
    return field(default=default, metadata={"key": Key(name, types, help, convert)})


VERSION = Key("version", int, "config format version (2; 1 is still read)")


@dataclass(frozen=True)
class Ownership:
    """Who owns a device node, and its permission bits."""

    owner: str = setting("devices.idle.owner", str, "owner of idle accelerator nodes", IDLE_OWNER)
    group: str = setting("devices.idle.group", str, "group of idle accelerator nodes", IDLE_GROUP)
    mode: int = setting(
        "devices.idle.mode", (str, int), "mode of idle accelerator nodes, e.g. '0600'", NODE_MODE, parse_mode
    )


def _poll_seconds(value: int | float, key: str, where: str) -> float:
    if not 1 <= value <= 60:
        raise ConfigError(f"{where}: '{key}' must be 1 to 60 seconds, not {value!r}", key=key)
    return float(value)


def _library(value: str, key: str, where: str) -> str:
    # A soname (the dynamic loader's search) or an absolute path: never one relative to the hook's cwd.
    if not value or ("/" in value and not os.path.isabs(value)) or any(c in value for c in "\t\n"):
        raise ConfigError(f"{where}: '{key}' must be a library soname or an absolute path, not {value!r}", key=key)
    return value


@dataclass(frozen=True)
class Energy:
    """Per-job accelerator energy (protocol/energy.py); the watts of modelled devices are the families'
    (``families.<kind>.watts``)."""

    enabled: bool = setting(
        "energy.enabled",
        bool,
        "read each job's energy on its accelerators at its start and end (false: no reads, no files)",
        True,
    )
    nvml_library: str = setting(
        "energy.nvml_library",
        str,
        "the NVML library GPU energy is read through (a soname or an absolute path)",
        NVML_LIBRARY,
        _library,
    )
    poll_seconds: float = setting(
        "energy.poll_seconds",
        (int, float),
        "how often the node agent polls the power of devices without an energy counter (1 to 60)",
        ENERGY_POLL_S,
        _poll_seconds,
    )


@dataclass(frozen=True)
class Config:
    """Site choices: each field that a YAML key sets declares that key (:func:`setting`)."""

    node_name: str | None = setting("node_name", str, "Slurm NodeName of this node (default: short hostname)", None)
    # kind -> the family's settings (GRES name, types, features, leased or not): the keys
    # families.<kind>.*, which each family declares (slurm_tpu/families/).
    families: Mapping[str, FamilyConfig] = field(default_factory=lambda: {f.kind: f.default_config for f in FAMILIES})
    slot_dir: str = setting(
        "devices.slot_dir",
        str,
        "directory of the stable slot nodes gres.conf names (<slot_dir>/<identity>)",
        SLOT_DIR,
        _absolute_path,
    )
    state_dir: str = setting(
        "state_dir",
        str,
        "the hooks' state: lease ledger, audit log, the hooks' inventory (a tmpfs)",
        STATE_DIR,
        _absolute_path,
    )
    inventory_file: str = setting(
        "inventory_file",
        str,
        "persistent copy of the configured inventory (restored at boot)",
        INVENTORY_FILE,
        _absolute_path,
    )
    # The epilog's figures for `accounting-collect`, kept across reboots (docs/accounting.md).
    accounting_spool: str = setting(
        "accounting_spool",
        str,
        "where the epilog leaves each job's figures for accounting-collect (root-only; persistent storage)",
        ACCOUNTING_SPOOL,
        _absolute_path,
    )
    idle: Ownership = field(default=Ownership(), metadata={"keys": Ownership})
    lease_mode: int = setting(
        "devices.lease.mode", (str, int), "mode of a leased node, owned by the job's user", NODE_MODE, parse_mode
    )
    revoke: bool = setting(
        "devices.revoke",
        bool,
        "at job end make every open fd of a USB Edge TPU useless (port power-cycle); false: ownership-only isolation",
        True,
    )
    holder_scan_seconds: float = setting(
        "devices.holder_scan_seconds",
        (int, float),
        "time box (more than 0, at most 60) of the epilog's scan for processes "
        "holding a device; over it the device (not the node) waits",
        HOLDER_SCAN_S,
        _scan_seconds,
    )
    sysfs_root: str = setting(
        "sysfs_root", str, "where sysfs is mounted (tests point it at a testbed)", SYSFS_ROOT, _absolute_path
    )
    udev_run_program: str | None = setting(
        "udev.run_program",
        str,
        "absolute path udev RUN+= runs on device events (default: the installed "
        "slurm-tpu-udev-event; a program named slurm-tpu gets 'udev-event')",
        None,
        _absolute_path,
    )
    slurm_bin_dir: str | None = setting(
        "slurm.bin_dir",
        str,
        "Slurm's client programs (scontrol, squeue; env SLURM_TPU_SLURM_BIN); default: beside the running slurmd",
        None,
        _absolute_path,
    )
    slurm_sbin_dir: str | None = setting(
        "slurm.sbin_dir",
        str,
        "Slurm's daemons (slurmd, slurmstepd; env SLURM_TPU_SLURM_SBIN); default: the running slurmd's directory",
        None,
        _absolute_path,
    )
    slurm_backend: str = setting(
        "slurm.backend",
        str,
        "auto, scontrol or pyslurm: how health and the watcher talk to Slurm",
        "auto",
        _slurm_backend,
    )
    energy: Energy = field(default=Energy(), metadata={"keys": Energy})
    path: str | None = None  # where it was loaded from, for messages

    def family(self, kind: str) -> FamilyConfig:
        """The settings of one family (its defaults if the registry gained it after this config)."""
        from .families import family

        configured = self.families.get(kind)
        return family(kind).default_config if configured is None else configured


def config_keys(cls: type = Config) -> list[tuple[Key, Any]]:
    """(key, default) of every key the Config's fields declare, in declaration order (``version``
    and the families' keys are not fields: see :data:`VERSION` and ``Family.config_keys``)."""
    found = []
    for item in fields(cls):
        if "key" in item.metadata:
            found.append((item.metadata["key"], item.default))
        elif "keys" in item.metadata:
            found.extend(config_keys(item.metadata["keys"]))
    return found


def _build(cls: type, flat: Mapping[str, Any], where: str, **given: Any) -> Any:
    """``cls`` from the flattened, type-checked file: each declared key it holds, converted; the
    field's default for the others."""
    values = dict(given)
    for item in fields(cls):
        if "key" in item.metadata:
            key = item.metadata["key"]
            if key.name in flat:
                value = flat[key.name]
                values[item.name] = key.convert(value, key.name, where) if key.convert else value
        elif "keys" in item.metadata:
            values[item.name] = _build(item.metadata["keys"], flat, where)
    return cls(**values)


# The schema: dotted key -> (expected python type(s), description). Nested mappings are listed by
# their leaves; one listed as ``dict`` is a free-form name->name table.
_COMMON: dict[str, tuple[type | tuple[type, ...], str]] = {
    key.name: (key.types, key.help) for key, _ in [(VERSION, CURRENT_VERSION), *config_keys()]
}
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


_FAMILY_KEYS = {f"families.{f.kind}.{key}": spec for f in FAMILIES for key, spec in f.config_keys().items()}
_SCHEMAS = {
    2: {**_COMMON, **_FAMILY_KEYS},
    1: {**_COMMON, **{old: _FAMILY_KEYS[new] for old, new in VERSION_1_KEYS.items()}},
}
# Every key some version knows, for flattening (free-form tables stay whole).
_SCHEMA = {**_SCHEMAS[1], **_SCHEMAS[2]}


def schema(version: int = CURRENT_VERSION) -> dict[str, tuple[type | tuple[type, ...], str]]:
    """Dotted key -> (accepted python type(s), description) for one config version."""
    return dict(_SCHEMAS[version])


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
    if not isinstance(version, int) or isinstance(version, bool):
        raise ConfigError(f"{where}: 'version' has the wrong type ({type(version).__name__})", key="version")
    if version not in SUPPORTED_VERSIONS:
        raise ConfigError(
            f"{where}: version {version!r} is not supported; this slurm-tpu reads versions "
            f"{', '.join(map(str, SUPPORTED_VERSIONS))}",
            key="version",
        )
    schema = _SCHEMAS[version]
    for key, value in flat.items():
        if key not in schema:
            known = ", ".join(sorted(schema))
            raise ConfigError(f"{where}: unknown key '{key}' (known keys: {known})", key=key)
        expected, _ = schema[key]
        # bool is an int subclass: keep 'version: true' from passing as 1.
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            raise ConfigError(f"{where}: '{key}' has the wrong type ({type(value).__name__})", key=key)

    renamed = {new: old for old, new in VERSION_1_KEYS.items()} if version == 1 else None
    families = _families(flat, where, renamed)
    return _build(Config, flat, where, families=families, path=None if where == "config" else where)


def _families(flat: Mapping[str, Any], where: str, renamed: Mapping[str, str] | None = None) -> dict[str, FamilyConfig]:
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
            if renamed and exc.key is not None and exc.key in renamed:  # name the key as the file spells it
                old = renamed[exc.key]
                raise ConfigError(str(exc).replace(f"'{exc.key}'", f"'{old}'"), path=exc.path, key=old) from None
            raise
    _check_shard_names(found, where)
    return found


def _check_shard_names(found: Mapping[str, FamilyConfig], where: str) -> None:
    """A family's shard GRES must not be another family's whole GRES (Slurm would merge their counts)."""
    from .families import family

    whole = {settings.gres_name.lower(): kind for kind, settings in found.items()}
    for kind, settings in found.items():
        name = family(kind).shard_name(settings)
        if settings.shard_gres and name.lower() in whole:
            key = f"families.{kind}.shard_gres_name"
            raise ConfigError(
                f"{where}: '{key}' {name!r} is the GRES of the {family(whole[name.lower()]).title}s", key=key
            )


def load_config(path: str | None = None) -> Config:
    """Load the config from ``path``, ``$SLURM_TPU_CONFIG`` or the default path (which may be
    absent: all defaults apply; a missing file named explicitly is an error)."""
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
