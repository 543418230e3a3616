"""``slurm-tpu install`` / ``uninstall``: put a node's pieces in place, and take exactly them away.

The pieces (docs/admin-guide.md lists them): the hooks in a fixed root-owned directory
(``<prefix>/libexec/slurm-tpu``, so slurm.conf never names a path inside a virtualenv; the
Python ones run ``-I -S`` and import the package from where pip put it, so a job start stays
in the milliseconds); where a C compiler is, the agent's C client and its ``<hook>-native``
copies (:meth:`Layout.hook`); the udev rules, systemd units and a config skeleton under
``<sysconfdir>``; with ``--libedgetpu``, the patched Edge TPU runtime where Coral's package
puts its own (a site's file there is kept as a backup, which uninstall puts back).

Every run is idempotent (unchanged files are not rewritten) and records in a manifest
what it created and what it replaced, so ``uninstall`` removes exactly that, restores
what was there before, and keeps the config unless asked (``--purge``).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field

from .. import __version__
from ..config import Config
from ..defaults import CONFIG_ENV, CONFIG_PATH as DEFAULT_CONFIG, PREFIX, STATE_DIR, SYSCONFDIR
from ..errors import SlurmCommandError, SlurmTpuError
from ..files import BACKUP_SUFFIX, write_if_changed
from ..protocol import install_manifest
from ..protocol.install_manifest import ABSENT, SAME, file_entry
from . import node_files
from .accounting import accounting_on
from .hook_client import NATIVE_HOOKS, native_entry

# slurm.conf option -> the installed program it names (the hooks: or their native entries, see Layout.hook).
SLURM_HOOKS = {
    "Prolog": "slurm-tpu-prolog",
    "Epilog": "slurm-tpu-epilog",
    "TaskProlog": "slurm-tpu-task-prolog",
    "HealthCheckProgram": "slurm-tpu-health",
}
# What the udev rules run (RUN+=): not a slurm.conf option, so not in SLURM_HOOKS.
UDEV_HOOK = "slurm-tpu-udev-event"
# (shipped directory, name, mode) of the hook files copied into the hooks directory.
HOOK_FILES = (
    ("prolog", "slurm-tpu-prolog", 0o755),
    ("prolog", "slurm-tpu-task-prolog", 0o755),
    ("udev", UDEV_HOOK, 0o755),
    ("epilog", "slurm-tpu-epilog", 0o755),
    ("systemd", "slurm-tpu-agent", 0o755),
    ("systemd", "slurm-tpu-broker", 0o755),
)
# (shipped name in systemd/, installed path under <sysconfdir>/systemd/system).
SYSTEMD_FILES = (
    ("slurm-tpu-agent.service", "slurm-tpu-agent.service"),
    ("slurm-tpu-broker.service", "slurm-tpu-broker.service"),
    ("slurm-tpu-watch.service", "slurm-tpu-watch.service"),
    ("slurm-tpu-metrics.service", "slurm-tpu-metrics.service"),
    ("slurm-tpu-metrics.timer", "slurm-tpu-metrics.timer"),
    ("slurm-tpu-accounting.service", "slurm-tpu-accounting.service"),
    ("slurm-tpu-accounting.timer", "slurm-tpu-accounting.timer"),
    ("slurmd-slurm-tpu.conf", "slurmd.service.d/slurm-tpu.conf"),
)
# The accounting collector's units (docs/accounting.md), which doctor checks where slurmdbd records jobs.
ACCOUNTING_UNITS = ("slurm-tpu-accounting.service", "slurm-tpu-accounting.timer")
_MARK = "  # set by slurm-tpu install"
# Coral's libedgetpu1-std layout: the library file, and the soname link dlopen("libedgetpu.so.1") finds.
LIBEDGETPU_FILE = "libedgetpu.so.1.0"
LIBEDGETPU_SONAME = "libedgetpu.so.1"


def default_libdir() -> str:
    """Where Debian's packages, Coral's libedgetpu1-std among them, put libraries: /usr/lib/<multiarch>."""
    import sysconfig

    multiarch = sysconfig.get_config_var("MULTIARCH")
    return os.path.join("/usr/lib", multiarch) if multiarch else "/usr/lib"


@dataclass(frozen=True)
class Layout:
    """Where ``install`` puts things: hooks under ``prefix``, udev/systemd/config under ``sysconfdir``."""

    prefix: str = PREFIX
    sysconfdir: str = SYSCONFDIR
    libdir: str = ""  # "": default_libdir()
    # enroot's system config directory (with enroot.conf and hooks.d; enroot's ENROOT_SYSCONF_PATH):
    # "" means <sysconfdir>/enroot, where enroot's packages put it. The enroot hook goes into its
    # hooks.d when that directory is there (enroot installed).
    enroot: str = ""

    def __post_init__(self) -> None:
        if not self.libdir:
            object.__setattr__(self, "libdir", default_libdir())
        if not self.enroot:
            object.__setattr__(self, "enroot", os.path.join(self.sysconfdir, "enroot"))
        for name in ("prefix", "sysconfdir", "libdir", "enroot"):
            value = getattr(self, name)
            if not os.path.isabs(value):
                raise SlurmTpuError(f"--{name} {value!r} must be an absolute directory")
            object.__setattr__(self, name, os.path.normpath(value))

    @property
    def hooks_dir(self) -> str:
        return os.path.join(self.prefix, "libexec", "slurm-tpu")

    def hook_file(self, option: str) -> str:
        """The installed hook (or HealthCheckProgram wrapper) for slurm.conf's ``option`` (Prolog, Epilog, ...)."""
        return os.path.join(self.hooks_dir, SLURM_HOOKS[option])

    def native_entry(self, option: str) -> str | None:
        """Where ``install`` puts the native entry of ``option``'s hook (None: that hook has none)."""
        return native_entry(self.hook_file(option)) if SLURM_HOOKS[option] in NATIVE_HOOKS else None

    @property
    def native_entries_fit(self) -> bool:
        """Whether the native entries would read this installation's config.

        They read ``$SLURM_TPU_CONFIG`` (which slurmd never sets), else the client's compiled-in
        :data:`DEFAULT_CONFIG`; the installed hooks carry this layout's config instead. Under another
        ``--sysconfdir`` slurm.conf names the hooks themselves.
        """
        return self.config_file == DEFAULT_CONFIG

    def hook(self, option: str) -> str:
        """The installed program slurm.conf's ``option`` (Prolog, Epilog, ...) should name (install's
        slurm.conf lines, doctor): its native entry where one is installed, else the hook."""
        entry = self.native_entry(option)
        if entry and self.native_entries_fit and os.path.isfile(entry):
            return entry
        return self.hook_file(option)

    @property
    def udev_hook(self) -> str:
        """The installed program the udev rules run (``RUN+=``) on every device event."""
        return os.path.join(self.hooks_dir, UDEV_HOOK)

    @property
    def enroot_hook(self) -> str | None:
        """Where the enroot hook goes (``<enroot>/hooks.d/98-slurm-tpu.sh``), None where enroot's
        config directory is not there (no enroot on this node)."""
        from ..hooks.enroot import HOOK_NAME

        return os.path.join(self.enroot, "hooks.d", HOOK_NAME) if os.path.isdir(self.enroot) else None

    @property
    def manifest(self) -> str:
        return os.path.join(self.hooks_dir, install_manifest.NAME)

    @property
    def udev_rules(self) -> str:
        from ..render.udev_rules import RULES_NAME

        return os.path.join(self.sysconfdir, "udev", "rules.d", RULES_NAME)

    @property
    def systemd_dir(self) -> str:
        return os.path.join(self.sysconfdir, "systemd", "system")

    @property
    def config_file(self) -> str:
        return os.path.join(self.sysconfdir, "slurm-tpu", "config.yaml")

    @property
    def is_system(self) -> bool:
        """Whether udev and systemd read what is installed here (then they are reloaded)."""
        return self.sysconfdir == SYSCONFDIR


