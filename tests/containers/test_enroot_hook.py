"""The enroot hook (slurm_tpu/hooks/enroot.py, enroot/98-slurm-tpu.sh) on its own: what it writes
into enroot's files for a job, and what it refuses. No enroot, no Slurm: the hook's inputs are
files (the root-written job env file, enroot's $ENROOT_MOUNTS / $ENROOT_ENVIRON) and its
environment, which belongs to the job's user and is treated as hostile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_tpu.hooks import enroot as hook
from slurm_tpu.ops.install import Layout, enroot_hook_text, install, uninstall

JOB = "4242"
USB_ENV = (
    "export SLURM_TPU_DEVICES=usb-2-1.3\n"
    "export SLURM_TPU_EDGETPU_PATHS=usb:/sys/bus/usb/devices/2-1.3\n"
    "unset SLURM_TPU_GPUS\n"
    "export EDGETPU_VISIBLE_DEVICES=/sys/bus/usb/devices/2-1.3\n"
    "unset SLURM_TPU_USAGE_DIR\n"
    "export NOT_OURS=1\n"
)


@pytest.fixture
def node(tmp_path):
    """A node: config naming its state dir, a job env file, a /dev with a USB bus and an apex
    node, a libedgetpu, and enroot's two files for one container."""
    state = tmp_path / "state"
    (state / "jobs").mkdir(parents=True)
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {state}\n")
    dev = tmp_path / "dev"
    (dev / "bus" / "usb" / "002").mkdir(parents=True)
    library = tmp_path / "libedgetpu.so.1"
    library.write_bytes(b"\x7fELF")
    mounts, environ = tmp_path / "mounts", tmp_path / "environ"
    mounts.write_text("")
    environ.write_text("HOME=/home/u\nEDGETPU_VISIBLE_DEVICES=/sys/bus/usb/devices/9-9\nSLURM_TPU_GPUS=0\n")
    settings = {hook.CONFIG: str(config), hook.LIBEDGETPU: str(library), hook.DEV: str(dev)}
    env = {"ENROOT_MOUNTS": str(mounts), "ENROOT_ENVIRON": str(environ), "SLURM_JOB_ID": JOB}
    return tmp_path, settings, env


def write_env(tmp_path: Path, text: str, name: str = f"{JOB}.env") -> Path:
    path = tmp_path / "state" / "jobs" / name
    path.write_text(text)
    os.chmod(path, 0o644)
    return path


def environ_of(env) -> dict[str, str]:
    return dict(line.split("=", 1) for line in Path(env["ENROOT_ENVIRON"]).read_text().splitlines())


def test_usb_job_gets_the_bus_directory_the_library_and_its_variables(node):
    tmp_path, settings, env = node
    write_env(tmp_path, USB_ENV)
    assert hook.main(settings, env) == 0
    assert Path(env["ENROOT_MOUNTS"]).read_text().splitlines() == [
        f"{tmp_path}/dev/bus/usb /dev/bus/usb none x-create=dir,rbind,nosuid,noexec,private",
        f"{tmp_path}/libedgetpu.so.1 {hook.container_libedgetpu()} none x-create=file,bind,ro,nosuid,nodev,private",
    ]
    seen = environ_of(env)
    assert seen["EDGETPU_VISIBLE_DEVICES"] == "/sys/bus/usb/devices/2-1.3"  # the shell's 9-9 replaced
    assert seen["SLURM_TPU_DEVICES"] == "usb-2-1.3"
    assert seen["SLURM_TPU_GPUS"] == "" and seen["SLURM_TPU_USAGE_DIR"] == ""  # unset: written empty
    assert seen["HOME"] == "/home/u" and "NOT_OURS" not in seen  # others kept; a stray line never passes


def test_the_library_goes_where_corals_package_puts_it():
    assert hook.container_libedgetpu("x86_64-linux-gnu") == "/usr/lib/x86_64-linux-gnu/libedgetpu.so.1"
    assert hook.container_libedgetpu("") == "/usr/lib/libedgetpu.so.1"


