"""Raw outputs: every output dequantized (embeddings, custom heads, anything else)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..choices import RAW
from ..modelinfo import TensorSpec
from ..preprocess import Geometry
from .base import Task, TaskOptions

_SHOWN = 20  # values per output in the single-input printout


class Raw(Task):
    name = RAW
    expects = "any outputs"
    draws = False

    def fits(self, outputs: Sequence[TensorSpec], custom_ops: frozenset[str]) -> bool:
        return True

    def process(
        self, outputs: Sequence[np.ndarray], specs: Sequence[TensorSpec], geometry: Geometry, options: TaskOptions
    ) -> list[tuple[TensorSpec, np.ndarray]]:
        return [(spec, spec.dequantize(np.asarray(o))) for o, spec in zip(outputs, specs)]

    def record(self, result: list[tuple[TensorSpec, np.ndarray]]) -> dict[str, Any]:
        return {"outputs": [np.round(values, 6).tolist() for _, values in result]}

    def lines(self, result: list[tuple[TensorSpec, np.ndarray]]) -> list[str]:
        lines = []
        for spec, values in result:
            flat = values.reshape(-1)
            shown = " ".join(f"{v:.6g}" for v in flat[:_SHOWN]) + (" ..." if flat.size > _SHOWN else "")
            lines.append(f"{spec.name} {list(values.shape)}: {shown}")
        return lines

    def csv_columns(self, options: TaskOptions) -> list[str]:
        return ["outputs"]

    def csv_rows(self, record: dict[str, Any], options: TaskOptions) -> list[list[Any]]:
        return [[json.dumps(record["outputs"])]] if "outputs" in record else []
