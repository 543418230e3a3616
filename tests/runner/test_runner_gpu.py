"""GPU through LiteRT's CompiledModel (WebGPU over Vulkan): only where a GPU really is."""

from __future__ import annotations

import ctypes
import glob

import pytest

from harness.modelgen import classifier, images
from slurm_tpu.runner import OpenOptions, Runner


def _gpu_missing_reason() -> str | None:
    try:
        ctypes.CDLL("libvulkan.so.1")
    except OSError:
        return "no Vulkan loader (libvulkan.so.1): LiteRT's GPU path cannot run here"
    if not glob.glob("/dev/nvidia[0-9]*") and not glob.glob("/dev/dri/renderD*"):
        return "no GPU device node (/dev/nvidiaN or /dev/dri/renderD*)"
    return None


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_gpu_missing_reason() is not None, reason=_gpu_missing_reason() or ""),
]


def test_classifier_on_the_gpu_gives_the_cpu_answer(models, clean_env):
    with (
        Runner(str(models["classifier"]), options=OpenOptions(device=["gpu"]), environ=clean_env) as gpu,
        Runner(str(models["classifier"]), environ=clean_env) as cpu,
    ):
        assert gpu.device_labels == ["gpu"]
        for region in range(9):
            image = images.bright_region_image(region, 24, seed=region)[None]
            assert gpu.classify(image)[0].index == cpu.classify(image)[0].index == region
            assert classifier.expected_top1(image[0]) == region


def test_gpu_job_from_cuda_visible_devices(models, clean_env):
    env = dict(clean_env, CUDA_VISIBLE_DEVICES="0")
    with Runner(str(models["mobilenet"]), environ=env) as runner:
        result = runner.benchmark(10)
    assert result.device == "gpu" and result.iterations == 10
