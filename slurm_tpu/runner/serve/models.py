"""The models a server holds: names, tasks, labels and how request bytes become input tensors.

Every model is opened on every device of the job once (:func:`open_served`). A
:class:`ServedModel` prepares request bodies exactly as the runner prepares files, so a
served answer equals ``slurm-tpu infer --json``'s.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError, UsageError
from ..modelinfo import ModelInfo, TensorSpec
from ..preprocess import Normalization, Prepared, Resize, as_input, conform_array, load_image
from ..request import Preprocessing
from ..session import EngineSet, MeteredEngine, OpenOptions, open_models
from ..tasks import AUTO, Task, TaskOptions, choose_task, read_labels

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # a URL path segment: no '/', no ':'
NPY_MAGIC = b"\x93NUMPY"
MAX_IMAGE_PIXELS = 40_000_000  # a 40-megapixel photo; a tiny PNG can claim billions (decompression bomb)


@dataclass(frozen=True)
class ModelArg:
    """One ``MODEL[=NAME]`` argument of ``slurm-tpu serve``."""

    path: str
    name: str


def default_name(path: str) -> str:
    """The name a model file is served under when none is given: its file name without .tflite."""
    return os.path.basename(path).removesuffix(".tflite")


def parse_model_args(values: Sequence[str]) -> list[ModelArg]:
    """``MODEL[=NAME]`` arguments, names checked (URL-safe, unique)."""
    parsed: list[ModelArg] = []
    for value in values:
        path, sep, name = value.partition("=")
        name = name if sep else default_name(path)
        if not path:
            raise UsageError(f"'{value}': give MODEL or MODEL=NAME")
        if not NAME_PATTERN.match(name):
            raise UsageError(
                f"model name '{name}' (from '{value}') must be letters, digits, '.', '_' or '-' "
                "(it is a URL path segment): give MODEL=NAME"
            )
        if any(m.name == name for m in parsed):
            raise UsageError(f"two models are served as '{name}': name them apart with MODEL=NAME")
        parsed.append(ModelArg(path, name))
    return parsed


def parse_labels_args(values: Sequence[str], models: Sequence[ModelArg]) -> dict[str, str]:
    """``--labels [NAME=]FILE`` values -> {model name: labels file}; a bare FILE needs one model."""
    known = {m.name for m in models}
    found: dict[str, str] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not (sep and name in known):
            if len(models) != 1:
                raise UsageError(
                    f"--labels {value}: with several models give NAME=FILE (names: {', '.join(sorted(known))})"
                )
            name, path = models[0].name, value
        found[name] = path
    return found


@dataclass
class ServedModel:
    """One model as served: its name, engines (one per device, in device order) and task."""

    name: str
    index: int  # its engines' position on every device (see DeviceQueue)
    info: ModelInfo
    engines: list[MeteredEngine]  # the figures /metrics reports
    task: Task  # recognised from the outputs (or --task)
    labels: Mapping[int, str]
    preprocessing: Preprocessing = field(default_factory=Preprocessing)  # as ``infer`` does it (set at serve time)

    @property
    def inputs(self) -> Sequence[TensorSpec]:
        return self.engines[0].inputs

    @property
    def outputs(self) -> Sequence[TensorSpec]:
        return self.engines[0].outputs

    @property
    def device_labels(self) -> list[str]:
        return [e.label for e in self.engines]

    def task_named(self, name: str) -> Task:
        """The task for a task endpoint (``:detect``...): refused if the model's outputs do not fit it."""
        if name == self.task.name:
            return self.task
        keep_aspect = self.preprocessing.keep_aspect_ratio  # choosing builds a few stateless objects: no cache
        return choose_task(name, self.outputs, self.info.custom_ops, self.name, keep_aspect)[0]

    def options(self, top_k: int = 1, threshold: float | None = None) -> TaskOptions:
        return TaskOptions(self.labels, top_k, threshold)

    def prepare(self, data: bytes, task: Task, what: str) -> Prepared:
        """Request bytes as the input, as the runner prepares files: a .npy array (by its
        magic) or an encoded image (JPEG, PNG...)."""
        if len(self.inputs) != 1:
            raise InputError(
                f"model {self.name} has {len(self.inputs)} inputs: images and .npy bodies feed "
                "single-input models only; send tensors to :predict",
                what,
            )
        spec, prep = self.inputs[0], self.preprocessing
        if data.startswith(NPY_MAGIC):
            return as_input(conform_array(read_npy(data, spec, what), spec, what), spec)
        check_image_size(data, what)
        resize = Resize(keep_aspect=task.keep_aspect, fast=prep.fast_resize)
        norm = Normalization(prep.input_mean, prep.input_std)
        return load_image(io.BytesIO(data), spec, norm, resize, name=what)


def check_image_size(data: bytes, what: str) -> None:
    """Refuse, from its header alone, an image too large to decode safely."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except Image.DecompressionBombError:
        raise InputError(f"{what} declares more than {MAX_IMAGE_PIXELS} pixels: scale it down", what) from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InputError(
            f"{what} is not a readable image ({type(exc).__name__}): send JPEG/PNG bytes or a .npy array", what
        ) from None
    if width * height > MAX_IMAGE_PIXELS:
        raise InputError(
            f"{what} is {width}x{height} pixels, more than {MAX_IMAGE_PIXELS} allowed: scale it down", what
        )


def read_npy(data: bytes, spec: TensorSpec, what: str) -> np.ndarray:
    """A .npy array from bytes, its declared shape checked before anything is allocated."""
    from numpy.lib import format as npy

    stream = io.BytesIO(data)
    try:
        version = npy.read_magic(stream)
        shape, _, dtype = (npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0)(stream)
    except (ValueError, TypeError, SyntaxError) as exc:
        raise InputError(f"{what} is not a readable .npy array ({exc})", what) from None
    if tuple(shape) not in (tuple(spec.shape), tuple(spec.shape[1:])):
        raise InputError(f"{what} has shape {tuple(shape)}, the model wants {tuple(spec.shape)}", what)
    if dtype.hasobject:
        raise InputError(f"{what} holds Python objects: send a numeric array", what)
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"{what} is not a readable .npy array ({exc})", what) from None


def open_served(
    args: Sequence[ModelArg],
    labels: Mapping[str, str],
    open_options: OpenOptions,
    preprocessing: Preprocessing,
    environ: Mapping[str, str],
    warn,
    task: str = AUTO,
) -> tuple[EngineSet, list[ServedModel]]:
    """Open every model on every device (see :func:`open_models`); the engine set and the models."""
    label_maps = {name: read_labels(path) for name, path in labels.items()}  # before the devices: fail fast
    engine_set = open_models([a.path for a in args], open_options, environ, warn)
    try:
        devices = len(engine_set.engines) // len(args)
        served = []
        for i, arg in enumerate(args):
            info = engine_set.models[i]
            engines = engine_set.engines[i * devices : (i + 1) * devices]
            chosen, _ = choose_task(task, info.outputs, info.custom_ops, arg.path, preprocessing.keep_aspect_ratio)
            served.append(ServedModel(arg.name, i, info, engines, chosen, label_maps.get(arg.name, {}), preprocessing))
    except BaseException:
        engine_set.close()
        raise
    return engine_set, served


def describe(model: ServedModel) -> dict[str, Any]:
    """What the server says about a model at start-up and in its metadata."""
    return {"name": model.name, "path": model.info.path, "task": model.task.name, "devices": model.device_labels}