def test_pcie_job_gets_its_apex_node_under_the_containers_dev(node):
    tmp_path, settings, env = node
    apex = tmp_path / "dev" / "apex_1"
    subprocess.run(["mknod", str(apex), "c", "1", "3"], check=True) if os.geteuid() == 0 else pytest.skip("mknod")
    write_env(
        tmp_path,
        f"export SLURM_TPU_DEVICES=pci-0000:01:00.0\nexport SLURM_TPU_EDGETPU_PATHS=pci:{apex}\n"
        f"export EDGETPU_VISIBLE_DEVICES=pci:{apex}\n",
    )
    assert hook.main(settings, env) == 0
    assert f"{apex} /dev/apex_1 none x-create=file,bind,nosuid,noexec,private" in Path(env["ENROOT_MOUNTS"]).read_text()
    seen = environ_of(env)
    assert seen["EDGETPU_VISIBLE_DEVICES"] == "pci:/dev/apex_1" and seen["SLURM_TPU_EDGETPU_PATHS"] == "pci:/dev/apex_1"


@pytest.mark.parametrize(
    "paths",
    ["pci:/etc/shadow", "pci:{dev}/../apex_0", "pci:{dev}/apex_0x", "usb:/sys/bus/usb/devices/3-1"],
    ids=["outside-dev", "dotdot", "not-apex", "usb-of-another-identity"],
)
def test_a_device_path_the_suite_never_writes_is_refused(node, paths, capsys):
    tmp_path, settings, env = node
    identity = "usb-2-1.3" if paths.startswith("usb") else "pci-0000:01:00.0"
    write_env(
        tmp_path,
        f"export SLURM_TPU_DEVICES={identity}\nexport SLURM_TPU_EDGETPU_PATHS={paths.format(dev=tmp_path / 'dev')}\n",
    )
    assert hook.main(settings, env) == 1
    assert capsys.readouterr().err.startswith("slurm-tpu enroot hook: ")
    assert Path(env["ENROOT_MOUNTS"]).read_text() == ""  # nothing bound: enroot stops the container


@pytest.mark.parametrize("job", ["", "12;rm -rf /", "../4242", "$(id)", "4242 ", "9" * 30])
def test_a_job_id_that_is_not_one_gets_no_device(node, job):
    tmp_path, settings, env = node
    write_env(tmp_path, USB_ENV)
    write_env(tmp_path, "export EDGETPU_VISIBLE_DEVICES=\nunset SLURM_TPU_DEVICES\n", name="../no-devices.env")
    assert hook.main(settings, {**env, "SLURM_JOB_ID": job}) == 0
    assert "/dev/bus/usb" not in Path(env["ENROOT_MOUNTS"]).read_text()
    assert environ_of(env)["EDGETPU_VISIBLE_DEVICES"] == ""


def test_the_jobs_environment_cannot_choose_the_config(node, tmp_path):
    """SLURM_TPU_CONFIG (or any variable) in the job's environment: the hook reads the config
    install wrote into it, so a user's own state dir with a forged env file is never read."""
    tmp, settings, env = node
    forged = tmp / "forged"
    (forged / "jobs").mkdir(parents=True)
    (forged / "jobs" / f"{JOB}.env").write_text(USB_ENV)
    (tmp / "mine.yaml").write_text(f"state_dir: {forged}\n")
    assert hook.main(settings, {**env, "SLURM_TPU_CONFIG": str(tmp / "mine.yaml")}) == 0
    assert "/dev/bus/usb" not in Path(env["ENROOT_MOUNTS"]).read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (files owned by another user)")
def test_an_env_file_a_user_could_have_written_is_refused(node, capsys):
    tmp_path, settings, env = node
    path = write_env(tmp_path, USB_ENV)
    os.chown(path, 1, 1)  # daemon: not root
    assert hook.main(settings, env) == 1
    assert "not a regular file written by root" in capsys.readouterr().err
    os.chown(path, 0, 0)
    os.chmod(path, 0o666)
    assert hook.main(settings, env) == 1


