"""Usage metering: the runner adds its counts to the job's usage box; root reads them safely.

The box itself (a per-job tmpfs mounted by the prolog) is exercised on the real
cluster in tests/isolation/test_usage_attacks.py; here it is a private directory.
"""

from __future__ import annotations

import json
import math
import os

import pytest
from runner_support import run_cli

from slurm_tpu.protocol import FormatError
from slurm_tpu.protocol.usage import MAX_BYTES, MAX_INFERENCES, UsageRecord, add_usage, checked, read_record


@pytest.fixture
def box(tmp_path):
    path = tmp_path / "box"
    path.mkdir(mode=0o700)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    yield path, fd
    os.close(fd)


def test_runner_adds_its_inferences_to_the_jobs_record_for_the_leased_tpu(models, tpu_env, box):
    path, fd = box
    env = dict(tpu_env, SLURM_TPU_USAGE_DIR=str(path), SLURM_JOB_ID="4242")
    for count in ("5", "3"):  # two processes of one job, one after the other on one TPU
        r = run_cli(["infer", models["classifier"], models["images"] / "img_00001.png", "-c", count], env)
        assert r.returncode == 0, r.stderr
    record = read_record(fd, "usb-2-1.4", os.getuid())
    assert record.inferences == 8 and record.seconds > 0
    assert os.listdir(path) == ["usb-2-1.4.json"]  # one file per device, no temp files left


def test_cpu_runs_report_nothing(models, clean_env, box):
    path, _ = box
    env = dict(clean_env, SLURM_TPU_USAGE_DIR=str(path), SLURM_JOB_ID="7")
    assert run_cli(["infer", models["classifier"], models["images"] / "img_00001.png"], env).returncode == 0
    assert os.listdir(path) == []


def test_a_job_without_a_box_runs_and_reports_nothing(models, tpu_env, tmp_path):
    env = dict(tpu_env, SLURM_TPU_USAGE_DIR=str(tmp_path / "missing"))
    assert run_cli(["infer", models["classifier"], models["images"] / "img_00001.png"], env).returncode == 0
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("figures", [(1, 0.5), (0, 0.0), (MAX_INFERENCES, 1e9), (3, 2)])
def test_plausible_figures_pass(figures):
    assert checked(*figures) == (figures[0], float(figures[1]))


@pytest.mark.parametrize(
    "figures",
    [
        (-1, 0.5),
        (1, -0.5),
        (1.0, 0.5),
        (True, 0.5),
        (1, True),
        (MAX_INFERENCES + 1, 0.5),
        (10**400, 0.5),
        (1, math.inf),
        (1, math.nan),
        ("5", 0.5),
        (None, 0.5),
        (1, "0.5"),
    ],
)
def test_absurd_figures_are_refused(figures):
    assert checked(*figures) is None


def _write(path, name: str, text: str | bytes) -> None:
    (path / name).write_bytes(text.encode() if isinstance(text, str) else text)


def test_root_reads_only_plausible_regular_files_of_the_jobs_uid(box, tmp_path):
    """A record that is there but not acceptable is refused with one line naming the file and why."""
    path, fd = box
    uid = os.getuid()
    good = {"version": 1, "inferences": 3, "seconds": 0.5, "energy_j": None}
    _write(path, "usb-1-1.json", json.dumps(good))
    assert read_record(fd, "usb-1-1", uid) == UsageRecord("usb-1-1", 3, 0.5)
    # An older runner's energy_j, whatever it says, is ignored: energy is root's (the Epilog reads the devices).
    _write(path, "usb-1-2.json", '{"version": 1, "inferences": 1, "seconds": 1, "energy_j": -2.5}')
    assert read_record(fd, "usb-1-2", uid) == UsageRecord("usb-1-2", 1, 1.0)
    assert read_record(fd, "usb-1-0", uid) is None  # the job left none
    with pytest.raises(FormatError, match=r"^usage record usb-1-1.json belongs to uid \d+, not the job's uid"):
        read_record(fd, "usb-1-1", uid + 1)
    absurd = [
        '{"version": 1, "inferences": 1e400, "seconds": 1}',
        '{"version": 1, "inferences": 1, "seconds": 1e400}',
        '{"version": 1, "inferences": 1, "seconds": NaN}',
        '{"version": 1, "inferences": -4, "seconds": 1}',
        '{"version": 1, "inferences": ' + "9" * 5000 + ', "seconds": 1}',
        '{"version": 2, "inferences": 1, "seconds": 1}',
        "[1, 2]",
        "not json",
        "[" * 100000,
    ]
    for i, text in enumerate(absurd):
        _write(path, f"usb-2-{i}.json", text)
        with pytest.raises(FormatError, match=f"^usage record usb-2-{i}.json(:| is)") as refused:
            read_record(fd, f"usb-2-{i}", uid)
        assert "\n" not in str(refused.value), text
    _write(path, "usb-3-1.json", json.dumps(good).encode() + b" " * MAX_BYTES)  # too big to be ours
    with pytest.raises(FormatError, match="is over 4096 bytes"):
        read_record(fd, "usb-3-1", uid)
    secret = tmp_path / "secret"
    secret.write_text(json.dumps(good))
    os.symlink(secret, path / "usb-3-2.json")  # a link planted to make root read elsewhere
    with pytest.raises(FormatError, match=r"usb-3-2.json is a symbolic link"):
        read_record(fd, "usb-3-2", uid)
    os.mkfifo(path / "usb-3-3.json")  # would block a reader without O_NONBLOCK
    with pytest.raises(FormatError, match=r"usb-3-3.json is not a regular file"):
        read_record(fd, "usb-3-3", uid)
    with pytest.raises(FormatError, match="not a device identity"):
        read_record(fd, "../box/usb-1-1", uid)  # only plain identities name a file


def test_runner_side_refuses_absurd_figures_and_replaces_a_garbage_record(box):
    path, fd = box
    assert not add_usage(str(path), "usb-1-1", -1, 0.5)
    assert not add_usage(str(path), "usb-1-1", 1, math.inf)
    assert not add_usage(str(path), "../../etc/x", 1, 0.5)
    _write(path, "usb-1-1.json", "garbage")
    assert add_usage(str(path), "usb-1-1", 2, 0.25)
    assert add_usage(str(path), "usb-1-1", MAX_INFERENCES, 0.25)  # totals saturate at the bound
    assert read_record(fd, "usb-1-1", os.getuid()) == UsageRecord("usb-1-1", MAX_INFERENCES, 0.5)
