"""The hooks' Python entry scripts, from one template (``python -m slurm_tpu.ops.hook_entries``).

slurm.conf and the udev rules run small Python programs as root (the Prolog, the Epilog, the
udev hook, the node agent). Each must start fast (``#!/usr/bin/python3 -IS``: no site-packages
scan), find ``slurm_tpu`` beside itself or where ``slurm-tpu install`` wrote it (its ``_ROOT =``
line, see ``install.installed_hook_text``), mark the import time for slurm_tpu/hooks/probe.py
and exit with the hook's status: :data:`TEMPLATE`. The files are committed where
install.HOOK_FILES ships them from: after editing the template or :data:`ENTRIES`, run this
module to rewrite them (tests/ops/test_hook_entries.py fails while one is not current).
"""

from __future__ import annotations

import os
import pathlib
import sys
from typing import NamedTuple

TEMPLATE = '''#!/usr/bin/python3 -IS
"""{summary}

{notes}Thin entry point into {module}. Runs isolated (-I) and without
site-packages (-S) so start-up stays in the milliseconds; site-packages are
added only if slurm_tpu is not next to this file or a config file needs PyYAML.
Generated from slurm_tpu/ops/hook_entries.py (the template of every hook's entry
script): edit it there, then run `python -m slurm_tpu.ops.hook_entries`.
"""
import os
import sys
import time

_WALL = time.time()  # for slurm_tpu.hooks.probe (off unless SLURM_TPU_HOOK_PROFILE is set)

_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
if os.path.isfile(os.path.join(_ROOT, "slurm_tpu", "__init__.py")):
    sys.path.insert(0, _ROOT)
try:
    from slurm_tpu.hooks.probe import Probe

    timing = Probe(os.environ, _WALL)
    from {module} import main
except ImportError:  # installed as a package: look in site-packages too
    import site

    site.main()
    from slurm_tpu.hooks.probe import Probe

    timing = Probe(os.environ, _WALL)
    from {module} import main

timing.mark("imports")
sys.exit({call})
'''


class Entry(NamedTuple):
    """One entry script: its shipped name, its docstring's first line and notes, the hook module, the call."""

    name: str
    summary: str
    notes: str  # "" or whole lines, each ending in a newline, then a blank line
    module: str
    call: str = "main(probe=timing)"


ENTRIES = (
    Entry(
        "slurm-tpu-prolog",
        "Slurm Prolog= (root, on each node at job start): lease the job's accelerators.",
        "The Python hook: slurm.conf names it where no native entry is installed, and the\n"
        "native entry (slurm-tpu-prolog-native) runs it where the node runs no agent.\n\n",
        "slurm_tpu.hooks.prolog",
    ),
    Entry(
        "slurm-tpu-epilog",
        "Slurm Epilog= (root, on each node at job end): release the job's accelerators.",
        "The Python hook: slurm.conf names it where no native entry is installed, and the\n"
        "native entry (slurm-tpu-epilog-native) runs it where the node runs no agent.\n\n",
        "slurm_tpu.hooks.epilog",
    ),
    Entry(
        "slurm-tpu-udev-event",
        "udev RUN+= (root, every add/change/bind/remove of an accelerator): keep slots and leases right.",
        "The same work as `slurm-tpu udev-event`, without click: udev runs this on\n"
        "every device event, two per USB job.\n\n",
        "slurm_tpu.hooks.udev_event",
    ),
    Entry(
        "slurm-tpu-agent",
        "The node's resident slurm-tpu agent (root): runs the hooks' work for hook_client/slurm-tpu-hook-client.",
        "See slurm_tpu.hooks.agent. Environment: SLURM_TPU_CONFIG (default\n"
        "/etc/slurm-tpu/config.yaml), SLURMD_NODENAME. Stop it with SIGTERM; the native\n"
        "entries then run the Python hooks.\n\n",
        "slurm_tpu.hooks.agent",
        "main()",
    ),
)


def render(entry: Entry) -> str:
    """The text of one entry script."""
    return TEMPLATE.format(summary=entry.summary, notes=entry.notes, module=entry.module, call=entry.call)


def shipped_path(entry: Entry, root: str) -> str:
    """Where the repository keeps the entry script: the directory install.HOOK_FILES ships it from."""
    from .install import HOOK_FILES

    [directory] = [directory for directory, name, _ in HOOK_FILES if name == entry.name]
    return os.path.join(root, directory, entry.name)


def stale(root: str) -> list[str]:
    """The entry scripts under the repository ``root`` that differ from the template (or are missing)."""
    from ..files import read_text

    paths = [shipped_path(entry, root) for entry in ENTRIES]
    return [path for entry, path in zip(ENTRIES, paths) if read_text(path) != render(entry)]


def write(root: str) -> list[str]:
    """Rewrite the stale entry scripts (mode 0755); the paths written."""
    written = stale(root)
    for path in written:
        entry = next(e for e in ENTRIES if e.name == os.path.basename(path))
        pathlib.Path(path).write_text(render(entry), encoding="utf-8")
        os.chmod(path, 0o755)
    return written


if __name__ == "__main__":
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not os.path.isfile(os.path.join(checkout, "setup.py")):
        sys.exit(
            f"slurm-tpu: {checkout} is no checkout of slurm-tpu (an installed package has no entry scripts to rewrite)"
        )
    for written_path in write(checkout):
        print(f"wrote {written_path}")
