"""Bad input: one clear line on stderr, exit status 2, nothing half-written."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from helpers import run_cli


def assert_one_line_error(result, *words):
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("slurm-tpu: error: "), lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_corrupt_config(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("version: 1\ngres: [broken\n")
    assert_one_line_error(run_cli(["--config", str(config), "detect"], "big_node"), str(config), "line")


def test_unknown_config_key_is_named(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("version: 1\ndevices:\n  isolate_gpu: true\n")
    assert_one_line_error(
        run_cli(["--config", str(config), "gres-conf"], "big_node"), "unknown key 'devices.isolate_gpu'"
    )


def test_unwritable_output_leaves_nothing_half_written(tmp_path):
    target = tmp_path / "no-such-dir" / "gres.conf"
    result = run_cli(["gres-conf", "--node", "n1", "--no-slots", "--output", str(target)], "big_node")
    assert_one_line_error(result, str(target), "cannot write")
    assert not (tmp_path / "no-such-dir").exists()


def test_output_that_is_a_directory(tmp_path):
    result = run_cli(["node-conf", "--no-hardware", "--output", str(tmp_path)], "big_node")
    assert_one_line_error(result, str(tmp_path), "is a directory")


def test_named_slurmd_missing(tmp_path):
    result = run_cli(["node-conf", "--slurmd", str(tmp_path / "slurmd")], "big_node")
    assert_one_line_error(result, str(tmp_path / "slurmd"), "--no-hardware")


def _hide(path: str) -> list[str]:
    """An unshare prefix that hides ``path`` behind an empty file for one command."""
    real = os.path.realpath(path)
    return ["unshare", "-m", "sh", "-c", f'mount --bind /dev/null "{real}" && exec "$0" "$@"']


needs_unshare = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="hiding a file needs root and unshare"
)


@needs_unshare
def test_slurmd_not_installed():
    slurmd = shutil.which("slurmd") or "/usr/sbin/slurmd"
    if not os.path.exists(slurmd):
        result = run_cli(["node-conf"], "big_node")
    else:
        result = run_cli(["node-conf"], "big_node", prefix=_hide(slurmd))
    assert_one_line_error(result, "slurmd not found", "--no-hardware")


@needs_unshare
def test_libudev_missing():
    libudev = subprocess.run(
        ["sh", "-c", "ldconfig -p | awk '/libudev.so.1 /{print $NF; exit}'"], capture_output=True, text=True
    ).stdout.strip()
    assert libudev, "libudev.so.1 is not in the loader cache"
    result = run_cli(["detect"], prefix=_hide(libudev))
    assert_one_line_error(result, "libudev", "libudev1")


def test_check_and_diff_need_output():
    result = run_cli(["gres-conf", "--check"], "big_node")
    assert result.returncode == 2 and "--output" in result.stderr


def test_bad_set_value():
    result = run_cli(["node-conf", "--no-hardware", "--set", "Port"], "big_node")
    assert result.returncode == 2 and "KEY=VALUE" in result.stderr


def test_bad_saved_inventory(tmp_path):
    saved = tmp_path / "inv.json"
    saved.write_text('{"accelerators": [{"identity": "x"}]}')
    assert_one_line_error(run_cli(["gres-conf", "--inventory", str(saved)]), str(saved), "detect --json")
