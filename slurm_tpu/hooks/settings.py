"""Everything a hook needs, from a snapshot file instead of YAML and two Slurm configs.

Reading the site config (PyYAML), inventory.json, slurm.conf and gres.conf costs tens of
milliseconds per job. So the first hook after any change builds :class:`HookSettings` the
slow way and writes them to ``<state_dir>/hooks.snapshot`` (protocol/hooks_snapshot.py)
with the identity (device, inode, size, mtime) of every file they came from; later hooks
only ``stat`` those files and read the snapshot.

The state directory is found by a line scan of the config for ``state_dir:``, or taken
from the C client (``SLURM_TPU_STATE_DIR``); if either is ever wrong the snapshot is not
found (or its sources differ) and the slow path runs: it costs speed, never correctness.
"""

from __future__ import annotations

import os

from ..access import statedir
from ..defaults import CONFIG_ENV, CONFIG_PATH, STATE_DIR, STATE_DIR_ENV
from ..protocol.hooks_snapshot import FILE as SNAPSHOT, HookSnapshot, format_snapshot, parse_snapshot
from ..protocol.inventory import FILE_NAME as INVENTORY


class HookSettings(HookSnapshot):
    """Config values, the families' policies, this node's devices and its GRES index, as the hooks use them."""

    def slurm(self, environ, detail_source=None):  # -> slurm.commands.Slurm
        """The Slurm gateway for a hook: no PATH (slurmd gives hooks none, and a job must not choose).
        ``detail_source``: see ``Slurm.detail_source``."""
        from ..slurm import installation
        from ..slurm.commands import Slurm

        install = installation.find(environ, self.slurm_bin_dir or None, self.slurm_sbin_dir or None, use_path=False)
        return Slurm(install, environ, detail_source=detail_source)

    def leasable_names(self) -> list[str]:
        """GRES names whose devices this node leases (families that lease, with devices here)."""
        kinds = {device.kind for device in self.devices.values()}
        leased = [p for p in self.families.values() if p.leased and p.gres_name in self.index and p.kind in kinds]
        return list(dict.fromkeys(policy.gres_name for policy in leased))

    def energy_gres(self) -> list[str]:
        """GRES names of families that are not leased but whose devices here have an energy source (GPUs,
        by default): the Prolog learns a job's of them (allocation.energy_devices). Empty when disabled."""
        if not self.energy_enabled:
            return []
        kinds = {
            device.kind
            for identity, device in self.devices.items()
            if not self.energy_sources.get(identity, "none:").startswith("none:")
        }
        found = [p.gres_name for p in self.families.values() if not p.leased and p.kind in kinds]
        return list(dict.fromkeys(found))

    def policy_of_gres(self, name: str):  # -> FamilyPolicy | None
        """The leasing family whose GRES name this is (None: not ours)."""
        return next((p for p in self.families.values() if p.leased and p.gres_name == name), None)


def file_key(path: str) -> str:
    """What identifies a file's version: device, inode, size, mtime; '-' if missing."""
    try:
        info = os.stat(path)
    except OSError:
        return "-"
    return f"{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}"


