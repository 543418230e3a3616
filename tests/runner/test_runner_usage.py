"""Usage metering: the runner reports inferences per leased device; root collects safely."""

from __future__ import annotations

import json
import os
import stat

import pytest

from runner_support import run_cli
from slurm_tpu.usage import UsageRecord, collect_usage, ensure_usage_dir, write_usage



@pytest.fixture
def drop_dir(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    fd = os.open(state, os.O_RDONLY | os.O_DIRECTORY)
    usage_fd = ensure_usage_dir(fd)
    os.close(fd)
    yield state / "usage", usage_fd
    os.close(usage_fd)


def test_drop_directory_is_sticky_and_unlistable(drop_dir):
    path, _ = drop_dir
    info = os.stat(path)
    assert stat.S_IMODE(info.st_mode) == 0o1733 and info.st_uid == 0


def test_runner_reports_inferences_on_the_leased_tpu(models, tpu_env, drop_dir):
    path, fd = drop_dir
    env = dict(tpu_env, SLURM_TPU_USAGE_DIR=str(path), SLURM_JOB_ID="4242")


    r = run_cli(["infer", models["classifier"], models["images"] / "img_00001.png", "-c", "5"], env)
    assert r.returncode == 0, r.stderr
    (record,) = collect_usage(fd, 4242, os.getuid())
    assert record.identity == "usb-2-1.4" and record.inferences == 5 and record.seconds > 0
    assert os.listdir(path) == []  # collected files are removed


def test_cpu_runs_and_jobs_without_a_drop_directory_report_nothing(models, clean_env, drop_dir):
    path, _ = drop_dir


    env = dict(clean_env, SLURM_TPU_USAGE_DIR=str(path), SLURM_JOB_ID="7")
    assert run_cli(["infer", models["classifier"], models["images"] / "img_00001.png"], env).returncode == 0
    assert os.listdir(path) == []


def test_collector_ignores_other_jobs_other_owners_symlinks_and_garbage(drop_dir, tmp_path):
    path, fd = drop_dir
    good = UsageRecord(9, "usb-1-1", 3, 0.5)
    assert write_usage(str(path), good)
    (path / "9.usb-1-2.111").write_text(json.dumps({"inferences": 1, "seconds": 1.0}))
    os.chown(path / "9.usb-1-2.111", 12345, 12345)  # someone else's file for job 9
    secret = tmp_path / "secret"
    secret.write_text('{"inferences": 99, "seconds": 9}')
    os.symlink(secret, path / "9.usb-1-3.222")  # a link planted to make root read elsewhere
    (path / "9.usb-1-4.333").write_text("not json")
    (path / "10.usb-1-1.444").write_text(json.dumps({"inferences": 7, "seconds": 1.0}))
    assert collect_usage(fd, 9, os.getuid()) == [good]
    assert sorted(os.listdir(path)) == ["10.usb-1-1.444"]  # job 9's files are gone, job 10's kept
    assert secret.read_text() == '{"inferences": 99, "seconds": 9}'
