"""The generated models are real, deterministic, and compute what they claim."""

from __future__ import annotations

import numpy as np
import pytest

from harness.modelgen import classifier, images, mobilenet
from slurm_tpu.runner import Runner
from slurm_tpu.runner.modelinfo import read_model_info


def test_builds_are_deterministic():
    assert classifier.build_classifier() == classifier.build_classifier()
    assert mobilenet.build_mobilenet(0.25) == mobilenet.build_mobilenet(0.25)
    assert mobilenet.build_mobilenet(0.25) != mobilenet.build_mobilenet(0.25, seed=1)


def test_classifier_top1_is_the_brightest_region(models, clean_env):
    rng = np.random.default_rng(7)
    with Runner(str(models["classifier"]), labels=str(models["classifier_labels"]), environ=clean_env) as r:
        checked = 0
        for _ in range(200):
            image = rng.integers(0, 256, size=(24, 24, 3), dtype=np.uint8)
            image[rng.integers(0, 24), :, :] //= 2  # a little structure, not just noise
            means = np.sort(classifier.region_masks() @ image.reshape(-1).astype(float) / 192)
            if means[-1] - means[-2] < 3:  # skip near-ties: quantization may flip them
                continue
            top = r.classify(image[np.newaxis], top_k=1)[0]
            assert top.index == classifier.expected_top1(image)
            assert top.label == classifier.LABELS[top.index]
            checked += 1
        assert checked > 50


def test_classifier_scores_follow_the_softmax(models, clean_env):
    image = images.bright_region_image(7, 24, seed=3)
    with Runner(str(models["classifier"]), environ=clean_env) as r:
        classes = r.classify(image[np.newaxis], top_k=9)
    means = classifier.region_masks().astype(float) @ image.reshape(-1).astype(float) / 255 / 192
    logits = classifier.LOGIT_RANGE * means
    expected = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    got = np.zeros(9)
    for c in classes:
        got[c.index] = c.score
    assert classes[0].index == 7
    np.testing.assert_allclose(got, expected, atol=3 / 256)


def test_mobilenet_is_shaped_like_mobilenet_and_input_dependent(models, clean_env):
    info = read_model_info(models["mobilenet"])
    assert info.inputs[0].shape == (1, 224, 224, 3) and info.inputs[0].dtype == np.uint8
    assert info.outputs[0].shape == (1, mobilenet.CLASSES)
    assert not info.is_edgetpu and info.size_bytes > 3_000_000
    with Runner(str(models["mobilenet"]), environ=clean_env) as r:
        outputs, totals = set(), []
        for seed in range(6):
            rng = np.random.default_rng(seed)
            # Smooth images of different colours and frequencies, like photos, unlike noise.
            y, x = np.mgrid[0:224, 0:224] / 224
            f = rng.uniform(0.5, 6, size=3)
            image = np.stack(
                [np.sin(2 * np.pi * f[i] * (x + rng.uniform() * y) + i) * 127 + 128 for i in range(3)], -1
            ).astype(np.uint8)
            out = r.infer([image[np.newaxis]])[0]
            totals.append(out.astype(int).sum())
            outputs.add(out.tobytes())
    # Softmax scores (q/256) sum to at most about 1; most of the 1001 round to 0.
    assert all(0 < t <= 300 for t in totals), totals
    # Random weights classify nothing, but the scores must depend on the input.
    assert len(outputs) == 6


def test_edgetpu_model_is_recognised(models):
    assert read_model_info(models["classifier_edgetpu"]).is_edgetpu
    assert not read_model_info(models["classifier"]).is_edgetpu


@pytest.mark.parametrize("content", [b"", b"not a model at all", b"\x00\x00\x00\x00TFL3garbage"])
def test_unreadable_models_raise_model_error(tmp_path, content):
    from slurm_tpu.runner.errors import ModelError

    path = tmp_path / "bad.tflite"
    path.write_bytes(content)
    with pytest.raises(ModelError, match=str(path)):
        read_model_info(path)