def layout_config(layout: Layout, explicit: str | None) -> Config:
    """The config install/doctor use: ``explicit`` (--config or $SLURM_TPU_CONFIG), else the layout's file."""
    from ..config import load_config

    if explicit or os.path.exists(layout.config_file):
        return load_config(explicit or layout.config_file)
    return Config()


# ---- what the files say ------------------------------------------------------------------


def udev_run_program(layout: Layout, config: Config, explicit: str | None = None) -> str:
    """What the udev rules' ``RUN+=`` runs: ``explicit`` (``udev-rules --run-program``), else the
    config's ``udev.run_program``, else the hook ``install`` puts in ``layout``.

    ``install``, ``doctor`` and ``udev-rules`` all ask here, so they agree. A program named
    ``slurm-tpu`` is the console script: it gets its ``udev-event`` subcommand (so a config
    naming it still renders working rules); any other program is run without arguments.
    """
    program = explicit or config.udev_run_program or layout.udev_hook
    if not os.path.isabs(program):
        raise SlurmTpuError(f"udev run program {program!r} must be an absolute path (udev has no PATH)")
    if any(c.isspace() or c in "\"'\\%$" for c in program):
        # udev splits RUN+= at white space and expands % and $: the path must mean itself.
        raise SlurmTpuError(
            f"udev run program {program!r} holds white space, a quote, '\\', '%' or '$', "
            "which udev's RUN+= would not pass through: name a path without them"
        )
    return f"{program} udev-event" if os.path.basename(program) == "slurm-tpu" else program


