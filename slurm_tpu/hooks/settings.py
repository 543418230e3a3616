"""Everything a hook needs, from a snapshot file instead of YAML and two Slurm configs.

On every job a prolog would otherwise import PyYAML (plus site-packages) to read
the site config, parse inventory.json, slurm.conf and gres.conf and rebuild the
IDX -> device table: tens of milliseconds of a job's start-up. Instead the first
hook after any change builds :class:`HookSettings` the slow way and writes them to
``<state_dir>/hooks.snapshot``, together with the identity (device, inode,
size, mtime) of every file they came from; later hooks only ``stat`` those files
and read the snapshot (plain tab-separated lines: no json, re or yaml import).

The state directory is found by a cheap scan of the config for a top-level
``state_dir:`` line; if that scan is ever wrong the snapshot is simply not
found (or its sources differ) and the slow path runs, so it costs speed, never
correctness.
"""

from __future__ import annotations

import os

from ..locks import statedir
from ..locks.node_inventory import KnownDevice

SNAPSHOT = "hooks.snapshot"
QUERY_MARKER = "prolog.query"
FORMAT = "slurm-tpu hooks snapshot 5"
DEFAULT_CONFIG = "/etc/slurm-tpu/config.yaml"
DEFAULT_STATE_DIR = "/run/slurm-tpu"


