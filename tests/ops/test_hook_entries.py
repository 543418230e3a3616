"""The hooks' Python entry scripts are the template's (slurm_tpu/ops/hook_entries.py), byte for byte."""

from __future__ import annotations

import os
import stat

from slurm_tpu.ops import hook_entries
from slurm_tpu.ops.install import HOOK_FILES, installed_hook_text

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_entry_script_is_current():
    stale = hook_entries.stale(REPO)
    assert not stale, (
        f"not what slurm_tpu/ops/hook_entries.py makes: {stale}; edit the template there, "
        "then run `python -m slurm_tpu.ops.hook_entries`"
    )


def test_every_entry_script_is_shipped_executable_and_runs_its_hook():
    shipped = {name: mode for _, name, mode in HOOK_FILES}
    for entry in hook_entries.ENTRIES:
        path = hook_entries.shipped_path(entry, REPO)
        assert shipped[entry.name] == 0o755 and os.stat(path).st_mode & stat.S_IXUSR, path
        text = hook_entries.render(entry)
        assert text.startswith("#!/usr/bin/python3 -IS\n") and f"from {entry.module} import main\n" in text
        assert text.endswith(f"sys.exit({entry.call})\n")
    assert {e.module for e in hook_entries.ENTRIES} == {
        "slurm_tpu.hooks.prolog",
        "slurm_tpu.hooks.epilog",
        "slurm_tpu.hooks.udev_event",
        "slurm_tpu.hooks.agent",
    }


def test_install_can_still_point_each_at_the_installed_package():
    # install rewrites the one _ROOT line (and names a non-default config after it).
    for entry in hook_entries.ENTRIES:
        text = hook_entries.render(entry)
        installed = installed_hook_text(text, entry.name, "/opt/venv/bin/python3", "/opt/venv/lib/site", "/etc/x.yaml")
        assert "_ROOT = '/opt/venv/lib/site'  # set by slurm-tpu install\n" in installed
        assert "os.environ.setdefault('SLURM_TPU_CONFIG', '/etc/x.yaml')" in installed
        assert installed.startswith("#!/opt/venv/bin/python3 -IS\n")
        # Everything before the imports is the same in every entry (tests and bench run that head alone).
        assert (
            text.split("try:")[0].split('"""')[-1]
            == hook_entries.render(hook_entries.ENTRIES[0]).split("try:")[0].split('"""')[-1]
        )


def test_the_writer_rewrites_a_stale_script(tmp_path):
    for directory in {d for d, _, _ in HOOK_FILES}:
        (tmp_path / directory).mkdir()
    entry = hook_entries.ENTRIES[1]
    path = hook_entries.shipped_path(entry, str(tmp_path))
    assert path in hook_entries.stale(str(tmp_path))
    assert path in hook_entries.write(str(tmp_path))
    assert open(path, encoding="utf-8").read() == hook_entries.render(entry)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o755
    assert path not in hook_entries.stale(str(tmp_path)) and path not in hook_entries.write(str(tmp_path))