def installed_hook_text(text: str, name: str, python: str, package_root: str, config_file: str) -> str:
    """A shipped hook as installed: its interpreter, where ``slurm_tpu`` is, and (if not the default)
    which config it reads. The rest of the script is the shipped one, byte for byte."""
    lines = text.splitlines(keepends=True)
    python_hook = lines[0].startswith("#!") and "python" in lines[0]
    if python_hook:
        if any(c.isspace() for c in python) or len(python) > 120:
            raise SlurmTpuError(
                f"cannot write {python!r} into a #! line (spaces, or longer than 120 characters): "
                "install slurm-tpu into a virtualenv with a short path without spaces"
            )
        lines[0] = f"#!{python} -IS\n"
        roots = [i for i, line in enumerate(lines) if line.startswith("_ROOT = ")]
        if len(roots) != 1:
            raise SlurmTpuError(
                f"shipped hook {name} has {len(roots)} '_ROOT = ' lines, not 1: "
                "this slurm-tpu package is broken; reinstall it"
            )
        insert = [f"_ROOT = {package_root!r}{_MARK}\n"]
        if config_file != DEFAULT_CONFIG:
            insert.append(f"os.environ.setdefault({CONFIG_ENV!r}, {config_file!r}){_MARK}\n")
        lines[roots[0] : roots[0] + 1] = insert
    elif config_file != DEFAULT_CONFIG and lines and lines[0].startswith("#!"):
        lines.insert(1, f"{_sh_config(config_file)}{_MARK}\n")
    return "".join(lines)


def enroot_hook_text(
    python: str, package_root: str, config_file: str, libedgetpu: str, dev: str = "/dev", sys_root: str = "/sys"
) -> str:
    """The enroot hook (enroot/98-slurm-tpu.sh) as installed: its interpreter and package root, and
    its ``_SETTINGS`` line (the node's config, libedgetpu, device root and sysfs; slurm_tpu/hooks/enroot.py).
    The job's environment can name none of them: the hook runs with it."""
    from ..hooks.enroot import CONFIG, DEV, HOOK_NAME, LIBEDGETPU, SYS

    text = installed_hook_text(
        node_files.read_node_file("enroot", HOOK_NAME), HOOK_NAME, python, package_root, DEFAULT_CONFIG
    )
    lines = text.splitlines(keepends=True)
    found = [i for i, line in enumerate(lines) if line.startswith("_SETTINGS = ")]
    if len(found) != 1:
        raise SlurmTpuError(
            f"shipped hook {HOOK_NAME} has {len(found)} '_SETTINGS = ' lines, not 1: reinstall slurm-tpu"
        )
    settings = {CONFIG: config_file, LIBEDGETPU: libedgetpu, DEV: dev, SYS: sys_root}
    lines[found[0]] = f"_SETTINGS = {settings!r}{_MARK}\n"
    return "".join(lines)


def _sh_config(config_file: str) -> str:
    """The sh line that makes the programs below it read ``config_file`` (unless the caller names one)."""
    return f"{CONFIG_ENV}=${{{CONFIG_ENV}:-{shlex.quote(config_file)}}}; export {CONFIG_ENV}"


def health_program_text(python: str, config_file: str) -> str:
    """The HealthCheckProgram wrapper: Slurm passes no arguments, so this adds ``health``."""
    config = "" if config_file == DEFAULT_CONFIG else f"{_sh_config(config_file)}\n"
    return (
        "#!/bin/sh\n"
        "# Slurm HealthCheckProgram= (root, every HealthCheckInterval seconds; Slurm passes no\n"
        "# arguments): `slurm-tpu health` of the installation that wrote this file.\n"
        f"# Written by slurm-tpu install {__version__}.\n"
        f"{config}exec {shlex.quote(python)} -I -m slurm_tpu.cli health\n"
    )