class HookSettings:
    """Config values, this node's devices and its GRES index, as the hooks use them."""

    __slots__ = ("state_dir", "slot_dir", "lease_mode", "idle_uid", "idle_gid", "idle_mode", "isolate_gpus",
                 "tpu_name", "gpu_name", "node", "devices", "index", "sources", "env_names", "tpu_paths",
                 "slurm_bin_dir", "slurm_sbin_dir", "revoke", "holder_scan_s", "sysfs_root")

    def __init__(self, state_dir: str, slot_dir: str = "/dev/slurm-tpu", lease_mode: int = 0o600,
                 idle_uid: int = 0, idle_gid: int = 0, idle_mode: int = 0o600, isolate_gpus: bool = False,
                 tpu_name: str = "tpu", gpu_name: str = "gpu", node: str = "",
                 devices: dict[str, KnownDevice] | None = None,
                 index: dict[str, list[tuple[str | None, str | None]]] | None = None,
                 sources: dict[str, str] | None = None):
        self.state_dir, self.slot_dir, self.lease_mode = state_dir, slot_dir, lease_mode
        self.idle_uid, self.idle_gid, self.idle_mode = idle_uid, idle_gid, idle_mode
        self.isolate_gpus, self.tpu_name, self.gpu_name, self.node = isolate_gpus, tpu_name, gpu_name, node
        self.devices = devices or {}
        self.index = index or {}
        self.sources = sources or {}
        # The job environment contract (jobenv.py), precomputed so the prolog
        # need not import it: variable names, and libedgetpu's "type:path" per TPU.
        self.env_names: tuple[str, ...] = ()
        self.tpu_paths: dict[str, str] = {}
        # The config's slurm.bin_dir/sbin_dir ("" when unset: slurm/installation.py decides).
        self.slurm_bin_dir, self.slurm_sbin_dir = "", ""
        # Revocation at job end (slurm_tpu/locks/revoke.py) and the holder scan's time box.
        self.revoke, self.holder_scan_s, self.sysfs_root = True, 2.0, "/sys"

    def slurm(self, environ):  # -> slurm.commands.Slurm
        """The Slurm gateway for a hook: no PATH (slurmd gives hooks none, and a job must not choose)."""
        from ..slurm import installation
        from ..slurm.commands import Slurm

        install = installation.find(environ, self.slurm_bin_dir or None, self.slurm_sbin_dir or None,
                                    use_path=False)
        return Slurm(install, environ)

    def leasable_names(self) -> list[str]:
        """GRES names whose devices this node leases (tpu; gpu with isolate_gpus)."""
        names = []
        if any(d.kind == "edgetpu" for d in self.devices.values()) and self.tpu_name in self.index:
            names.append(self.tpu_name)
        if self.isolate_gpus and any(d.kind == "gpu" for d in self.devices.values()) \
                and self.gpu_name in self.index:
            names.append(self.gpu_name)
        return names

    # ---- snapshot format -------------------------------------------------------------
    def to_text(self) -> str:
        lines = [FORMAT]
        for path, key in sorted(self.sources.items()):
            lines.append(f"src\t{path}\t{key}")
        lines.append("set\t" + "\t".join([self.state_dir, self.slot_dir, str(self.lease_mode), str(self.idle_uid),
                                          str(self.idle_gid), str(self.idle_mode), str(int(self.isolate_gpus)),
                                          self.tpu_name, self.gpu_name, self.node, self.slurm_bin_dir,
                                          self.slurm_sbin_dir, str(int(self.revoke)), repr(self.holder_scan_s),
                                          self.sysfs_root]))
        for device in self.devices.values():
            lines.append("dev\t" + "\t".join([device.identity, device.kind, device.bus, *device.device_nodes]))
        lines.append("env\t" + "\t".join(self.env_names))
        for identity, path in self.tpu_paths.items():
            lines.append(f"tpath\t{identity}\t{path}")
        for name, order in self.index.items():
            for position, (kind, path) in enumerate(order):
                lines.append(f"idx\t{name}\t{position}\t{kind or ''}\t{path or ''}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_text(cls, text: str) -> "HookSettings | None":
        lines = text.split("\n")
        if not lines or lines[0] != FORMAT:
            return None
        settings = None
        sources, devices, index, env_names, tpu_paths = {}, {}, {}, (), {}
        for line in lines[1:]:
            if not line:
                continue
            fields = line.split("\t")
            tag = fields[0]
            if tag == "src" and len(fields) == 3:
                sources[fields[1]] = fields[2]
            elif tag == "set" and len(fields) == 16:
                settings = fields[1:]
            elif tag == "dev" and len(fields) >= 4:
                devices[fields[1]] = KnownDevice(fields[1], fields[2], fields[3], tuple(fields[4:]))
            elif tag == "env":
                env_names = tuple(fields[1:])
            elif tag == "tpath" and len(fields) == 3:
                tpu_paths[fields[1]] = fields[2]
            elif tag == "idx" and len(fields) == 5:
                index.setdefault(fields[1], []).append((fields[3] or None, fields[4] or None))
            else:
                return None
        if settings is None:
            return None
        s = settings
        result = cls(s[0], s[1], int(s[2]), int(s[3]), int(s[4]), int(s[5]), s[6] == "1", s[7], s[8], s[9],
                     devices, index, sources)
        result.env_names, result.tpu_paths = env_names, tpu_paths
        result.slurm_bin_dir, result.slurm_sbin_dir = s[10], s[11]
        result.revoke, result.holder_scan_s, result.sysfs_root = s[12] == "1", float(s[13]), s[14]
        return result


def file_key(path: str) -> str:
    """What identifies a file's version: device, inode, size, mtime; '-' if missing."""
    try:
        info = os.stat(path)
    except OSError:
        return "-"
    return f"{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}"


def config_path(environ) -> str:
    return environ.get("SLURM_TPU_CONFIG") or DEFAULT_CONFIG


def scan_state_dir(path: str) -> str:
    """The config's top-level ``state_dir:`` by a line scan (no YAML import)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("state_dir:"):
                    value = line[len("state_dir:"):].split(" #", 1)[0].strip()
                    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                        value = value[1:-1]
                    return value
    except OSError:
        pass
    return DEFAULT_STATE_DIR


def load(environ, node: str | None = None, create: bool = True) -> HookSettings:
    """The hook settings for this node: from the snapshot when it is current."""
    cfg = config_path(environ)
    state_dir = scan_state_dir(cfg)
    fast = _from_snapshot(state_dir, cfg, environ, node)
    if fast is not None:
        return fast
    return rebuild(environ, node, create)


def _from_snapshot(state_dir: str, cfg: str, environ, node: str | None) -> HookSettings | None:
    if not os.path.isabs(state_dir):
        return None
    try:
        fd = statedir.open_dir(state_dir)
    except statedir.StateDirError:
        return None
    try:
        raw = statedir.read_file(fd, SNAPSHOT)
    except statedir.StateDirError:
        raw = None
    finally:
        os.close(fd)
    if raw is None:
        return None
    settings = HookSettings.from_text(raw.decode("utf-8", "replace"))
    if settings is None or settings.state_dir != state_dir:
        return None
    if node is not None and settings.node != node:
        return None
    wanted = _source_paths(cfg, state_dir, environ)
    if set(wanted) - set(settings.sources):
        return None
    for path, key in settings.sources.items():
        if file_key(path) != key:
            return None
    return settings


def _source_paths(cfg: str, state_dir: str, environ) -> list[str]:
    from .allocation import conf_paths

    slurm_conf, gres_conf = conf_paths(environ)
    return [cfg, os.path.join(state_dir, "inventory.json"), slurm_conf, gres_conf]


def edgetpu_paths(devices: dict[str, KnownDevice]) -> dict[str, str]:
    """identity -> "type:path" as SLURM_TPU_EDGETPU_PATHS carries it, per leasable Edge TPU."""
    from .. import jobenv

    paths = {}
    for device in devices.values():
        if device.kind == "edgetpu":
            try:
                kind, path = jobenv.libedgetpu_path(device.identity, device.primary_node)
            except ValueError:
                continue  # a PCIe TPU without its node: the prolog refuses it anyway
            paths[device.identity] = f"{kind}:{path}"
    return paths


def rebuild(environ, node: str | None = None, create: bool = True) -> HookSettings:
    """The slow path: full config (YAML), inventory file, slurm.conf + gres.conf."""
    from .. import jobenv
    from ..locks import node_inventory, ownership
    from ..protocol import usage
    from . import allocation
    from .context import load_hook_config

    cfg = config_path(environ)
    config = load_hook_config(environ)
    node = node or config.node_name or os.uname().nodename.split(".")[0]
    settings = HookSettings(config.state_dir, config.slot_dir, config.lease_mode, 0, 0, config.idle.mode,
                            config.isolate_gpus, config.tpu_gres_name, config.gpu_gres_name, node)
    settings.idle_uid, settings.idle_gid = ownership.resolve_ids(config.idle.owner, config.idle.group)
    settings.slurm_bin_dir, settings.slurm_sbin_dir = config.slurm_bin_dir or "", config.slurm_sbin_dir or ""
    settings.revoke, settings.holder_scan_s = config.revoke, config.holder_scan_seconds
    settings.sysfs_root = config.sysfs_root
    paths = _source_paths(cfg, config.state_dir, environ)
    paths += allocation.slurm_conf_files(paths[2])[1:]
    keys_before = {path: file_key(path) for path in paths}
    try:
        fd = statedir.open_dir(config.state_dir, create=create)
    except statedir.StateDirError:
        if create or os.path.lexists(config.state_dir):
            raise
        return settings  # no state directory: nothing was ever leased here
    try:
        settings.devices = node_inventory.load(fd)
        settings.env_names = (jobenv.DEVICES, jobenv.EDGETPU_PATHS, jobenv.GPUS, usage.USAGE_DIR_ENV)
        settings.tpu_paths = edgetpu_paths(settings.devices)
        names = [config.tpu_gres_name] + ([config.gpu_gres_name] if config.isolate_gpus else [])
        settings.index = allocation.gres_index(node, names, environ)
        settings.sources = keys_before
        # Only a root hook writes; a file changed while we read it is not snapshotted.
        if os.geteuid() == 0 and all(file_key(p) == k for p, k in keys_before.items()):
            _write_snapshot(fd, settings, environ)
    finally:
        os.close(fd)
    return settings


def _scontrol_for_sh(settings: HookSettings, environ) -> str | None:
    """The scontrol the sh prolog starts early (None: let the Python side ask)."""
    from ..errors import SlurmCommandError

    try:
        return settings.slurm(environ).program("scontrol")
    except SlurmCommandError:
        return None


def _write_snapshot(fd: int, settings: HookSettings, environ) -> None:
    statedir.write_atomic(fd, SNAPSHOT, settings.to_text().encode())
    # Tells prolog/slurm-tpu-prolog (sh) whether to start the Slurm query early, and
    # with which scontrol (sh cannot read /proc/PID/exe without forking).
    scontrol = _scontrol_for_sh(settings, environ) if settings.leasable_names() else None
    if scontrol:
        statedir.write_atomic(fd, QUERY_MARKER, scontrol.encode() + b"\n")
    else:
        statedir.remove(fd, QUERY_MARKER)


def store_snapshot(state_fd: int, settings: HookSettings, environ) -> None:
    """Rewrite the snapshot after the caller changed the inventory file it holds the lock on.

    ``settings`` must already carry the change (udev_event: a re-enumerated
    device's new node); only the inventory file's key is renewed, so any other
    source that changed meanwhile still sends the next hook down the slow path.
    """
    inventory = os.path.join(settings.state_dir, "inventory.json")
    if inventory in settings.sources and os.geteuid() == 0:
        settings.sources[inventory] = file_key(inventory)
        _write_snapshot(state_fd, settings, environ)
