"""Hooks driven by their environment, without Slurm: snapshot, task-prolog, udev identities."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from slurm_tpu.access import node_inventory
from slurm_tpu.hooks import settings as hook_settings
from slurm_tpu.hooks.udev_event import identity_for
from slurm_tpu.protocol import envfile, hooks_snapshot

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the state directory must be root-owned")

GRES = "NodeName=n1 Name=tpu Type=edgetpu_usb File={slots}/usb-2-1.3\n"
SLURM = "NodeName=n1 CPUs=2 Gres=tpu:edgetpu_usb:1\n"
INVENTORY = {
    "online_cpus": "0-1",
    "accelerators": [
        {
            "identity": "usb-2-1.3",
            "kind": "edgetpu",
            "bus": "usb",
            "device_nodes": ["/dev/bus/usb/002/005"],
            "usable": True,
        }
    ],
}


@pytest.fixture
def node(tmp_path):
    os.chmod(tmp_path, 0o755)
    state = tmp_path / "state"
    config = tmp_path / "config.yaml"
    config.write_text(
        f"version: 1\nstate_dir: '{state}'  # quoted, with a comment\n"
        f"devices:\n  slot_dir: {tmp_path}/slots\nslurm:\n  bin_dir: {tmp_path}/bin\n"
    )
    (tmp_path / "slurm.conf").write_text(SLURM)
    (tmp_path / "gres.conf").write_text(GRES.format(slots=tmp_path / "slots"))
    node_inventory.write_state_inventory(str(state), INVENTORY)
    env = {"SLURM_TPU_CONFIG": str(config), "SLURM_CONF": str(tmp_path / "slurm.conf"), "SLURMD_NODENAME": "n1"}
    os.makedirs(tmp_path / "bin")
    shutil.copy("/bin/true", tmp_path / "bin" / "scontrol")  # only its path matters to the snapshot
    return tmp_path, env


@needs_root
def test_snapshot_is_used_until_a_source_changes(node):
    tmp_path, env = node
    first = hook_settings.load(env, "n1")
    snapshot = tmp_path / "state" / hooks_snapshot.FILE
    assert snapshot.exists()
    assert first.index == {"tpu": [("edgetpu_usb", f"{tmp_path}/slots/usb-2-1.3")]}
    assert first.values == {
        "usb-2-1.3": {
            "SLURM_TPU_DEVICES": "usb-2-1.3",
            "SLURM_TPU_EDGETPU_PATHS": "usb:/sys/bus/usb/devices/2-1.3",
            "EDGETPU_VISIBLE_DEVICES": "/sys/bus/usb/devices/2-1.3",
        }
    }
    # What the fast path reads is exactly what the slow path built (one writer, one reader).
    again = hook_settings.load(env, "n1")
    assert hooks_snapshot.format_snapshot(again) == hooks_snapshot.format_snapshot(first)
    assert again.values == first.values
    # Every registered family, in registry order (other families' own tests check theirs).
    from slurm_tpu.families import FAMILIES

    assert list(again.families) == [f.kind for f in FAMILIES]
    assert [(v.name, v.kind, v.unset_when_empty, v.never_unset) for v in again.variables][:4] == [
        ("SLURM_TPU_DEVICES", "edgetpu", False, False),
        ("SLURM_TPU_EDGETPU_PATHS", "edgetpu", False, False),
        ("EDGETPU_VISIBLE_DEVICES", "edgetpu", False, True),
        ("SLURM_TPU_GPUS", "gpu", True, False),
    ]
    assert {k: (p.gres_name, p.leased, p.slot) for k, p in again.families.items() if k in ("edgetpu", "gpu")} == {
        "edgetpu": ("tpu", True, True),
        "gpu": ("gpu", False, False),
    }
    # Written with the snapshot: what the task-prolog prints for a job with no device here.
    # libedgetpu reads an unset EDGETPU_VISIBLE_DEVICES as "every device": it is exported empty.
    unset = (tmp_path / "state" / envfile.NO_DEVICES).read_text()
    assert (
        unset
        == "".join(
            f"export {v.name}=\n" if v.name == "EDGETPU_VISIBLE_DEVICES" else f"unset {v.name}\n"
            for v in again.variables
        )
        + "unset SLURM_TPU_CDI_DEVICES\nunset SLURM_TPU_USAGE_DIR\n"
    )
    assert unset.startswith(
        "unset SLURM_TPU_DEVICES\nunset SLURM_TPU_EDGETPU_PATHS\nexport EDGETPU_VISIBLE_DEVICES=\n"
        "unset SLURM_TPU_GPUS\n"
    )
    # A snapshot that lies is believed while the sources are unchanged (proves it is read)...
    snapshot.write_text(snapshot.read_text().replace("edgetpu_usb", "edgetpu_fake"))
    assert hook_settings.load(env, "n1").index["tpu"][0][0] == "edgetpu_fake"
    # ...and rebuilt as soon as one changes (here gres.conf gains a line).
    with open(tmp_path / "gres.conf", "a", encoding="utf-8") as handle:
        handle.write("NodeName=n2 Name=tpu Type=edgetpu_pci File=/dev/x\n")
    assert hook_settings.load(env, "n1").index["tpu"][0][0] == "edgetpu_usb"
    # Another node name never uses n1's snapshot.
    assert hook_settings.load(env, "n9").index == {}


def task_prolog(env):
    return subprocess.run(
        [os.path.join(REPO, "prolog", "slurm-tpu-task-prolog")], env=env, capture_output=True, text=True, timeout=30
    )


def test_task_prolog_prints_the_jobs_file_or_unsets(tmp_path):
    state = tmp_path / "st ate"
    (state / "jobs").mkdir(parents=True)
    (state / "jobs" / "12.env").write_text(
        "export SLURM_TPU_DEVICES=usb-2-1.3\nexport PATH=/evil\n"
        "export SLURM_TPU_EDGETPU_PATHS=usb:/sys/bus/usb/devices/2-1.3\n"
        "export EDGETPU_VISIBLE_DEVICES=/sys/bus/usb/devices/2-1.3\n"
        "export EDGETPU_VISIBLE_DEVICESX=/evil\nunset EDGETPU_VISIBLE_DEVICES\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text(f'version: 1\nstate_dir: "{state}"\n')
    base = {"SLURM_TPU_CONFIG": str(config), "PATH": "/usr/bin:/bin"}
    done = task_prolog({**base, "SLURM_JOB_ID": "12"})
    assert done.returncode == 0
    # EDGETPU_VISIBLE_DEVICES empty first, whatever follows; the job's own file overrides it.
    assert done.stdout == (
        "export EDGETPU_VISIBLE_DEVICES=\n"
        "export SLURM_TPU_DEVICES=usb-2-1.3\n"
        "export SLURM_TPU_EDGETPU_PATHS=usb:/sys/bus/usb/devices/2-1.3\n"
        "export EDGETPU_VISIBLE_DEVICES=/sys/bus/usb/devices/2-1.3\n"
    )
    # A job with no file here, before the prolog's slow path wrote no-devices.env: libedgetpu
    # shows it no Edge TPU (the user's own EDGETPU_VISIBLE_DEVICES is overwritten)...
    assert task_prolog({**base, "SLURM_JOB_ID": "13", "EDGETPU_VISIBLE_DEVICES": "/dev/apex_0"}).stdout == (
        "export EDGETPU_VISIBLE_DEVICES=\n"
    )
    # ...then no-devices.env unsets every variable of the contract but that one (envfile.render_unset,
    # as _write_snapshot writes it).
    from slurm_tpu.config import Config

    settings = hook_settings.HookSettings(str(state))
    hook_settings.apply_families(settings, Config())
    (state / envfile.NO_DEVICES).write_text(envfile.render_unset(settings))
    unset = envfile.render_unset(settings)
    assert unset.startswith(
        "unset SLURM_TPU_DEVICES\nunset SLURM_TPU_EDGETPU_PATHS\nexport EDGETPU_VISIBLE_DEVICES=\n"
        "unset SLURM_TPU_GPUS\n"
    )
    assert unset.endswith("unset SLURM_TPU_USAGE_DIR\n")
    for job in ("13", "12/../12", "12;id", ""):
        assert task_prolog({**base, "SLURM_JOB_ID": job}).stdout == "export EDGETPU_VISIBLE_DEVICES=\n" + unset
    os.symlink(state / "jobs" / "12.env", state / "jobs" / "14.env")
    assert task_prolog({**base, "SLURM_JOB_ID": "14"}).stdout == "export EDGETPU_VISIBLE_DEVICES=\n" + unset


@pytest.mark.parametrize(
    "env, identity",
    [
        (
            {"SUBSYSTEM": "usb", "DEVTYPE": "usb_device", "DEVPATH": "/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1.3"},
            "usb-2-1.3",
        ),
        ({"SUBSYSTEM": "usb", "DEVTYPE": "usb_interface", "DEVPATH": "/devices/x/usb2/2-1/2-1.3/2-1.3:1.0"}, None),
        (
            {"SUBSYSTEM": "apex", "DEVPATH": "/devices/pci0000:00/0000:00:1c.0/0000:03:00.0/apex/apex_0"},
            "pci-0000:03:00.0",
        ),
        (
            {"SUBSYSTEM": "drm", "DEVPATH": "/devices/pci0000:00/0000:00:03.1/0000:0a:00.0/drm/renderD128"},
            "pci-0000:0a:00.0",
        ),
        ({"SUBSYSTEM": "usb", "DEVPATH": "/devices/x/usb2/2-1/..;rm -rf"}, None),
        ({"SUBSYSTEM": "input", "DEVPATH": "/devices/x/input/input3"}, None),
    ],
)
def test_udev_identity(env, identity):
    from slurm_tpu.config import Config

    settings = hook_settings.HookSettings("/run/x")
    hook_settings.apply_families(settings, Config())
    assert identity_for(env, settings.udev) == identity