def unit_text(shipped: str, program: str, slurm_conf_dir: str, hooks_dir: str, state_dir: str = STATE_DIR) -> str:
    """A shipped systemd file with this installation's paths filled in (``state_dir``: the config's,
    which the TPU broker's sandbox lets it write)."""
    if any(c.isspace() for c in state_dir):
        raise SlurmTpuError(f"state_dir {state_dir!r} holds a space: systemd's ReadWritePaths= cannot name it")
    return (
        shipped.replace("@SLURM_TPU@", program)
        .replace("@SLURM_CONF_DIR@", slurm_conf_dir)
        .replace("@HOOKS_DIR@", hooks_dir)
        .replace("@STATE_DIR@", state_dir)
    )


CONFIG_SKELETON = """\
# slurm-tpu site config (written by `slurm-tpu install`; every key is optional).
# After a change: slurm-tpu install (udev rules), slurm-tpu gres-conf --output ...,
# slurm-tpu doctor. Unknown keys are rejected, so a typo never passes silently.
version: 2
# node_name: n1                    # Slurm NodeName (default: the short hostname)
# state_dir: /run/slurm-tpu        # the hooks' lease ledger (root-owned)
# accounting_spool: /var/lib/slurm-tpu/accounting-spool   # jobs' figures for accounting-collect
# families:                        # per accelerator family: GRES name, types, features
#   edgetpu: {gres_name: tpu, types: {usb: edgetpu_usb, pci: edgetpu_pci}}
#   gpu: {gres_name: gpu, isolate: false}   # isolate: lease GPUs too (no cgroup devices)
#   hailo: {gres_name: npu, types: {default: hailo8, by_address: {"0000:01:00.0": hailo8l}}}
# devices:
#   slot_dir: /dev/slurm-tpu
#   idle: {owner: root, group: root, mode: "0600"}
#   lease: {mode: "0600"}
# slurm:
#   bin_dir: /usr/bin              # default: beside the running slurmd
"""


def gres_type_names(*configs: Config) -> list[str]:
    """GresTypes= entries for nodes with these configs: every family's GRES name, in registry order,
    then each shard GRES (tpu_shard, Slurm's shard) that some config shares devices through.

    A shard GRES is listed only where a config shares devices, so a site that shares nothing keeps
    the GresTypes it had (Slurm loads its gres/shard plugin for ``shard``, which wants GPUs); Slurm
    accepts a listed name with no device, so one slurm.conf for every node may list it anyway."""
    from ..families import FAMILIES

    names = [config.family(f.kind).gres_name for config in configs for f in FAMILIES]
    names += [
        f.shard_name(config.family(f.kind)) for config in configs for f in FAMILIES if config.family(f.kind).shared
    ]
    return list(dict.fromkeys(name for name in names if name))


def gres_types(config: Config) -> str:
    """GresTypes= value for a node with this config (:func:`gres_type_names`)."""
    return ",".join(gres_type_names(config))


def slurm_conf_lines(layout: Layout, config: Config) -> list[str]:
    """The option lines of the shipped slurm.conf snippet, filled in (``Prolog=...``); a hook's line
    names what :meth:`Layout.hook` says (its native entry where one is installed)."""
    text = node_files.read_node_file("slurm_conf", "slurm.conf.snippet")
    text = text.replace("@HOOKS_DIR@", layout.hooks_dir).replace("@GRES_TYPES@", gres_types(config))
    lines = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            option = line.partition("=")[0]
            lines.append(f"{option}={layout.hook(option)}" if option in SLURM_HOOKS else line)
    return lines


def accounting_tres_line(inventory, config: Config) -> list[str]:
    """``AccountingStorageTRES=`` for every GRES name and type of ``inventory`` ([] when it has none):
    Slurm's accounting (sacct, sreport, QOS limits) tracks a GRES only when it is listed there."""
    from ..render.node_conf import inventory_tres

    entries = inventory_tres(inventory, config)
    return [f"AccountingStorageTRES={','.join(entries)}"] if entries else []


def missing_slurm_conf_lines(wanted: list[str], options: dict[str, str]) -> list[str]:
    """The lines of ``wanted`` that slurm.conf's ``options`` (lower-case keys) lack.

    Prolog/Epilog, GresTypes and AccountingStorageTRES are lists in Slurm: ours must be among them;
    HealthCheckInterval/NodeState may hold any site value; the rest must match.
    """
    missing = []
    for line in wanted:
        key, _, value = line.partition("=")
        have = options.get(key.lower())
        if have is None:
            missing.append(line)
        elif key in ("Prolog", "Epilog", "GresTypes", "AccountingStorageTRES"):
            if not set(value.split(",")) <= set(have.split(",")):
                # A list line: say the whole value it needs (the site's entries and ours).
                missing.append(
                    f"{key}={','.join(dict.fromkeys(have.split(',') + value.split(',')))}"
                    if key == "AccountingStorageTRES" and have
                    else line
                )
        elif key not in ("HealthCheckInterval", "HealthCheckNodeState") and have != value:
            missing.append(line)
    return missing


