"""Classification post-processing on plain numpy: labels, top-k, threshold."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import InputError
from .spec import TensorSpec


@dataclass(frozen=True)
class Class:
    index: int
    label: str
    score: float


def read_labels(path: str | None) -> dict[int, str]:
    """Labels file: one label per line, or pycoral's ``<index> <label>`` lines."""
    if not path:
        return {}
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"labels file {path} cannot be read ({exc.strerror}): check --labels", path) from None
    pairs = [re.match(r"^\s*(\d+)[\s:]+(.*\S)\s*$", line) for line in lines if line.strip()]
    if pairs and all(pairs):
        return {int(m.group(1)): m.group(2) for m in pairs if m}
    return {i: line.strip() for i, line in enumerate(lines)}


def scores_of(output: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """Dequantized 1-D scores of a [1, N] (or [N]) classification output."""
    return spec.dequantize(np.asarray(output).reshape(-1))


def top_classes(output: np.ndarray, spec: TensorSpec, labels: dict[int, str],
                top_k: int = 1, threshold: float = 0.0) -> list[Class]:
    """The ``top_k`` best classes scoring at least ``threshold``, best first (ties: lower index)."""
    scores = scores_of(output, spec)
    k = max(0, min(top_k, scores.size))
    if k == 0:
        return []
    if k < scores.size // 4:
        candidates = np.argpartition(-scores, k - 1)[:k]
        order = candidates[np.lexsort((candidates, -scores[candidates]))]
    else:
        order = np.argsort(-scores, kind="stable")[:k]
    return [Class(int(i), labels.get(int(i), str(int(i))), float(scores[i]))
            for i in order if scores[i] >= threshold]
