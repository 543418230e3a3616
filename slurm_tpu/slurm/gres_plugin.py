"""The gres/tpu Slurm plugin (slurm_plugin/): where a build for a Slurm release is, and the PluginDir naming it.

With ``gres_tpu.so`` in slurmctld's and slurmd's PluginDir, Slurm hands the prolog and
epilog the job's Edge TPU indices as ``SLURM_JOB_TPUS`` and the hooks skip their
``scontrol show job -d`` query. A plugin must come from the exact Slurm release the
daemons run, so builds (scripts/build-gres-plugin.sh) are kept per release:
``<root>/<version>/gres_tpu.so``. PluginDir is a colon-separated list: Slurm's own plugin
directory first (every other plugin is there), then ours. Not imported by the hooks.
"""

from __future__ import annotations

import os
import re

from ..errors import SlurmCommandError
from .installation import Installation

ROOT_ENV = "SLURM_TPU_GRES_PLUGINS"
DEFAULT_ROOT = "/opt/slurm-tpu-plugins"
PLUGIN_FILE = "gres_tpu.so"
SLURM_OWN_PLUGIN = "select_cons_tres.so"  # always in Slurm's own plugin directory: tells it from others


def root(environ=None) -> str:
    """Where the per-release plugin builds are."""
    return (os.environ if environ is None else environ).get(ROOT_ENV) or DEFAULT_ROOT


def built_for(version: str, environ=None) -> str | None:
    """The directory holding ``gres_tpu.so`` built for Slurm ``version`` (``22.05.8``), or None."""
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        return None
    directory = os.path.join(root(environ), version)
    return directory if os.path.isfile(os.path.join(directory, PLUGIN_FILE)) else None


def in_plugin_dir(slurm_options: dict[str, str]) -> str | None:
    """The directory of slurm.conf's PluginDir (``slurm_options``: lower-case keys) that holds our
    gres_tpu.so, or None."""
    for directory in slurm_options.get("plugindir", "").split(":"):
        if directory.startswith("/") and os.path.isfile(os.path.join(directory, PLUGIN_FILE)):
            return directory
    return None


def slurm_plugin_dir(install: Installation) -> str:
    """Slurm's own plugin directory for ``install`` (where its ``select_cons_tres.so`` is).

    Slurm installs libslurmfull.so into its plugin directory, so it is where the loader
    finds slurmd's (Debian: /usr/lib/<triplet>/slurm-wlm; a source build: <prefix>/lib/slurm);
    the usual layouts under the prefix when ldd cannot say. SlurmCommandError when none is.
    """
    from .spawn import run

    candidates: list[str] = []
    slurmd = install.program("slurmd")
    try:
        for line in run(["/usr/bin/ldd", slurmd], None, timeout=10).splitlines():
            name, _, rest = line.strip().partition(" => ")
            if name.startswith("libslurmfull.so") and rest.startswith("/"):
                candidates.append(os.path.dirname(rest.split(" (", 1)[0]))
    except SlurmCommandError:
        pass
    prefix = os.path.dirname(install.sbin_dir.rstrip("/"))
    candidates += [os.path.join(prefix, "lib", "slurm"), os.path.join(prefix, "lib64", "slurm")]
    candidates += sorted(
        os.path.join(prefix, "lib", triplet, "slurm-wlm")
        for triplet in (os.listdir(os.path.join(prefix, "lib")) if os.path.isdir(os.path.join(prefix, "lib")) else ())
        if "-linux-" in triplet
    )
    for directory in candidates:
        if os.path.isfile(os.path.join(directory, SLURM_OWN_PLUGIN)):
            return directory
    raise SlurmCommandError(
        f"no Slurm plugin directory ({SLURM_OWN_PLUGIN}) found for {slurmd} in {', '.join(candidates)}", slurmd
    )


def plugin_dir_line(slurm_own: str, ours: str) -> str:
    """slurm.conf's PluginDir: Slurm's own directory, then the one with gres_tpu.so."""
    for directory in (slurm_own, ours):
        if ":" in directory or not os.path.isabs(directory):
            raise ValueError(f"PluginDir entry {directory!r} must be an absolute path without ':'")
    return f"PluginDir={slurm_own}:{ours}"