# ---- the plan ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FileSpec:
    path: str
    content: str
    mode: int
    config: bool = False  # written only when absent; kept by uninstall unless --purge


def planned_files(layout: Layout, config: Config, slurm_conf_dir: str) -> list[FileSpec]:
    """Every file ``install`` writes, with its content."""
    from ..render.udev_rules import render_udev_rules

    python, root = node_files.interpreter(), node_files.package_root()

    def hook(directory: str, name: str, mode: int) -> FileSpec:
        text = installed_hook_text(node_files.read_node_file(directory, name), name, python, root, layout.config_file)
        return FileSpec(os.path.join(layout.hooks_dir, name), text, mode)

    enroot = []
    if layout.enroot_hook:
        library = os.path.join(layout.libdir, LIBEDGETPU_SONAME)
        text = enroot_hook_text(python, root, layout.config_file, library, sys_root=config.sysfs_root)
        enroot = [FileSpec(layout.enroot_hook, text, 0o755)]
    return [
        *(hook(*spec) for spec in HOOK_FILES),
        *enroot,
        FileSpec(layout.hook_file("HealthCheckProgram"), health_program_text(python, layout.config_file), 0o755),
        FileSpec(layout.udev_rules, render_udev_rules(config, udev_run_program(layout, config)), 0o644),
        *planned_units(layout, slurm_conf_dir, state_dir=config.state_dir),
        FileSpec(layout.config_file, CONFIG_SKELETON, 0o644, config=True),
    ]


def planned_units(
    layout: Layout, slurm_conf_dir: str, names: tuple[str, ...] | None = None, state_dir: str = STATE_DIR
) -> list[FileSpec]:
    """The systemd files ``install`` writes (of the shipped ``names``, default all), filled in."""
    program = node_files.this_program()
    return [
        FileSpec(
            os.path.join(layout.systemd_dir, target),
            unit_text(
                node_files.read_node_file("systemd", shipped), program, slurm_conf_dir, layout.hooks_dir, state_dir
            ),
            0o644,
        )
        for shipped, target in SYSTEMD_FILES
        if names is None or shipped in names
    ]


@dataclass
class Manifest:
    """What an install did: directories it created, files it wrote and what was there before
    (the format: :mod:`slurm_tpu.protocol.install_manifest`)."""

    layout: Layout
    dirs: list[str] = field(default_factory=list)
    files: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def load(cls, layout: Layout) -> Manifest | None:
        try:
            with open(layout.manifest, encoding="utf-8") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SlurmTpuError(
                f"install manifest {layout.manifest} is unreadable ({exc}): remove it and the files it listed by hand"
            ) from exc
        return cls(layout, *install_manifest.decode(raw, layout.manifest))

    def text(self) -> str:
        layout = self.layout
        return install_manifest.encode(
            __version__, layout.prefix, layout.sysconfdir, self.dirs, list(self.files.values())
        )


def _make_dirs(path: str, manifest: Manifest, dry_run: bool, say) -> None:
    """Create ``path`` and missing parents (root 0755), recording each one created."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        say(f"create directory {directory}")
        if not dry_run:
            os.mkdir(directory, 0o755)
            os.chmod(directory, 0o755)  # mkdir's mode is cut by the umask
        if directory not in manifest.dirs:
            manifest.dirs.append(directory)


def _settle(path: str, mode: int) -> None:
    """Root's, with ``mode``: hooks run as root, and whoever can write them is root."""
    os.chown(path, 0, 0, follow_symlinks=False)
    os.chmod(path, mode)


def _file_sha256(path: str) -> str | None:
    """sha256 of a regular file's bytes (None: absent, or not a regular file)."""
    if os.path.islink(path) or not os.path.isfile(path):
        return None
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def _changed_since(entry: dict) -> bool:
    """Whether what is at a manifest entry's path is no longer what install wrote there (gone: unchanged)."""
    path = entry["path"]
    if "link" in entry:
        return os.path.lexists(path) and not (os.path.islink(path) and os.readlink(path) == entry["link"])
    current = _file_sha256(path)
    return current is not None and current != entry["sha256"]


