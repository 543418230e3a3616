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

# Registration: recognition order for --task auto, then the tasks only chosen by name.
# Their names (and the order users see them listed in) are ``choices.TASK_NAMES``.
_RECOGNISED = (Detect, Classify, Segment)
_BY_NAME_ONLY = (Raw,)

__all__ = ["AUTO", "TASK_NAMES", "Task", "TaskOptions", "Class", "Object", "Segmentation", "choose_task", "read_labels"]


def _make(cls: type[Task], keep_aspect: bool) -> Task:
    return cls(keep_aspect) if cls is Segment else cls()


def choose_task(
    name: str, outputs: Sequence[TensorSpec], custom_ops: frozenset[str], model: str, keep_aspect: bool = False
) -> tuple[Task, str]:
    """The task for a model and how it was chosen (for the user: "auto: ..."/"--task"): by name, or
    (``auto``) the first of detect, classify and segment whose output signature the model has."""
    classes = {t.name: t for t in _RECOGNISED + _BY_NAME_ONLY}
    if name != AUTO:
        if name not in classes:
            raise UsageError(f"--task {name}: unknown; use one of {AUTO}, {', '.join(TASK_NAMES)}")
        task = _make(classes[name], keep_aspect)
        if not task.fits(outputs, custom_ops):
            raise UsageError(
                f"--task {name} needs {task.expects}; model {model} has "
                f"{describe_outputs(outputs)}: pass --task raw for its outputs as they are"
            )
        return task, "--task"
    for cls in _RECOGNISED:
        task = _make(cls, keep_aspect)
        if task.fits(outputs, custom_ops):
            return task, f"auto: {task.expects}"
    raise UsageError(
        f"model {model} has outputs {describe_outputs(outputs)}, which fit no task "
        "(detect: TFLite_Detection_PostProcess outputs; classify: one [1, N] output; segment: "
        "one [1, H, W] or [1, H, W, C] output): pass --task raw for its dequantized outputs"
    )