def scan_state_dir(path: str) -> str:
    """The config's top-level ``state_dir:`` by a line scan (no YAML import)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("state_dir:"):
                    value = line[len("state_dir:") :].split(" #", 1)[0].strip()
                    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                        value = value[1:-1]
                    return value
    except OSError:
        pass
    return STATE_DIR


def load(environ, node: str | None = None, create: bool = True) -> HookSettings:
    """The hook settings for this node: from the snapshot when it is current."""
    cfg = environ.get(CONFIG_ENV) or CONFIG_PATH
    state_dir = environ.get(STATE_DIR_ENV) or scan_state_dir(cfg)
    fast = _from_snapshot(state_dir, cfg, environ, node)
    if fast is not None:
        return fast
    return rebuild(environ, node, create)


def _from_snapshot(state_dir: str, cfg: str, environ, node: str | None) -> HookSettings | None:
    if not os.path.isabs(state_dir):
        return None
    try:
        fd = statedir.open_dir(state_dir)
        try:
            raw = statedir.read_file(fd, SNAPSHOT)
        finally:
            os.close(fd)
    except statedir.StateDirError:
        return None
    if raw is None:
        return None
    settings = parse_snapshot(raw.decode("utf-8", "replace"), HookSettings)
    if settings is None or settings.state_dir != state_dir or node not in (None, settings.node):
        return None
    if set(_source_paths(cfg, state_dir, environ)) - set(settings.sources):
        return None
    current = all(file_key(path) == key for path, key in settings.sources.items())
    return settings if current else None


def _source_paths(cfg: str, state_dir: str, environ) -> list[str]:
    from .slurm_files import conf_paths

    slurm_conf, gres_conf = conf_paths(environ)
    return [cfg, os.path.join(state_dir, INVENTORY), slurm_conf, gres_conf]


def apply_families(settings: HookSettings, config, document=None) -> None:
    """Precompute what the hooks need of the families (slow path only: imports the registry):
    policies, udev rules and job variables per family, each known device's entry in them
    (a device without one, a PCIe Edge TPU without its node, is refused by the prolog), and the
    devices the site shares (``document``: the inventory file's, for their GRES types)."""
    from ..families import FAMILIES
    from ..protocol.hooks_snapshot import EnvVariable

    by_kind = {}
    shares = _shares(settings, config, document)
    for family in FAMILIES:
        by_kind[family.kind] = family
        policy = family.hook_policy(config.family(family.kind))
        policy.shared = tuple(identity for identity in shares if settings.devices[identity].kind == family.kind)
        settings.families[family.kind] = policy
        if not family.shard_per_file and policy.shared:  # the broker's devices (tpu_shard)
            from ..protocol.hooks_snapshot import ShardPolicy

            devices = {identity: shares[identity] for identity in policy.shared}
            settings.shards = ShardPolicy(family.shard_name(config.family(family.kind)), devices)
        settings.udev += family.udev_identities
        settings.variables += [
            EnvVariable(v.name, family.kind, v.unset_when_empty, v.never_unset) for v in family.variables
        ]
    if settings.energy_enabled:
        settings.energy_sources = _energy_sources(settings, config, document)
    for device in settings.devices.values():
        device_family = by_kind.get(device.kind)
        for variable in device_family.variables if device_family is not None else ():
            try:
                entry = variable.value(device.identity, device.primary_node)
            except ValueError:
                continue
            settings.values.setdefault(device.identity, {})[variable.name] = entry


def _energy_sources(settings: HookSettings, config, document) -> dict[str, str]:
    """identity -> where each known device's energy figure comes from, as its family declares it
    (``Family.energy_source``, from the inventory document's facts: a GPU's vendor and bus address)."""
    from ..families import family, inventory_from_json

    if not document:
        return {}
    try:
        accelerators = {a.identity: a for a in inventory_from_json(document)}
    except (KeyError, TypeError, ValueError):
        return {}
    found = {}
    for identity, device in settings.devices.items():
        accelerator = accelerators.get(identity)
        try:
            owner = family(device.kind)
        except KeyError:
            continue
        if accelerator is not None:
            found[identity] = owner.energy_source(config.family(device.kind), accelerator, settings.sysfs_root)
    return found


def _shares(settings: HookSettings, config, document) -> dict[str, int]:
    """identity -> shares of each known device the config shares. A device's GRES type comes from
    the inventory document; one it cannot be read from matches by identity or ``all`` only."""
    from ..families import family, inventory_from_json

    types: dict[str, str] = {}
    if document:
        try:
            for accelerator in inventory_from_json(document):
                types[accelerator.identity] = family(accelerator.kind).gres_type(
                    config.family(accelerator.kind), accelerator
                )
        except (KeyError, TypeError, ValueError):
            types = {}
    found = {}
    for device in settings.devices.values():
        try:
            owner = family(device.kind)
        except KeyError:
            continue
        shares = owner.shares(config.family(device.kind), device.identity, types.get(device.identity, ""))
        if shares:
            found[device.identity] = shares
    return found


def _load_config(path: str):  # -> Config
    """The site config at ``path`` (the defaults when the default path has none).
    Hooks run under ``python3 -I -S`` for a fast start, which leaves site-packages (and so
    PyYAML) off sys.path: it is added only when a config file must be read."""
    from ..config import Config, load_config

    if path == CONFIG_PATH and not os.path.exists(path):
        return Config()
    try:
        return load_config(path)
    except ImportError:
        import site

        site.main()
        return load_config(path)


def rebuild(environ, node: str | None = None, create: bool = True) -> HookSettings:
    """The slow path: full config (YAML), inventory file, slurm.conf + gres.conf, the families."""
    from .. import families
    from ..access import node_inventory, ownership
    from ..protocol.inventory import parse_inventory
    from . import slurm_files

    cfg = environ.get(CONFIG_ENV) or CONFIG_PATH
    config = _load_config(cfg)
    node = node or config.node_name or os.uname().nodename.split(".")[0]
    settings = HookSettings(config.state_dir, config.slot_dir, config.lease_mode, 0, 0, config.idle.mode, node)
    settings.idle_uid, settings.idle_gid = ownership.resolve_ids(config.idle.owner, config.idle.group)
    settings.slurm_bin_dir, settings.slurm_sbin_dir = config.slurm_bin_dir or "", config.slurm_sbin_dir or ""
    settings.revoke, settings.holder_scan_s = config.revoke, config.holder_scan_seconds
    settings.sysfs_root = config.sysfs_root
    settings.accounting_spool = config.accounting_spool
    settings.energy_enabled = config.energy.enabled
    settings.nvml_library, settings.energy_poll_s = config.energy.nvml_library, config.energy.poll_seconds
    paths = _source_paths(cfg, config.state_dir, environ)
    paths += slurm_files.slurm_conf_files(paths[2])[1:]
    # The registry: a family added or changed (an upgrade) sends the next hook down this path.
    paths.append(families.__file__)
    keys_before = {path: file_key(path) for path in paths}
    try:
        fd = statedir.open_dir(config.state_dir, create=create)
    except statedir.StateDirError:
        if create or os.path.lexists(config.state_dir):
            raise
        return settings  # no state directory: nothing was ever leased here
    try:
        document = node_inventory.load_document(fd)
        settings.devices = parse_inventory(document) if document else {}
        apply_families(settings, config, document)
        names = list(dict.fromkeys(p.gres_name for p in settings.families.values() if p.leased))
        names += [name for name in settings.energy_gres() if name not in names]  # GPUs: IDX -> identity
        settings.index = slurm_files.gres_index(node, names, environ)
        settings.sources = keys_before
        # Only a root hook writes; a file changed while we read it is not snapshotted.
        if os.geteuid() == 0 and all(file_key(p) == k for p, k in keys_before.items()):
            _write_snapshot(fd, settings)
    finally:
        os.close(fd)
    return settings


def _write_snapshot(fd: int, settings: HookSettings) -> None:
    try:
        text = format_snapshot(settings)
    except ValueError:
        statedir.remove(fd, SNAPSHOT)  # a value it cannot hold (a tab in a path): the slow path every time
        return
    statedir.write_atomic(fd, SNAPSHOT, text.encode())
    # The task-prolog's file for a job with no device here: every job variable unset.
    from ..protocol import envfile

    data = envfile.render_unset(settings).encode()
    if statedir.read_file(fd, envfile.NO_DEVICES) != data:
        statedir.write_atomic(fd, envfile.NO_DEVICES, data, mode=0o644)


def for_config(config) -> HookSettings:
    """The hook settings under an admin command's config (its file, its node name): what
    ``leases --clear`` and ``health`` end a lease with, as the node's hooks would."""
    environ = dict(os.environ)
    if config.path:
        environ[CONFIG_ENV] = config.path
    return rebuild(environ, config.node_name)


def store_snapshot(state_fd: int, settings: HookSettings) -> None:
    """Rewrite the snapshot after the caller changed the inventory file it holds the lock on.
    ``settings`` must already carry the change; only the inventory file's key is renewed, so
    any other source that changed meanwhile still sends the next hook down the slow path."""
    inventory = os.path.join(settings.state_dir, INVENTORY)
    if inventory in settings.sources and os.geteuid() == 0:
        settings.sources[inventory] = file_key(inventory)
        _write_snapshot(state_fd, settings)
