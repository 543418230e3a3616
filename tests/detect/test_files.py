"""Managed blocks and atomic writes of generated files."""

from __future__ import annotations

import os

import pytest

from slurm_tpu.errors import OutputError
from slurm_tpu.files import BACKUP_SUFFIX, merge_block, write_if_changed

ADMIN = "# admin's own lines\nNodeName=other Name=gpu File=/dev/nvidia0\n"


def test_block_is_appended_then_replaced_and_other_lines_kept():
    once = merge_block(ADMIN, "gres", "n1", "NodeName=n1 Name=tpu File=/dev/slurm-tpu/usb-1-1\n")
    assert once.startswith(ADMIN)
    assert "# BEGIN slurm-tpu gres n1 " in once and once.endswith("# END slurm-tpu gres n1\n")
    with_n2 = merge_block(once, "gres", "n2", "NodeName=n2 Name=tpu File=/dev/slurm-tpu/usb-2-1\n")
    twice = merge_block(with_n2, "gres", "n1", "NodeName=n1 Name=tpu File=/dev/slurm-tpu/usb-9-9\n")
    assert "usb-1-1" not in twice and "usb-9-9" in twice and "usb-2-1" in twice
    assert twice.startswith(ADMIN)
    assert merge_block(twice, "gres", "n1", "NodeName=n1 Name=tpu File=/dev/slurm-tpu/usb-9-9\n") == twice


def test_broken_block_is_refused_with_its_line():
    broken = ADMIN + "# BEGIN slurm-tpu gres n1 (generated)\nNodeName=n1 Name=tpu\n"
    with pytest.raises(OutputError, match=r"gres.conf line 3: .* has no '# END slurm-tpu gres n1' line"):
        merge_block(broken, "gres", "n1", "x\n", path="gres.conf")


def test_write_is_atomic_keeps_backup_and_skips_unchanged(tmp_path):
    path = tmp_path / "gres.conf"
    path.write_text("old\n")
    result = write_if_changed(str(path), "new\n")
    assert result.changed and path.read_text() == "new\n"
    assert (tmp_path / ("gres.conf" + BACKUP_SUFFIX)).read_text() == "old\n"
    before = os.stat(path)
    again = write_if_changed(str(path), "new\n")
    assert not again.changed and os.stat(path).st_mtime_ns == before.st_mtime_ns
    assert sorted(os.listdir(tmp_path)) == ["gres.conf", "gres.conf" + BACKUP_SUFFIX]


def test_unwritable_directory_leaves_the_old_file(tmp_path):
    path = tmp_path / "gres.conf"
    path.write_text("old\n")
    os.chmod(tmp_path, 0o555)
    try:
        # root ignores mode bits: use a missing directory
        target = str(tmp_path / "missing-dir" / "gres.conf") if os.access(tmp_path, os.W_OK) else str(path)
        with pytest.raises(OutputError, match=r"cannot write .*old file is unchanged"):
            write_if_changed(target, "new\n")
    finally:
        os.chmod(tmp_path, 0o755)
    assert path.read_text() == "old\n"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".slurm-tpu.")]
