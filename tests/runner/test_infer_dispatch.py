"""Which mode an infer request runs in (slurm_tpu/runner/dispatch.py), and its usage errors."""

from __future__ import annotations

import io
import json

import pytest

from slurm_tpu.runner.dispatch import BatchDone, Streams, Timed, infer, is_batch
from slurm_tpu.runner.errors import UsageError
from slurm_tpu.runner.request import BatchOptions, InferRequest, Reading, RemoteOptions


class _Collected:
    """A Streams whose output is kept for the test."""

    def __init__(self):
        self.written, self.warnings, self.recognised, self.progress = [], [], [], io.StringIO()
        self.streams = Streams(
            write=self.written.append,
            warn=self.warnings.append,
            task_recognised=self.recognised.append,
            progress=self.progress,
        )


def test_one_input_file_is_a_single_run_and_anything_else_a_batch(tmp_path):
    (tmp_path / "images").mkdir()
    assert not is_batch(["a.png"], None)
    assert not is_batch(["a.npy"], None)
    assert is_batch(["a.png"], "results.jsonl")
    assert is_batch(["a.png", "b.png"], None)
    assert is_batch(["@list.txt"], None)
    assert is_batch([str(tmp_path / "images")], None)
    assert is_batch(["images/*"], None)  # a glob (one ending in an image suffix counts as one file)


@pytest.mark.parametrize(
    "request_fields, message",
    [
        ({"reading": Reading(task="detect", raw=True)}, "--raw contradicts --task detect"),
        ({"batch": BatchOptions(shard_index=0)}, "--shard-index and --shard-count go together"),
        ({"inputs": ()}, "no inputs: give image/.npy files, a directory, a glob or @list (or --benchmark)"),
        ({"batch": BatchOptions(shard_index=2, shard_count=2)}, "--shard-index 2 must be below --shard-count 2"),
        (
            {"remote": RemoteOptions(server="123"), "reading": Reading(labels="labels.txt"), "annotate_dir": "out"},
            "--labels, --annotate: set at the server ('slurm-tpu serve'), not with --server",
        ),
    ],
)
def test_usage_errors_come_before_any_device_is_opened(models, clean_env, tmp_path, request_fields, message):
    """The model does not exist: an error about it would mean the device was being opened."""
    fields = {"model": str(tmp_path / "missing.tflite"), "inputs": (str(models["images"]),), **request_fields}
    with pytest.raises(UsageError) as raised:
        infer(InferRequest(**fields), _Collected().streams, clean_env)
    assert str(raised.value) == message


def test_a_single_input_comes_back_timed_for_the_caller_to_render(models, clean_env):
    image = str(models["images"] / "img_00005.png")
    outcome = infer(
        InferRequest(
            model=str(models["classifier"]),
            inputs=(image,),
            count=3,
            reading=Reading(labels=str(models["classifier_labels"])),
        ),
        _Collected().streams,
        clean_env,
    )
    assert isinstance(outcome, Timed)
    assert (outcome.input, outcome.devices, outcome.on_edgetpu, outcome.annotated) == (image, ["cpu"], False, None)
    assert outcome.task.name == "classify" and len(outcome.times) == 3
    assert outcome.task.lines(outcome.result) == ["right: 0.99609"]


def test_a_batch_streams_its_records_and_says_which_task_it_recognised(models, clean_env):
    collected = _Collected()
    images = sorted(models["images"].glob("*.png"))[:3]
    outcome = infer(
        InferRequest(
            model=str(models["classifier"]), inputs=tuple(map(str, images)), batch=BatchOptions(progress=True)
        ),
        collected.streams,
        clean_env,
    )
    assert outcome == BatchDone(processed=3, errors=0, output=None)
    records = [json.loads(line) for line in "".join(collected.written).splitlines()]
    assert [r["input"] for r in records] == list(map(str, images))
    assert collected.recognised == ["classify"]
    quiet = _Collected()
    infer(
        InferRequest(
            model=str(models["classifier"]), inputs=(str(images[0]), str(images[1])), batch=BatchOptions(progress=False)
        ),
        quiet.streams,
        clean_env,
    )
    assert quiet.recognised == [] and quiet.progress.getvalue() == ""