def _backup(path: str) -> str:
    """A copy of what is at ``path`` (a link stays a link) beside it; its path."""
    backup = path + BACKUP_SUFFIX
    if os.path.lexists(backup):
        os.unlink(backup)
    if os.path.islink(path):
        os.symlink(os.readlink(path), backup)
    else:
        shutil.copy2(path, backup)
    return backup


def _install_file(
    path: str, data: bytes, mode: int, manifest: Manifest, dry_run: bool, say, config: bool = False
) -> None:
    """Put ``data`` at ``path`` (root's, ``mode``) unless it is there already (or is the site's
    ``config``), and record it in the manifest."""
    if config and os.path.lexists(path):
        say(f"keep {path} (the site's config)")
        return
    digest = hashlib.sha256(data).hexdigest()
    if _file_sha256(path) == digest:
        info = os.stat(path)
        if (info.st_uid, info.st_gid, info.st_mode & 0o7777) != (0, 0, mode):
            say(f"fix owner/mode of {path} (root:root {mode:04o})")
            if not dry_run:
                _settle(path, mode)
        else:
            say(f"unchanged {path}")
        if path not in manifest.files:  # an identical file was there before: not ours to remove
            manifest.files[path] = file_entry(path, SAME, digest, config=config)
        return

    def write(temporary: str) -> None:
        with open(temporary, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        _settle(temporary, mode)

    _replace(path, "", write, manifest, dry_run, say, sha256=digest, config=config)


def _install_link(path: str, target: str, manifest: Manifest, dry_run: bool, say) -> None:
    """A symbolic link ``path`` -> ``target``; a different file or link there is kept as a backup."""
    if os.path.islink(path) and os.readlink(path) == target:
        say(f"unchanged {path} -> {target}")
        if path not in manifest.files:
            manifest.files[path] = file_entry(path, SAME, link=target)
        return
    _replace(
        path, f" -> {target}", lambda temporary: os.symlink(target, temporary), manifest, dry_run, say, link=target
    )


def _replace(path: str, shown: str, write, manifest: Manifest, dry_run: bool, say, **entry) -> None:
    """``write`` the new file or link at a temporary name beside ``path``, rename it over ``path`` (a reader,
    udev or a job's dlopen, finds the old or the new one, never half of one) and record it with ``entry``.

    The manifest's ``before``: our earlier record's (its backup, if any, holds what was there before the
    first install), else a backup of the site's file (put back by uninstall), else ``absent``.
    """
    exists = os.path.lexists(path)
    say(f"{'replace' if exists else 'write'} {path}{shown}")
    if dry_run:
        return
    previous = manifest.files.get(path)
    if previous is not None and previous["before"] != SAME:
        before = previous["before"]
    else:
        before = _backup(path) if exists else ABSENT
    temporary = f"{path}.slurm-tpu.new"
    try:
        if os.path.lexists(temporary):  # left by an interrupted run: never written through
            os.unlink(temporary)
        write(temporary)
        os.replace(temporary, path)
    except OSError as exc:
        raise SlurmTpuError(f"cannot write {path}: {exc.strerror or exc} (the file there is unchanged)") from exc
    manifest.files[path] = file_entry(path, before, **entry)


def read_libedgetpu(source: str) -> bytes:
    """The library ``--libedgetpu`` names; refuses, in one line, one that ignores EDGETPU_VISIBLE_DEVICES
    (Coral's own build) or cannot be read."""
    from .edgetpu_runtime import visible_devices_problem

    try:
        with open(source, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise SlurmTpuError(f"--libedgetpu {source}: cannot read it ({exc.strerror})") from None
    problem = visible_devices_problem(os.path.abspath(source))
    if problem:
        raise SlurmTpuError(f"--libedgetpu {problem}: build the patched one with scripts/build-libedgetpu.sh")
    return data


def install_libedgetpu(layout: Layout, data: bytes, manifest: Manifest, dry_run: bool, say) -> None:
    """Put the patched libedgetpu where ``libedgetpu.so.1`` resolves for users' code (see the module docstring)."""
    _make_dirs(layout.libdir, manifest, dry_run, say)
    _install_file(os.path.join(layout.libdir, LIBEDGETPU_FILE), data, 0o644, manifest, dry_run, say)
    _install_link(os.path.join(layout.libdir, LIBEDGETPU_SONAME), LIBEDGETPU_FILE, manifest, dry_run, say)


def install_hook_client(layout: Layout, manifest: Manifest, dry_run: bool, say) -> None:
    """Build the agent's thin client into the hooks directory, with the hooks' native entries
    beside them (where they fit: :attr:`Layout.native_entries_fit`); without a C compiler, nothing.

    The native entries are copies of the client, not hard links, so that each is one more file
    under the manifest's rules (at the cost of ~0.8 MB each).
    """
    from . import hook_client

    data = hook_client.compiled()
    if data is None:  # no compiler, or the build failed (said on stderr)
        why = "no C compiler" if hook_client.compiler() is None else "its build failed"
        say(f"{hook_client.PROGRAM} not built ({why}); the hooks run the Python hooks (slower)")
        return
    _install_file(os.path.join(layout.hooks_dir, hook_client.PROGRAM), data, 0o755, manifest, dry_run, say)
    if not layout.native_entries_fit:
        say(
            f"native entries not installed: they read {DEFAULT_CONFIG}, this installation's hooks "
            f"{layout.config_file}; slurm.conf names the hooks themselves"
        )
        return
    for option in SLURM_HOOKS:
        entry = layout.native_entry(option)
        if entry:
            _install_file(entry, data, 0o755, manifest, dry_run, say)


def _run_quietly(argv: list[str]) -> str | None:
    """None when ``argv`` succeeded, else its last error line."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def udev_reload(config: Config) -> list[list[str]]:
    """The commands that make udev apply changed rules: reload them, then a change event for every
    device they own (every leased family's subsystems). Install runs them; doctor names them as a fix."""
    from ..families import FAMILIES

    subsystems = [
        f"--subsystem-match={u.subsystem}" for f in FAMILIES if config.family(f.kind).lease for u in f.udev_identities
    ]
    return [["udevadm", "control", "--reload"], ["udevadm", "trigger", "--action=change", *subsystems]]


def reload_services(layout: Layout, config: Config, dry_run: bool, say, ldconfig: bool = False) -> None:
    """Make udev and systemd read what changed, and with ``ldconfig`` refresh the dynamic linker's cache
    for the library (only for the system's own directories, which they read)."""
    if not layout.is_system:
        say(f"udev and systemd not reloaded: {layout.sysconfdir} is not /etc, which they read")
        return
    steps = []
    if os.path.exists("/run/udev/control"):
        steps += udev_reload(config)
    else:
        say("udev is not running here: the rules apply when it starts")
    if os.path.isdir("/run/systemd/system"):
        steps.append(["systemctl", "daemon-reload"])
    if ldconfig:
        steps.append(["ldconfig"])
    for argv in steps:
        say(" ".join(argv))
        if not dry_run:
            error = _run_quietly(argv)
            if error:
                say(f"  failed: {error}")


@dataclass(frozen=True)
class InstallResult:
    missing_lines: tuple[str, ...]  # what slurm.conf still needs
    slurm_conf_read: bool


def _slurm_conf_options(slurm_conf: str) -> dict[str, str] | None:
    """slurm.conf's options (lower-case keys); None when it cannot be read."""
    from ..slurm.parse import parse_slurm_conf_options

    try:
        with open(slurm_conf, encoding="utf-8") as handle:
            return parse_slurm_conf_options(handle.read())
    except OSError:
        return None


def device_cgroup_note(config: Config, slurm_conf: str) -> str | None:
    """One line on Slurm's device cgroup for this node's slurmd and its Edge TPUs
    (slurm_tpu/slurm/device_cgroup.py), or None when slurmd cannot say its release."""
    from ..slurm import device_cgroup
    from ..slurm.commands import Slurm
    from ..slurm.installation import version_of

    try:
        version = version_of(Slurm.for_config(config).program("slurmd"))
    except SlurmCommandError:
        return None
    if version is None:
        return None
    options = _slurm_conf_options(slurm_conf) or {}
    fine, what, fix = device_cgroup.status(options, slurm_conf, version, True)
    if fine and what.startswith("off"):
        what = f"off; if turned on: {device_cgroup.where_it_holds(version)}"
    return f"Device cgroup (Slurm {version}): {what}" + ("" if fine else f"; {fix}")


def install(
    layout: Layout, config: Config, slurm_conf: str, dry_run: bool = False, say=print, libedgetpu: str | None = None
) -> InstallResult:
    """Put this node's pieces in place (see the module docstring), with ``libedgetpu`` the patched
    Edge TPU runtime (None: leave the node's as it is); idempotent."""
    if not dry_run and os.geteuid() != 0:
        raise SlurmTpuError(
            "slurm-tpu install must run as root: the hooks run as root and must be root's "
            "(or add --dry-run to see what it would do)"
        )
    library = read_libedgetpu(libedgetpu) if libedgetpu else None  # refused before anything is written
    manifest = Manifest.load(layout) or Manifest(layout)
    for spec in planned_files(layout, config, os.path.dirname(slurm_conf)):
        _make_dirs(os.path.dirname(spec.path), manifest, dry_run, say)
        _install_file(spec.path, spec.content.encode("utf-8"), spec.mode, manifest, dry_run, say, spec.config)
    if library is not None:
        install_libedgetpu(layout, library, manifest, dry_run, say)
    install_hook_client(layout, manifest, dry_run, say)
    _retire(layout, manifest, dry_run, say)
    if not dry_run:
        write_if_changed(layout.manifest, manifest.text(), 0o644, backup=False)
        _settle(layout.manifest, 0o644)
    reload_services(layout, config, dry_run, say, ldconfig=library is not None)
    wanted = slurm_conf_lines(layout, config)
    read = _slurm_conf_options(slurm_conf)
    options = read or {}
    if accounting_on(options):  # the node's GRES, as configured (its state-dir inventory)
        from .health_check import configured_inventory

        wanted += accounting_tres_line(configured_inventory(config), config)
    return InstallResult(tuple(missing_slurm_conf_lines(wanted, options)), read is not None)


# Hook files an earlier slurm-tpu installed that this one no longer ships (its Prolog and Epilog are
# each one Python file, its C client is built, not installed from source). slurm.conf never named
# any of them, so an upgrade removes them.
RETIRED_HOOK_FILES = ("slurm-tpu-prolog.py", "slurm-tpu-epilog.py", "slurm-tpu-lib.sh", "slurm-tpu-hook-client.c")


def _retire(layout: Layout, manifest: Manifest, dry_run: bool, say) -> None:
    """Remove :data:`RETIRED_HOOK_FILES` an earlier install wrote (the manifest says so, nothing was
    there before it) and nobody changed since; a changed one is left, said."""
    for name in RETIRED_HOOK_FILES:
        path = os.path.join(layout.hooks_dir, name)
        entry = manifest.files.get(path)
        if entry is None or entry["before"] != ABSENT:
            continue
        if _changed_since(entry):
            say(f"kept {path}: no longer used, but changed since slurm-tpu install wrote it (remove it by hand)")
            continue
        say(f"remove {path} (no longer used)")
        if not dry_run:
            if os.path.lexists(path):
                os.unlink(path)
            del manifest.files[path]


def uninstall(layout: Layout, purge: bool = False, dry_run: bool = False, say=print) -> list[str]:
    """Undo what the manifest says install did; returns what was left in place (with why)."""
    if not dry_run and os.geteuid() != 0:
        raise SlurmTpuError("slurm-tpu uninstall must run as root (or add --dry-run)")
    manifest = Manifest.load(layout)
    if manifest is None:
        raise SlurmTpuError(f"nothing to uninstall: no {layout.manifest} (slurm-tpu install writes it; check --prefix)")
    kept = []
    for entry in reversed(list(manifest.files.values())):
        path, before = entry["path"], entry["before"]
        if before == SAME:
            continue  # it was there before install: not ours to remove
        if entry["config"] and not purge:
            kept.append(f"{path} (the site's config; uninstall --purge removes it)")
            continue
        if _changed_since(entry) and not entry["config"]:
            kept.append(f"{path} (changed since slurm-tpu install wrote it; remove it by hand)")
            continue
        if before == ABSENT:
            say(f"remove {path}")
            if not dry_run and os.path.lexists(path):
                os.unlink(path)
        else:
            say(f"restore {path} from {before}")
            if not dry_run:
                os.replace(before, path)
    say(f"remove {layout.manifest}")
    if not dry_run:
        os.unlink(layout.manifest)
    for directory in reversed(manifest.dirs):
        if dry_run:
            say(f"remove directory {directory} (if empty)")
            continue
        try:
            os.rmdir(directory)
            say(f"remove directory {directory}")
        except FileNotFoundError:
            pass
        except OSError:
            kept.append(f"{directory} (not empty)")
    library = any(os.path.basename(path) == LIBEDGETPU_SONAME for path in manifest.files)
    reload_services(layout, Config(), dry_run, say, ldconfig=library)
    return kept
