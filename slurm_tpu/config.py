"""The site's versioned YAML config (``/etc/slurm-tpu/config.yaml``).

The file is optional: without it every default below applies. When present it must
say ``version: 1``; any key this version does not know is rejected with its dotted
name, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import ConfigError

DEFAULT_PATH = "/etc/slurm-tpu/config.yaml"
ENV_VAR = "SLURM_TPU_CONFIG"
SUPPORTED_VERSIONS = (1,)


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
    tpu_gres_name: str = "tpu"
    gpu_gres_name: str = "gpu"
    tpu_types: Mapping[str, str] = field(
        default_factory=lambda: {"usb": "edgetpu_usb", "pci": "edgetpu_pci"}
    )
    gpu_types: Mapping[str, str] = field(default_factory=dict)
    tpu_features: tuple[str, ...] = ("tpu", "edgetpu")
    gpu_features: tuple[str, ...] = ("gpu",)
    slot_dir: str = "/dev/slurm-tpu"
    state_dir: str = "/run/slurm-tpu"
    # The configured inventory, kept across reboots (/run and /dev are tmpfs).
    inventory_file: str = "/var/lib/slurm-tpu/inventory.json"
    idle: Ownership = Ownership()
    lease_mode: int = 0o600
    isolate_gpus: bool = False
    # At job end, make every fd of the job's devices useless (USB: the hub port is
    # power-cycled, see slurm_tpu/locks/revoke.py); false keeps ownership-only isolation.
    revoke: bool = True
    # Wall-clock budget of one holder scan (every process's fds and mappings); a scan
    # that cannot finish in it drains the node instead of stretching the epilog.
    holder_scan_seconds: float = 2.0
    # Where sysfs is mounted (tests point it at a materialized testbed).
    sysfs_root: str = "/sys"
    udev_run_program: str | None = None
    # Where Slurm's programs are (None: found as slurm/installation.py says).
    slurm_bin_dir: str | None = None
    slurm_sbin_dir: str | None = None
    # How ops commands talk to Slurm: "auto" (pyslurm where it pays and matches), "scontrol", "pyslurm".
    slurm_backend: str = "auto"
    path: str | None = None  # where it was loaded from, for messages


# The schema: dotted key -> (expected python type(s), description). Nested
# mappings are listed by their leaves; a mapping value listed as ``dict`` is a
# free-form name->name table.
_SCHEMA: dict[str, tuple[type | tuple[type, ...], str]] = {
    "version": (int, "config format version (1)"),
    "node_name": (str, "Slurm NodeName of this node (default: short hostname)"),
    "gres.tpu_name": (str, "GRES name for Edge TPUs"),
    "gres.gpu_name": (str, "GRES name for GPUs"),
    "gres.tpu_types.usb": (str, "GRES type for USB Edge TPUs"),
    "gres.tpu_types.pci": (str, "GRES type for PCIe/M.2 Edge TPUs"),
    "gres.gpu_types": (dict, "GPU model slug -> GRES type"),
    "features.tpu": (list, "node features added when a node has an Edge TPU"),
    "features.gpu": (list, "node features added when a node has a GPU"),
    "devices.slot_dir": (str, "directory of stable device slot nodes"),
    "devices.idle.owner": (str, "owner of idle accelerator nodes"),
    "devices.idle.group": (str, "group of idle accelerator nodes"),
    "devices.idle.mode": ((str, int), "mode of idle accelerator nodes, e.g. '0600'"),
    "devices.lease.mode": ((str, int), "mode of a leased node, owned by the job's user"),
    "devices.isolate_gpus": (bool, "lease GPUs too (clusters without cgroup devices)"),
    "devices.revoke": (bool, "at job end make every open fd of a USB Edge TPU useless (port power-cycle)"),
    "devices.holder_scan_seconds": ((int, float), "time box of the epilog's scan for processes holding a device"),
    "sysfs_root": (str, "where sysfs is mounted (default /sys)"),
    "state_dir": (str, "lease ledger directory"),
    "inventory_file": (str, "persistent copy of the configured inventory (restored at boot)"),
    "udev.run_program": (str, "absolute path of slurm-tpu for udev RUN+="),
    "slurm.bin_dir": (str, "Slurm's client programs (scontrol, squeue); default: beside the running slurmd"),
    "slurm.sbin_dir": (str, "Slurm's daemons (slurmd, slurmstepd); default: the running slurmd's directory"),
    "slurm.backend": (str, "auto, scontrol or pyslurm: how health and the watcher talk to Slurm"),
}
SLURM_BACKENDS = ("auto", "scontrol", "pyslurm")


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
        raise ConfigError(f"{where}: missing 'version: 1' at the top", key="version")
    if flat["version"] not in SUPPORTED_VERSIONS:
        raise ConfigError(
            f"{where}: version {flat['version']!r} is not supported; this slurm-tpu reads version 1",
            key="version",
        )
    for key, value in flat.items():
        if key not in _SCHEMA:
            known = ", ".join(sorted(_SCHEMA))
            raise ConfigError(f"{where}: unknown key '{key}' (known keys: {known})", key=key)
        expected, _ = _SCHEMA[key]
        # bool is an int subclass: keep 'version: true' from passing as 1.
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            raise ConfigError(f"{where}: '{key}' has the wrong type ({type(value).__name__})", key=key)

    def text_list(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        items = flat.get(key, default)
        if not all(isinstance(item, str) and item for item in items):
            raise ConfigError(f"{where}: '{key}' must be a list of non-empty strings", key=key)
        return tuple(items)

    defaults = Config()
    tpu_types = dict(defaults.tpu_types)
    for bus in ("usb", "pci"):
        tpu_types[bus] = flat.get(f"gres.tpu_types.{bus}", tpu_types[bus])
    gpu_types = flat.get("gres.gpu_types", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in gpu_types.items()):
        raise ConfigError(f"{where}: 'gres.gpu_types' must map model names to type names", key="gres.gpu_types")
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
        tpu_gres_name=flat.get("gres.tpu_name", defaults.tpu_gres_name),
        gpu_gres_name=flat.get("gres.gpu_name", defaults.gpu_gres_name),
        tpu_types=tpu_types,
        gpu_types=dict(gpu_types),
        tpu_features=text_list("features.tpu", defaults.tpu_features),
        gpu_features=text_list("features.gpu", defaults.gpu_features),
        slot_dir=flat.get("devices.slot_dir", defaults.slot_dir),
        state_dir=flat.get("state_dir", defaults.state_dir),
        inventory_file=flat.get("inventory_file", defaults.inventory_file),
        idle=idle,
        lease_mode=_parse_mode(flat.get("devices.lease.mode", "0600"), "devices.lease.mode", where),
        isolate_gpus=flat.get("devices.isolate_gpus", defaults.isolate_gpus),
        revoke=flat.get("devices.revoke", defaults.revoke),
        holder_scan_seconds=float(scan_s),
        sysfs_root=flat.get("sysfs_root", defaults.sysfs_root),
        udev_run_program=flat.get("udev.run_program"),
        slurm_bin_dir=flat.get("slurm.bin_dir"),
        slurm_sbin_dir=flat.get("slurm.sbin_dir"),
        slurm_backend=flat.get("slurm.backend", defaults.slurm_backend),
        path=None if where == "config" else where,
    )


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
