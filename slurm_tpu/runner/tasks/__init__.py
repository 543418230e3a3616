"""Tasks: what a model's outputs mean (classify, detect, segment, raw), one module each."""

from __future__ import annotations

from collections.abc import Sequence

from ..choices import AUTO, TASK_NAMES
from ..errors import UsageError
from ..modelinfo import TensorSpec
from .base import Task, TaskOptions, describe_outputs, read_labels
from .classify import Class, Classify
from .detect import Detect, Object
from .raw import Raw
from .segment import Segment, Segmentation

__all__ = ["AUTO", "TASK_NAMES", "Task", "TaskOptions", "Class", "Object", "Segmentation", "choose_task", "read_labels"]


def choose_task(
    name: str, outputs: Sequence[TensorSpec], custom_ops: frozenset[str], model: str, keep_aspect: bool = False
) -> tuple[Task, str]:
    """The task for a model and how it was chosen (for the user: "auto: ..."/"--task"): by name, or
    (``auto``) the first of detect, classify and segment whose output signature the model has."""
    # Registration: the recognition order for --task auto; raw, last, is only chosen by name.
    # Their names (and the order users see them listed in) are ``choices.TASK_NAMES``.
    tasks = [Detect(), Classify(), Segment(keep_aspect), Raw()]
    if name != AUTO:
        task = next((t for t in tasks if t.name == name), None)
        if task is None:
            raise UsageError(f"--task {name}: unknown; use one of {AUTO}, {', '.join(TASK_NAMES)}")
        if not task.fits(outputs, custom_ops):
            raise UsageError(
                f"--task {name} needs {task.expects}; model {model} has "
                f"{describe_outputs(outputs)}: pass --task raw for its outputs as they are"
            )
        return task, "--task"
    for task in tasks[:-1]:
        if task.fits(outputs, custom_ops):
            return task, f"auto: {task.expects}"
    raise UsageError(
        f"model {model} has outputs {describe_outputs(outputs)}, which fit no task "
        "(detect: TFLite_Detection_PostProcess outputs; classify: one [1, N] output; segment: "
        "one [1, H, W] or [1, H, W, C] output): pass --task raw for its dequantized outputs"
    )
