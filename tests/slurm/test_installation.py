"""Where slurm-tpu takes Slurm from (slurm/installation.py), on real processes and real Slurm."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from helpers import run_cli
from slurm_tpu.errors import SlurmCommandError
from slurm_tpu.slurm import installation
from slurm_tpu.slurm.commands import Slurm

SOURCE_BUILD = "/opt/slurm-25.11"


def fake_prefix(root, programs=("scontrol",), sbin=("slurmd",)):
    """A Slurm-shaped prefix whose programs are copies of /bin/true (only their paths matter here)."""
    for sub, names in (("bin", programs), ("sbin", sbin)):
        os.makedirs(root / sub, exist_ok=True)
        for name in names:
            shutil.copy("/bin/true", root / sub / name)
    return root


def test_environment_beats_config_and_the_other_directory_is_the_sibling(tmp_path):
    env_prefix, cfg_prefix = fake_prefix(tmp_path / "env"), fake_prefix(tmp_path / "cfg")
    found = installation.find({installation.BIN_ENV: str(env_prefix / "bin")}, str(cfg_prefix / "bin"))
    assert found.program("scontrol") == f"{env_prefix}/bin/scontrol"
    assert found.program("slurmd") == f"{env_prefix}/sbin/slurmd"
    found = installation.find({}, None, str(cfg_prefix / "sbin"))
    assert found.program("scontrol") == f"{cfg_prefix}/bin/scontrol" and "config" in found.found_by


def test_path_is_for_admin_commands_only(tmp_path):
    prefix = fake_prefix(tmp_path / "p")
    env = {"PATH": f"{prefix}/bin:/usr/bin", "SLURM_CONF": str(tmp_path / "nobody-reads-this.conf")}
    assert installation.find(env).program("scontrol") == f"{prefix}/bin/scontrol"
    assert installation.find(env, use_path=False).dirs == installation.USUAL_DIRS


def test_bad_settings_are_one_clear_line(tmp_path):
    with pytest.raises(SlurmCommandError, match="not an absolute directory"):
        installation.find({installation.BIN_ENV: "opt/slurm/bin"})
    empty = installation.find({installation.BIN_ENV: str(tmp_path)})
    with pytest.raises(SlurmCommandError, match=f"squeue not found in {tmp_path}.*slurm.bin_dir/sbin_dir"):
        empty.program("squeue")


def _wait_for_comm(pid: int, comm: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/comm") as handle:
                if handle.read().strip() == comm:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} never became {comm}")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (runs a process as another user)")
def test_only_roots_daemons_choose_what_root_runs():
    """A user's process named slurmd, reading our slurm.conf, is ignored; root's is used."""
    import tempfile
    from pathlib import Path

    tmp_path = Path(tempfile.mkdtemp(prefix="slurm-tpu-evil-", dir="/tmp"))
    os.chmod(tmp_path, 0o755)
    prefix = fake_prefix(tmp_path / "evil", sbin=())
    shutil.copy("/bin/sleep", prefix / "sbin" / "slurmd")
    conf = str(tmp_path / "slurm.conf")
    open(conf, "w").close()
    env = dict(os.environ, SLURM_CONF=conf)
    users = subprocess.Popen(
        [str(prefix / "sbin" / "slurmd"), "30"], env=env, user="nobody", group="nogroup", extra_groups=[]
    )
    try:
        _wait_for_comm(users.pid, "slurmd")
        assert installation.daemon_for_conf(conf) is None
        roots = subprocess.Popen([str(prefix / "sbin" / "slurmd"), "30"], env=env)
        try:
            _wait_for_comm(roots.pid, "slurmd")
            assert installation.daemon_for_conf(conf) == (roots.pid, str(prefix / "sbin" / "slurmd"))
        finally:
            roots.kill()
            roots.wait()
    finally:
        users.kill()
        users.wait()
        shutil.rmtree(tmp_path)


def _other_release() -> str | None:
    """A Slurm prefix of another release than the tests' (both installed), or None."""
    current = installation.find(use_daemons=False)
    for prefix in ("/usr", SOURCE_BUILD):
        other = installation.from_prefix(prefix)
        if os.path.exists(f"{other.sbin_dir}/slurmd") and other.sbin_dir not in current.dirs:
            return prefix
    return None


@pytest.mark.slurm
def test_client_and_daemons_of_different_releases_are_named_in_one_line(cluster_factory):
    from harness.localcluster import NodeSpec

    other = _other_release()
    if other is None:
        pytest.skip(f"needs both Debian's Slurm and {SOURCE_BUILD} (scripts/build-slurm.sh)")
    cluster = cluster_factory([NodeSpec("n1")])
    ours = installation.version_of(cluster.slurm.program("slurmd"))
    env = {"SLURM_CONF": cluster.slurm_conf, **installation.environment(installation.from_prefix(other))}
    theirs = installation.version_of(installation.from_prefix(other).program("scontrol"), env)
    assert ours and theirs and ours != theirs
    # health takes its config from the cluster's node, its Slurm from the environment: the wrong one.
    done = run_cli(["--config", cluster.node_config("n1"), "health", "--node", "n1"], env=env)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"Slurm client scontrol {theirs}" in done.stderr and f"daemons' Slurm {ours}" in done.stderr
    # Without the override, the running slurmd for that slurm.conf decides: the right release.
    assert Slurm(environ={"SLURM_CONF": cluster.slurm_conf, "PATH": f"{other}/bin"}).install.program(
        "scontrol"
    ) == cluster.slurm.program("scontrol")