def test_a_linked_env_file_is_not_followed(node, capsys):
    tmp_path, settings, env = node
    target = tmp_path / "elsewhere.env"
    target.write_text(USB_ENV)
    (tmp_path / "state" / "jobs" / f"{JOB}.env").symlink_to(target)
    assert hook.main(settings, env) == 0  # O_NOFOLLOW: no such file, so no device (no-devices.env)
    assert "/dev/bus/usb" not in Path(env["ENROOT_MOUNTS"]).read_text()


def test_not_run_by_enroot_is_one_line(node, capsys):
    _, settings, env = node
    assert hook.main(settings, {**env, "ENROOT_MOUNTS": "relative"}) == 1
    assert capsys.readouterr().err.count("\n") == 1


def test_the_shipped_entry_runs_with_its_settings_and_install_writes_them(node, tmp_path):
    tmp, settings, env = node
    write_env(tmp, USB_ENV)
    text = enroot_hook_text(
        sys.executable,
        str(Path(hook.__file__).parents[2]),
        settings[hook.CONFIG],
        settings[hook.LIBEDGETPU],
        settings[hook.DEV],
    )
    entry = tmp / hook.HOOK_NAME
    entry.write_text(text)
    entry.chmod(0o755)
    assert text.startswith(f"#!{sys.executable} -IS\n") and "# set by slurm-tpu install" in text
    done = subprocess.run([str(entry)], env={**env, "SLURM_TPU_CONFIG": "/nonexistent"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "/dev/bus/usb" in Path(env["ENROOT_MOUNTS"]).read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="install needs root")
def test_install_puts_the_hook_into_enroots_hooks_dir_and_uninstall_takes_it_away(tmp_path):
    enroot_dir = tmp_path / "etc" / "enroot"
    (enroot_dir / "hooks.d").mkdir(parents=True)
    layout = Layout(str(tmp_path / "usr"), str(tmp_path / "etc"), str(tmp_path / "lib"))
    from slurm_tpu.config import Config

    install(layout, Config(), str(tmp_path / "slurm.conf"), say=lambda line: None)
    installed = enroot_dir / "hooks.d" / hook.HOOK_NAME
    assert os.access(installed, os.X_OK)
    text = installed.read_text()
    assert repr(layout.config_file) in text and repr(str(tmp_path / "lib" / "libedgetpu.so.1")) in text
    uninstall(layout, say=lambda line: None)
    assert not installed.exists() and (enroot_dir / "hooks.d").is_dir()  # enroot's directory stays


def test_no_enroot_no_hook(tmp_path):
    assert Layout(str(tmp_path / "usr"), str(tmp_path / "etc")).enroot_hook is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod)")
def test_hailo_card_gets_its_dev_hailo_node_found_through_sysfs(node):
    tmp_path, settings, env = node
    sysfs = tmp_path / "sys" / "class" / "hailo_chardev"
    for name, address in (("hailo0", "0000:04:00.0"), ("hailo1", "0000:03:00.0")):
        (sysfs / name).mkdir(parents=True)
        (sysfs / name / "board_location").write_text(address + "\n")
        subprocess.run(["mknod", str(tmp_path / "dev" / name), "c", "1", "3"], check=True)
    settings = {**settings, hook.SYS: str(tmp_path / "sys")}
    write_env(tmp_path, "export EDGETPU_VISIBLE_DEVICES=\nexport SLURM_TPU_HAILO_DEVICES=0000:03:00.0\n")
    assert hook.main(settings, env) == 0
    lines = Path(env["ENROOT_MOUNTS"]).read_text().splitlines()
    assert f"{tmp_path}/dev/hailo1 /dev/hailo1 none x-create=file,bind,nosuid,noexec,private" in lines
    assert not any("hailo0" in line for line in lines)  # the other card stays out
    assert environ_of(env)["SLURM_TPU_HAILO_DEVICES"] == "0000:03:00.0"
    for bad in ("0000:03:00.0/../x", "0000:09:00.0"):  # not an address; an address with no node
        Path(env["ENROOT_MOUNTS"]).write_text("")
        write_env(tmp_path, f"export SLURM_TPU_HAILO_DEVICES={bad}\n")
        assert hook.main(settings, env) == 1
        assert Path(env["ENROOT_MOUNTS"]).read_text() == ""
