"""Tasks on the project's generated models: classify, detect, segment, raw; single, batch, JSONL, CSV."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from runner_support import run_cli

from harness.modelgen import detector, images, segmenter
from harness.modelgen.flatbuf import Graph, Quant, softmax_options
from slurm_tpu.runner.errors import UsageError
from slurm_tpu.runner.modelinfo import TensorSpec
from slurm_tpu.runner.tasks import choose_task, read_labels
from slurm_tpu.runner.tasks.segment import pascal_colormap


def _expected(models) -> dict:
    return json.loads((models["scenes"] / "expected.json").read_text())


def _objects(expected_entry) -> list[tuple[int, list[int]]]:
    return sorted((o[0], o[1:]) for o in expected_entry["objects"])


def _spec(name, shape, dtype=np.float32):
    return TensorSpec(name, tuple(shape), np.dtype(dtype))


# -- recognising the task ---------------------------------------------------------------


@pytest.mark.parametrize(
    "outputs, task",
    [
        ([_spec("b", (1, 10, 4)), _spec("c", (1, 10)), _spec("s", (1, 10)), _spec("n", (1,))], "detect"),
        ([_spec("scores", (1, 1001), np.uint8)], "classify"),
        ([_spec("logits", (1, 1, 1, 1001), np.uint8)], "classify"),
        ([_spec("map", (1, 513, 513), np.int32)], "segment"),
        ([_spec("logits", (1, 32, 32, 21), np.uint8)], "segment"),
    ],
)
def test_auto_recognises_the_task_from_the_outputs(outputs, task):
    assert choose_task("auto", outputs, frozenset(), "m.tflite")[0].name == task


def test_a_model_that_fits_no_task_names_its_outputs_and_task_raw():
    outputs = [_spec("embedding", (1, 128)), _spec("norm", (1, 1))]
    with pytest.raises(UsageError, match=r"embedding \[1, 128\] float32, norm \[1, 1\].*--task raw"):
        choose_task("auto", outputs, frozenset(), "m.tflite")
    assert choose_task("raw", outputs, frozenset(), "m.tflite")[0].name == "raw"
    with pytest.raises(UsageError, match="--task detect needs"):
        choose_task("detect", outputs, frozenset(), "m.tflite")


def test_labels_in_both_formats(tmp_path):
    (tmp_path / "pairs.txt").write_text("0 red\n1 green\n2  blue sky\n")
    (tmp_path / "lines.txt").write_text("red\ngreen\nblue sky\n")
    assert (
        read_labels(str(tmp_path / "pairs.txt"))
        == read_labels(str(tmp_path / "lines.txt"))
        == {0: "red", 1: "green", 2: "blue sky"}
    )


# -- detection ---------------------------------------------------------------------------


@pytest.mark.parametrize("scene", ["square_64", "landscape_160x96", "portrait_96x160", "photo_640x480"])
def test_detect_boxes_are_in_original_pixels(models, clean_env, scene):
    """Objects fill one detector cell once scaled into the input; their boxes must come back
    in the source image's pixels whatever its size and aspect ratio. Red and blue objects
    keep their labels: a BGR mix-up would swap them."""
    r = run_cli(
        [
            "infer",
            models["detector"],
            models["scenes"] / f"{scene}.png",
            "--json",
            "-c",
            "1",
            "-l",
            models["detector_labels"],
        ],
        clean_env,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["task"] == "detect"
    got = sorted((o["id"], o["bbox"]) for o in data["objects"])
    assert got == _objects(_expected(models)[f"{scene}.png"])
    assert all(o["label"] == detector.LABELS[o["id"]] and o["score"] > 0.99 for o in data["objects"])


def test_detect_printout_threshold_and_empty_image(models, clean_env):
    r = run_cli(
        [
            "infer",
            "-m",
            models["detector"],
            "-i",
            models["scenes"] / "landscape_160x96.png",
            "-l",
            models["detector_labels"],
            "-c",
            "2",
        ],
        clean_env,
    )  # detect_image.py's flags
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "----INFERENCE TIME----" and lines[1].endswith(" ms") and lines[3] == "-------RESULTS--------"
    assert lines[4:] == ["red: 0.99609 (40, 0, 80, 40)", "green: 0.99609 (120, 40, 160, 80)"]
    empty = models["scenes"] / "empty_100x80.png"
    r = run_cli(["infer", models["detector"], empty, "-c", "1"], clean_env)
    assert r.stdout.splitlines()[-1] == "No objects detected"
    # The model itself reports every cell at about 0.02: only the threshold keeps them out.
    low = json.loads(run_cli(["infer", models["detector"], empty, "-c", "1", "-t", "0.01", "--json"], clean_env).stdout)
    assert len(low["objects"]) == detector.MAX_DETECTIONS
    assert all(o["score"] < 0.05 for o in low["objects"])


def test_detect_batch_jsonl_csv_and_annotations(models, clean_env, tmp_path):
    expected = _expected(models)
    jsonl, table, drawn = tmp_path / "d.jsonl", tmp_path / "d.csv", tmp_path / "drawn"
    r = run_cli(
        [
            "infer",
            models["detector"],
            models["scenes"],
            "-o",
            jsonl,
            "-l",
            models["detector_labels"],
            "--annotate",
            drawn,
        ],
        clean_env,
    )
    assert r.returncode == 0, r.stderr
    assert "slurm-tpu: task: detect (recognised" in r.stderr
    records = {Path(rec["input"]).name: rec for rec in map(json.loads, jsonl.read_text().splitlines())}
    assert set(records) == set(expected)
    for name, rec in records.items():
        assert sorted((o["id"], o["bbox"]) for o in rec["objects"]) == _objects(expected[name])
        assert rec["annotated"] == str(drawn / (Path(name).stem + ".png"))
    assert run_cli(["infer", models["detector"], models["scenes"], "-o", table], clean_env).returncode == 0
    rows = list(csv.DictReader(table.open()))
    assert list(rows[0]) == ["input", "id", "label", "score", "xmin", "ymin", "xmax", "ymax", "error"]
    assert len(rows) == sum(max(1, len(e["objects"])) for e in expected.values())  # a row per object
    empty_rows = [row for row in rows if row["input"].endswith("empty_100x80.png")]
    assert empty_rows == [{**empty_rows[0], "id": "", "label": "", "score": ""}]  # listed, no object
    # The annotated copy: the source's size, each box outlined in red.
    from PIL import Image

    picture = np.asarray(Image.open(drawn / "photo_640x480.png"))
    assert picture.shape == (480, 640, 3)
    xmin, ymin, xmax, ymax = expected["photo_640x480.png"]["objects"][1][1:]  # the blue object
    assert tuple(picture[ymin + 40, xmin]) == (255, 0, 0)  # the outline crosses the box's left edge
    assert tuple(picture[ymin + 80, xmin + 80]) == images.colours.PAINT[2]  # inside: the object itself


def test_annotate_refuses_to_overwrite_inputs_and_raw_has_no_picture(models, clean_env, tmp_path):
    r = run_cli(
        ["infer", models["detector"], models["scenes"], "-o", tmp_path / "x.jsonl", "--annotate", models["scenes"]],
        clean_env,
    )
    assert r.returncode == 2 and "would overwrite input" in r.stderr and not (tmp_path / "x.jsonl").exists()
    r = run_cli(
        [
            "infer",
            models["detector"],
            models["scenes"],
            "--task",
            "raw",
            "-o",
            tmp_path / "r.jsonl",
            "--annotate",
            tmp_path / "a",
        ],
        clean_env,
    )
    assert r.returncode == 2 and "not raw" in r.stderr


# -- segmentation ------------------------------------------------------------------------


def _true_fractions(scene_name: str, models) -> dict[int, float]:
    entry = _expected(models)[scene_name]
    width, height = entry["size"]
    fractions = {1 + o[0]: (o[3] - o[1]) * (o[4] - o[2]) / (width * height) for o in entry["objects"]}
    fractions[0] = 1 - sum(fractions.values())
    return fractions


@pytest.mark.parametrize("model", ["segmenter", "segmenter_argmax"])
def test_segment_fractions_and_mask(models, clean_env, tmp_path, model):
    out, masks = tmp_path / "s.jsonl", tmp_path / "masks"
    r = run_cli(
        ["infer", models[model], models["scenes"], "-o", out, "-l", models["segmenter_labels"], "--annotate", masks],
        clean_env,
    )
    assert r.returncode == 0, r.stderr
    from PIL import Image

    for rec in map(json.loads, out.read_text().splitlines()):
        name = Path(rec["input"]).name
        truth = _true_fractions(name, models)
        got = {c["id"]: c["fraction"] for c in rec["classes"]}
        assert set(got) == set(truth), name
        for class_id, fraction in truth.items():  # resampling blurs only the objects' edges
            assert abs(got[class_id] - fraction) < 0.02, (name, class_id)
        assert [c["label"] for c in rec["classes"]] == [segmenter.LABELS[c["id"]] for c in rec["classes"]]
        mask = np.asarray(Image.open(rec["annotated"]))
        assert [mask.shape[1], mask.shape[0]] == rec["size"] == _expected(models)[name]["size"]
        colours = {tuple(c) for c in mask.reshape(-1, 3)}
        assert colours == {tuple(pascal_colormap()[i]) for i in got}


def test_segment_variants_agree_and_csv_rows(models, clean_env, tmp_path):
    outputs = []
    for model in ("segmenter", "segmenter_argmax"):
        out = tmp_path / f"{model}.csv"
        assert run_cli(["infer", models[model], models["scenes"], "-o", out], clean_env).returncode == 0
        outputs.append(out.read_text())
    assert outputs[0] == outputs[1]
    rows = list(csv.DictReader(outputs[0].splitlines()))
    assert list(rows[0]) == ["input", "id", "label", "fraction", "annotated", "error"]


# -- raw and classification ----------------------------------------------------------------


def test_raw_outputs_of_a_detector(models, clean_env):
    r = run_cli(
        ["infer", models["detector"], models["scenes"] / "square_64.png", "--task", "raw", "-c", "1", "--json"],
        clean_env,
    )
    boxes, classes, scores, count = json.loads(r.stdout)["outputs"]
    assert count == [detector.MAX_DETECTIONS] and len(boxes[0]) == detector.MAX_DETECTIONS


def test_a_model_that_fits_no_task_is_one_line(clean_env, tmp_path, models):
    g = Graph(description="two heads")
    x = g.tensor("x", (1, 9), np.uint8, Quant.per_tensor(1 / 16, 0))
    heads = [g.tensor(f"head{i}", (1, 9), np.uint8, Quant.per_tensor(1 / 256, 0)) for i in range(2)]
    for head in heads:
        g.op(25, [x], [head], *softmax_options())  # SOFTMAX
    g.inputs, g.outputs = [x], heads
    model = tmp_path / "two_heads.tflite"
    model.write_bytes(g.serialize())
    np.save(tmp_path / "x.npy", np.zeros((1, 9), dtype=np.uint8))
    r = run_cli(["infer", model, tmp_path / "x.npy"], clean_env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "head0 [1, 9] uint8, head1 [1, 9] uint8" in r.stderr and "--task raw" in r.stderr
    r = run_cli(["infer", model, tmp_path / "x.npy", "--task", "raw", "--json", "-c", "1"], clean_env)
    assert len(json.loads(r.stdout)["outputs"]) == 2


def test_classify_accepts_classify_image_flags(models, clean_env):
    r = run_cli(
        [
            "infer",
            "-m",
            models["classifier"],
            "-i",
            models["images"] / "img_00005.png",
            "-l",
            models["classifier_labels"],
            "--top_k",
            "2",
            "-t",
            "0.0",
            "-c",
            "1",
        ],
        clean_env,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-2:][0] == "right: 0.99609"
