"""``slurm-tpu cdi``'s I/O: this node's CDI specs (slurm_tpu/render/cdi.py) written and kept current.

Each family's spec is ``<dir>/slurm-tpu-<kind>.json``, written atomically with a backup and only
when its content changes (files.py :func:`write_if_changed`); a spec of ours for a family with no
device here any more is removed (its backup kept). :func:`refresh_cdi` is what the one place that
reacts to device changes (ops/configure.py :func:`prepare_node_state`: ``gres-conf --output`` and
the hotplug watcher) calls: it rewrites the specs only on a node whose CDI directory already holds
ours (``slurm-tpu cdi --output``: /var/run/cdi, or /etc/cdi to outlive a reboot), keeping the
libraries they mount.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass

from ..config import Config
from ..files import BACKUP_SUFFIX, write_if_changed
from ..hardware import Inventory
from ..render import cdi as render
from ..render.cdi import SPEC_PREFIX, render_cdi, spec_file_name

LIBEDGETPU_SONAME = "libedgetpu.so.1"


def default_libraries() -> dict[str, tuple[str, str]]:
    """kind -> (host file, container path) of the node's runtime libraries that exist here.

    libedgetpu: ``/usr/lib/<multiarch>/libedgetpu.so.1`` (where ``install --libedgetpu`` puts the
    patched one), resolved to its file, mounted at that same soname path (Coral's package layout);
    libhailort: the newest ``libhailort.so.*`` there, at its own path (the image's HailoRT, if any,
    is replaced by the one matching the host's driver).
    """
    from .install import default_libdir

    libdir = default_libdir()
    found: dict[str, tuple[str, str]] = {}
    soname = os.path.join(libdir, LIBEDGETPU_SONAME)
    if os.path.exists(soname):
        found["edgetpu"] = (os.path.realpath(soname), soname)
    hailort = sorted(glob.glob(os.path.join(libdir, "libhailort.so.*")))
    if hailort:
        found["hailo"] = (os.path.realpath(hailort[-1]), hailort[-1])
    return found


@dataclass(frozen=True)
class CdiResult:
    written: tuple[str, ...]  # files whose content changed
    unchanged: tuple[str, ...]
    removed: tuple[str, ...]  # ours, for a family with no device here now


def ours(directory: str) -> list[str]:
    """Our spec files in ``directory`` (never a backup)."""
    return sorted(p for p in glob.glob(os.path.join(directory, f"{SPEC_PREFIX}*.json")) if os.path.isfile(p))


def write_cdi(
    directory: str,
    inventory: Inventory,
    config: Config,
    libraries: dict[str, tuple[str, str]] | None = None,
    dev_root: str = "/dev",
) -> CdiResult:
    """Write this node's specs into ``directory`` (created 0755), remove our stale ones."""
    specs = render_cdi(inventory, config, default_libraries() if libraries is None else libraries, dev_root)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    written: list[str] = []
    unchanged: list[str] = []
    for kind, spec in specs.items():
        path = os.path.join(directory, spec_file_name(kind))
        result = write_if_changed(path, json.dumps(spec, indent=1) + "\n", 0o644)
        (written if result.changed else unchanged).append(path)
    removed = []
    for path in ours(directory):
        if path not in written and path not in unchanged:
            os.replace(path, path + BACKUP_SUFFIX)
            removed.append(path)
    return CdiResult(tuple(written), tuple(unchanged), tuple(removed))


def libraries_in(directory: str) -> dict[str, tuple[str, str]]:
    """kind -> (host, container) library mounts our specs in ``directory`` hold now (what refresh keeps)."""
    found: dict[str, tuple[str, str]] = {}
    for path in ours(directory):
        try:
            with open(path, encoding="utf-8") as handle:
                spec = json.load(handle)
            mount = spec["containerEdits"]["mounts"][0]
            found[spec["kind"].rpartition("/")[2]] = (str(mount["hostPath"]), str(mount["containerPath"]))
        except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
            continue
    return found


def refresh_cdi(config: Config, inventory: Inventory, directories: tuple[str, ...] | None = None) -> list[CdiResult]:
    """Rewrite our specs after a device change in each CDI directory (default: /etc/cdi and
    /var/run/cdi) that holds some; none written where none are."""
    return [
        write_cdi(directory, inventory, config, {**default_libraries(), **libraries_in(directory)})
        for directory in (render.CDI_DIRS if directories is None else directories)
        if ours(directory)
    ]


def install_cdi_note(config: Config, say) -> None:
    """Containers: refresh this node's CDI specs where it has them (a library just installed is then
    the one they mount), else say how to write them where a CDI runtime (Podman) is installed."""
    import shutil

    from .health_check import configured_inventory

    if any(ours(directory) for directory in render.CDI_DIRS):
        for result in refresh_cdi(config, configured_inventory(config)):
            for path in result.written:
                say(f"updated {path} (the node's CDI spec)")
    elif shutil.which("podman"):
        say(f"Podman is installed: `slurm-tpu cdi --output {render.CDI_DIR}` gives containers the job's devices")
