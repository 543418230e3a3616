"""The job environment file (slurm_tpu.protocol.envfile): what the prolog writes is what the task-prolog prints."""

from __future__ import annotations

import os
import subprocess

from slurm_tpu.config import Config
from slurm_tpu.families import FAMILIES
from slurm_tpu.hooks.settings import HookSettings, apply_families
from slurm_tpu.protocol import envfile
from slurm_tpu.protocol.inventory import KnownDevice
from slurm_tpu.protocol.leases import Lease

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASK_PROLOG = os.path.join(REPO, "prolog", "slurm-tpu-task-prolog")


def settings_with(devices: list[KnownDevice], state_dir: str = "/run/x") -> HookSettings:
    settings = HookSettings(state_dir)
    settings.devices = {d.identity: d for d in devices}
    apply_families(settings, Config())
    return settings


def task_prolog(state_dir: str, job: str) -> str:
    config = os.path.join(state_dir, "config.yaml")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(f"version: 2\nstate_dir: {state_dir}\n")
    done = subprocess.run(
        [TASK_PROLOG],
        env={"PATH": "/usr/bin:/bin", "SLURM_TPU_CONFIG": config, "SLURM_JOB_ID": job},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout


def test_the_task_prolog_prints_every_line_the_prolog_writes(tmp_path):
    devices = [
        KnownDevice("usb-2-1.3", "edgetpu", "usb", ("/dev/bus/usb/002/005",)),
        KnownDevice("pci-0000:02:00.0", "hailo", "pci", ("/dev/hailo0",)),
    ]
    state = tmp_path / "state"
    settings = settings_with(devices, str(state))
    leases = [Lease(identity=d.identity, job_id=12, uid=4321, kind=d.kind) for d in devices]
    written = envfile.render(leases, settings, usage_dir="/run/x/job-usage/12")
    (state / envfile.DIR).mkdir(parents=True)
    (state / envfile.DIR / envfile.file_name(12)).write_text(written)
    # Every leased device's CDI name (slurm-tpu cdi's spec), for `podman run --device`.
    cdi = "export SLURM_TPU_CDI_DEVICES=slurm-tpu.dev/edgetpu=usb-2-1.3,slurm-tpu.dev/hailo=pci-0000:02:00.0\n"
    assert cdi in written
    assert "export SLURM_TPU_DEVICES=usb-2-1.3\n" in written and written.endswith(
        "export SLURM_TPU_USAGE_DIR=/run/x/job-usage/12\n"
    )
    # The reader drops nothing the writer wrote (a variable it did not print would be a job without it).
    assert task_prolog(str(state), "12") == "export EDGETPU_VISIBLE_DEVICES=\n" + written
    # And the file of a job with no device here: every variable of the contract, unset.
    (state / envfile.NO_DEVICES).write_text(envfile.render_unset(settings))
    assert task_prolog(str(state), "13") == "export EDGETPU_VISIBLE_DEVICES=\n" + envfile.render_unset(settings)


def test_every_familys_variable_is_one_the_task_prolog_prints():
    settings = settings_with([])
    names = [v.name for f in FAMILIES for v in f.variables]
    assert [v.name for v in settings.variables] == names
    for line in envfile.render([], settings).splitlines() + envfile.render_unset(settings).splitlines():
        assert line.startswith(envfile.PRINTED), f"the task-prolog would drop {line!r}: name it SLURM_TPU_*"


def test_the_task_prologs_filter_is_the_declared_grammar():
    # prolog/slurm-tpu-task-prolog is sh (no Python per task): its case patterns must be PRINTED.
    with open(TASK_PROLOG, encoding="utf-8") as handle:
        text = handle.read()
    patterns = "|".join(f'"{prefix}"*' for prefix in envfile.PRINTED) + ")"
    assert patterns in text, f"the task-prolog's case patterns are not {patterns}"
    assert f'"$state_dir/{envfile.DIR}/$SLURM_JOB_ID.env"' in text and f'"$state_dir/{envfile.NO_DEVICES}"' in text
