"""Batch mode: sharding over array tasks, resume after SIGKILL, formats, progress."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from runner_support import run_cli

from harness.modelgen import images
from slurm_tpu.runner.errors import InputError, UsageError
from slurm_tpu.runner.inputs import expand_output_pattern, list_inputs, shard, shard_from_environment
from slurm_tpu.runner.results import Layout, ResultWriter
from slurm_tpu.runner.tasks import TaskOptions
from slurm_tpu.runner.tasks.classify import Classify
from slurm_tpu.runner.tasks.detect import Detect


def _keys(path: Path) -> list[str]:
    return [json.loads(line)["input"] for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def many_images(tmp_path_factory) -> Path:
    """400 small PNGs: enough for a MobileNet run to be killed half-way."""
    out = tmp_path_factory.mktemp("many")
    from PIL import Image

    for i in range(400):
        Image.fromarray(images.bright_region_image(i % 9, 48, seed=i)).save(out / f"im_{i:04d}.png")
    return out


def test_array_tasks_cover_every_input_exactly_once(models, clean_env, tmp_path):
    # --array=5-7: IDs 5, 6, 7; SLURM_ARRAY_TASK_MIN=5, COUNT=3.
    outputs = []
    for task in (5, 6, 7):
        env = dict(
            clean_env,
            SLURM_ARRAY_TASK_ID=str(task),
            SLURM_ARRAY_TASK_COUNT="3",
            SLURM_ARRAY_TASK_MIN="5",
            SLURM_ARRAY_TASK_MAX="7",
            SLURM_ARRAY_JOB_ID="99",
        )
        r = run_cli(["infer", models["classifier"], models["images"], "-o", tmp_path / "out_%A_%a.jsonl"], env)
        assert r.returncode == 0, r.stderr
        outputs.append(tmp_path / f"out_99_{task}.jsonl")
    shares = [_keys(p) for p in outputs]
    everything = [str(p) for p in sorted(models["images"].glob("*.png"))]
    assert sorted(k for share in shares for k in share) == everything
    assert all(share for share in shares)


@pytest.mark.parametrize("count", [1, 2, 3, 7, 25])
def test_shard_partitions(count):
    items = list(range(23))
    shares = [shard(items, i, count) for i in range(count)]
    assert sorted(x for s in shares for x in s) == items
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_shard_from_environment():
    env = {
        "SLURM_ARRAY_TASK_ID": "8",
        "SLURM_ARRAY_TASK_COUNT": "4",
        "SLURM_ARRAY_TASK_MIN": "2",
        "SLURM_ARRAY_TASK_STEP": "2",
    }  # --array=2-8:2
    assert shard_from_environment(env) == (3, 4)
    assert shard_from_environment({}) is None
    with pytest.raises(UsageError, match="--shard-index"):  # --array=1,4,9: not a range
        shard_from_environment({"SLURM_ARRAY_TASK_ID": "9", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "1"})
    with pytest.raises(UsageError, match="step 0"):  # a step of 0 (a forged environment): one line, not a traceback
        shard_from_environment(
            {
                "SLURM_ARRAY_TASK_ID": "3",
                "SLURM_ARRAY_TASK_COUNT": "2",
                "SLURM_ARRAY_TASK_MIN": "1",
                "SLURM_ARRAY_TASK_STEP": "0",
            }
        )


def test_explicit_shard_flags(models, clean_env, tmp_path):
    r = run_cli(
        [
            "infer",
            models["classifier"],
            models["images"],
            "-o",
            tmp_path / "s.jsonl",
            "--shard-index",
            "1",
            "--shard-count",
            "4",
        ],
        clean_env,
    )
    assert r.returncode == 0, r.stderr
    everything = [str(p) for p in sorted(models["images"].glob("*.png"))]
    assert _keys(tmp_path / "s.jsonl") == everything[1::4]


def test_output_pattern():
    assert (
        expand_output_pattern("r_%A_%a_%%.jsonl", {"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3"})
        == "r_7_3_%.jsonl"
    )


def _batch_cmd(models, inputs, out) -> list[str]:
    return [
        sys.executable,
        "-c",
        "from slurm_tpu.cli import run; run()",
        "infer",
        str(models["mobilenet"]),
        str(inputs),
        "-o",
        str(out),
        "-k",
        "3",
        "--labels",
        str(models["mobilenet_labels"]),
    ]


def test_killed_run_resumes_to_the_same_file(models, clean_env, many_images, tmp_path):
    reference, resumed = tmp_path / "reference.jsonl", tmp_path / "resumed.jsonl"
    subprocess.run(
        _batch_cmd(models, many_images, reference), env=clean_env, check=True, capture_output=True, timeout=300
    )
    proc = subprocess.Popen(
        _batch_cmd(models, many_images, resumed), env=clean_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # kill once a good part, not all, is written
        if resumed.exists() and resumed.stat().st_size > 0 and resumed.read_bytes().count(b"\n") >= 120:
            break
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = resumed.read_bytes().count(b"\n")
    assert 0 < partial < 400, "the run should have been killed half-way"
    r = subprocess.run(
        _batch_cmd(models, many_images, resumed), env=clean_env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert resumed.read_bytes() == reference.read_bytes()
    assert "400/400" not in r.stderr  # the restart only did the rest


def test_torn_last_line_is_cut_and_redone(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"input":"a","classes":[]}\n{"input":"b","classes":[]}\n{"input":"c","cla')
    with ResultWriter(str(path), Layout("jsonl", Classify(), TaskOptions())) as writer:
        assert writer.done == {"a", "b"}
        writer.write({"input": "c", "classes": []})
    assert path.read_text().splitlines()[2] == '{"input":"c","classes":[]}'
    assert len(path.read_text().splitlines()) == 3


def test_csv_resume_redoes_the_last_input_whole(tmp_path):
    """Detection CSV has a row per object: a kill between rows of one input must not
    leave that input counted as done with objects missing."""
    path = tmp_path / "r.csv"
    header = "input,id,label,score,xmin,ymin,xmax,ymax,error\n"
    a = "a,0,red,0.9,1,2,3,4,\n"
    b_first_row = "b,1,green,0.8,5,6,7,8,\n"  # b had two objects; the second row was lost
    path.write_text(header + a + b_first_row)
    b_rows = [
        {"id": 1, "label": "green", "score": 0.8, "bbox": [5, 6, 7, 8]},
        {"id": 2, "label": "blue", "score": 0.7, "bbox": [9, 9, 9, 9]},
    ]
    with ResultWriter(str(path), Layout("csv", Detect(), TaskOptions())) as writer:
        assert writer.done == {"a"}
        writer.write({"input": "b", "objects": b_rows})
    assert path.read_text() == header + a + b_first_row + "b,2,blue,0.7,9,9,9,9,\n"


def test_one_writer_per_results_file(tmp_path):
    path = str(tmp_path / "r.jsonl")
    layout = Layout("jsonl", Classify(), TaskOptions())
    with ResultWriter(path, layout), pytest.raises(InputError, match=r"another process .* %t"):
        ResultWriter(path, layout)
    ResultWriter(path, layout).close()  # free again once the first is closed


def test_resume_skips_inputs_already_done(models, clean_env, tmp_path):
    out = tmp_path / "r.jsonl"
    assert run_cli(["infer", models["classifier"], models["images"], "-o", out], clean_env).returncode == 0
    first = out.read_text()
    r = run_cli(["infer", models["classifier"], models["images"], "-o", out, "--progress-interval", "0"], clean_env)
    assert r.returncode == 0 and out.read_text() == first
    assert "slurm-tpu: done: 0/0 inputs (18 already done)" in r.stderr


def test_csv_results_and_progress_lines(models, clean_env, tmp_path):
    out = tmp_path / "r.csv"
    r = run_cli(
        [
            "infer",
            models["classifier"],
            str(models["images"] / "*.png"),
            "-o",
            out,
            "-k",
            "2",
            "--labels",
            models["classifier_labels"],
            "--progress-interval",
            "0",
        ],
        clean_env,
    )
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == ["input", "label1", "score1", "label2", "score2", "error"]
    expected = dict(line.split(",") for line in (models["images"] / "expected.csv").read_text().splitlines())
    assert len(rows) == len(expected)
    for row in rows:
        assert row["label1"] == expected[Path(row["input"]).name]
    assert "slurm-tpu: progress: " in r.stderr and "slurm-tpu: done: 18/18 inputs" in r.stderr


def test_list_file_npy_inputs_raw_outputs_and_bad_inputs(models, clean_env, tmp_path):
    pixels = images.bright_region_image(6, 24, seed=1)
    np.save(tmp_path / "u8.npy", pixels)  # no batch dimension: accepted
    np.save(tmp_path / "f32.npy", pixels[np.newaxis].astype(np.float32) / 255)  # quantized on the way in
    np.save(tmp_path / "wrong.npy", np.zeros((5, 5), dtype=np.uint8))
    (tmp_path / "broken.png").write_bytes(b"not a png")
    listing = tmp_path / "inputs.txt"
    listing.write_text(
        "# inputs\n" + "".join(f"{tmp_path / n}\n" for n in ["u8.npy", "f32.npy", "wrong.npy", "broken.png"])
    )
    out = tmp_path / "raw.jsonl"
    r = run_cli(["infer", models["classifier"], f"@{listing}", "-o", out, "--raw"], clean_env)
    assert r.returncode == 1  # some inputs failed: reported, the rest done
    assert "2 of 4 inputs failed" in r.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [Path(rec["input"]).name for rec in records] == ["u8.npy", "f32.npy", "wrong.npy", "broken.png"]
    for rec in records[:2]:
        scores = rec["outputs"][0][0]
        assert int(np.argmax(scores)) == 6 and abs(sum(scores) - 1) < 0.02
    assert "shape (5, 5)" in records[2]["error"] and "not a readable image" in records[3]["error"]


def test_list_inputs_orders_and_validates(models, tmp_path):
    listed = list_inputs([str(models["images"])])
    assert listed == sorted(listed) and len(listed) == 18
    with pytest.raises(Exception, match="matches no files"):
        list_inputs([str(tmp_path / "*.jpg")])


# -- multi-task steps -------------------------------------------------------------------------


def test_step_and_array_shares_combine():
    step = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1"}
    assert shard_from_environment(step) == (1, 2)
    array = {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "0"}
    assert shard_from_environment({**array, **step}) == (3, 4)  # array index 1 x 2 tasks + rank 1
    # A batch script: SLURM_NTASKS=4 and SLURM_PROCID=0 but one process: no step share.
    assert shard_from_environment({"SLURM_NTASKS": "4", "SLURM_PROCID": "0"}) is None
    assert shard_from_environment({"SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}) is None
    with pytest.raises(UsageError, match="SLURM_PROCID 2"):
        shard_from_environment({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "2"})


def test_sbatch_output_patterns():
    env = {
        "SLURM_JOB_ID": "41",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "3",
        "SLURMD_NODENAME": "n2",
        "SLURM_NODEID": "1",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_NAME": "det",
    }
    assert expand_output_pattern("%x-%j.%s-%N-%n-%t-%4t-%J-%u-%q-%%t", env) == "det-41.0-n2-1-3-0003-41.0-alice-%q-%t"
    assert expand_output_pattern("%s", {"SLURM_JOB_ID": "5"}) == "batch"


def test_step_tasks_times_array_tasks_cover_every_input_once(models, clean_env, tmp_path):
    """Simulated environments of a 2-task array whose tasks each run a 2-task step."""
    for array_task in (0, 1):
        for rank in (0, 1):
            env = dict(
                clean_env,
                SLURM_JOB_ID=str(50 + array_task),
                SLURM_ARRAY_JOB_ID="50",
                SLURM_ARRAY_TASK_ID=str(array_task),
                SLURM_ARRAY_TASK_COUNT="2",
                SLURM_ARRAY_TASK_MIN="0",
                SLURM_STEP_NUM_TASKS="2",
                SLURM_PROCID=str(rank),
                SLURMD_NODENAME=f"n{rank + 1}",
            )
            r = run_cli(["infer", models["classifier"], models["images"], "-o", tmp_path / "r_%A_%a_%t_%N.jsonl"], env)
            assert r.returncode == 0, r.stderr
    files = sorted(tmp_path.glob("r_50_*.jsonl"))
    assert [f.name for f in files] == [
        "r_50_0_0_n1.jsonl",
        "r_50_0_1_n2.jsonl",
        "r_50_1_0_n1.jsonl",
        "r_50_1_1_n2.jsonl",
    ]
    keys = [k for f in files for k in _keys(f)]
    assert sorted(keys) == [str(p) for p in sorted(models["images"].glob("*.png"))]
    assert all(_keys(f) for f in files)
