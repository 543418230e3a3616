"""The models jobs have loaded: bytes by sha256, their tensors, and which jobs refer to each.

Two jobs that load the same bytes share one entry (and so one interpreter per device); an
entry goes when the last job referring to it closes. A job's models are bounded in number and
in bytes, so one job cannot fill the broker's memory with models.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..protocol import broker_wire as wire
from ..runner.modelinfo import TensorSpec, _spec as _flatbuffer_spec

MAX_TENSORS = 64  # inputs, and outputs, of a model (as oneop.py allows an executable's op)
MAX_NAME = 256  # characters of a tensor's name
ANSWER_ROOM = 1024  # what a load answer's JSON holds besides its tensor specs
# bytes per element of tflite.TensorType values (schema.fbs); a type not here counts 8
_ELEMENT_BYTES = {0: 4, 1: 2, 2: 4, 3: 1, 4: 8, 5: 8, 6: 1, 7: 2, 8: 8, 9: 1, 10: 8, 11: 16, 12: 8, 15: 4, 16: 2}


@dataclass
class ModelEntry:
    sha256: str
    data: bytes  # the .tflite the device runs (for an executable: its one-op model, oneop.py)
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    input_sizes: list[int] = field(default_factory=list)  # bytes of each input tensor
    jobs: set[int] = field(default_factory=set)
    ready: bool = False  # tensors known (the model was built once)
    # Loaded as an Edge TPU executable (a job's libedgetpu forwarding an edgetpu-custom-op): its bytes
    # (run themselves in twin mode, executor.py) and the (inputs, outputs) the job's op declared.
    executable: bytes | None = None
    declared: tuple[list[TensorSpec], list[TensorSpec]] | None = None


def tensor_bytes(spec: TensorSpec) -> int:
    """Bytes of one tensor of ``spec``."""
    return int(np.prod(spec.shape, dtype=np.int64)) * spec.dtype.itemsize


def spec_json(spec: TensorSpec) -> dict:
    """A tensor spec as broker_wire sends it."""
    return {
        "name": spec.name,
        "shape": list(spec.shape),
        "dtype": spec.dtype.name,
        "quantization": [spec.scale, spec.zero_point],
    }


class LimitError(Exception):
    """A job would exceed one of its bounds (one line for the user)."""


def answer_limit_error(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> str | None:
    """Why a model with these tensors may not be served (too many, names too long, a load answer
    past MAX_HEADER), or None."""
    for side, specs in (("inputs", inputs), ("outputs", outputs)):
        if len(specs) > MAX_TENSORS:
            return f"the model has {len(specs)} {side}, more than the {MAX_TENSORS} the broker serves"
        if any(len(spec.name) > MAX_NAME for spec in specs):
            return f"the model has a tensor name longer than {MAX_NAME} characters"
    size = len(json.dumps([spec_json(s) for s in (*inputs, *outputs)], separators=(",", ":")))
    if size + ANSWER_ROOM > wire.MAX_HEADER:
        return f"the model's tensors take {size} bytes to describe, more than a broker answer holds"
    return None


def check_model(data: bytes, max_tensor_bytes: int) -> None:
    """LimitError (one line) unless ``data``, a .tflite, has at most MAX_TENSORS inputs and outputs,
    names of at most MAX_NAME, a load answer that fits a frame, and tensors of at most
    ``max_tensor_bytes`` in all (every subgraph's, as the interpreter would allocate them): read
    from the flatbuffer, before any interpreter is built."""
    import tflite  # schema package (generated code, not a runtime)

    try:
        model = tflite.Model.GetRootAsModel(data, 0)
        total = 0
        inputs: list[TensorSpec] = []
        outputs: list[TensorSpec] = []
        for g in range(model.SubgraphsLength()):
            graph = model.Subgraphs(g)
            if g == 0:
                if graph.InputsLength() > MAX_TENSORS or graph.OutputsLength() > MAX_TENSORS:
                    raise LimitError(
                        f"the model has {graph.InputsLength()} inputs and {graph.OutputsLength()} outputs, "
                        f"more than the {MAX_TENSORS} each the broker serves"
                    )
                inputs = [_flatbuffer_spec(graph.Tensors(graph.Inputs(i))) for i in range(graph.InputsLength())]
                outputs = [_flatbuffer_spec(graph.Tensors(graph.Outputs(i))) for i in range(graph.OutputsLength())]
            for t in range(graph.TensorsLength()):
                tensor = graph.Tensors(t)
                elements = 1
                for d in range(tensor.ShapeLength()):
                    elements *= max(1, abs(int(tensor.Shape(d))))
                total += elements * _ELEMENT_BYTES.get(tensor.Type(), 8)
                if total > max_tensor_bytes:
                    raise LimitError(
                        f"the model's tensors take more than the {max_tensor_bytes} bytes the broker allows one model"
                    )
    except LimitError:
        raise
    except Exception as exc:  # noqa: BLE001 - a corrupt flatbuffer raises anything from IndexError to struct.error
        raise LimitError(f"the model is corrupt ({type(exc).__name__})") from None
    problem = answer_limit_error(inputs, outputs)
    if problem is not None:
        raise LimitError(problem)


class ModelRegistry:
    """sha256 -> :class:`ModelEntry`; thread-safe."""

    def __init__(self, max_models_per_job: int = 8, max_bytes_per_job: int = 256 << 20):
        self.max_models_per_job = max_models_per_job
        self.max_bytes_per_job = max_bytes_per_job
        self._lock = threading.Lock()
        self._entries: dict[str, ModelEntry] = {}

    @staticmethod
    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def get(self, sha256: str) -> ModelEntry | None:
        with self._lock:
            return self._entries.get(sha256)

    def job_models(self, job: int) -> list[str]:
        with self._lock:
            return [sha for sha, entry in self._entries.items() if job in entry.jobs]

    def check_room(self, job: int, size: int) -> None:
        """LimitError when ``job`` may not add a model of ``size`` bytes (asked before the bytes are
        read; :meth:`add` asks again, atomically with the add)."""
        with self._lock:
            self._room(job, size)

    def _room(self, job: int, size: int) -> None:
        mine = [e for e in self._entries.values() if job in e.jobs]
        if len(mine) >= self.max_models_per_job:
            raise LimitError(f"this job has {len(mine)} models loaded, the most the broker keeps for one job")
        used = sum(len(e.data) for e in mine)
        if used + size > self.max_bytes_per_job:
            raise LimitError(
                f"this job's models would take {used + size} bytes, more than the {self.max_bytes_per_job} "
                "the broker keeps for one job"
            )

    def add(
        self,
        job: int,
        data: bytes,
        executable: bytes | None = None,
        declared: tuple[list[TensorSpec], list[TensorSpec]] | None = None,
        size: int | None = None,
    ) -> tuple[ModelEntry, bool]:
        """The entry for ``data`` with ``job`` referring to it; True when no entry had these bytes.
        ``executable``/``declared``: ``data`` is the one-op model of that executable (oneop.py).
        LimitError when the job has no room for it (checked and reserved under one lock: two loads of
        one job cannot both pass the check); ``size``: the bytes it counts for (``data``'s by default)."""
        sha = self.digest(data)
        with self._lock:
            entry = self._entries.get(sha)
            if entry is None or job not in entry.jobs:
                self._room(job, len(data) if size is None else size)
            created = entry is None
            if entry is None:
                entry = self._entries[sha] = ModelEntry(sha, data, executable=executable, declared=declared)
            entry.jobs.add(job)
            return entry, created

    def discard(self, job: int, sha256: str) -> bool:
        """``job`` no longer refers to the model; True when nobody does any more (the entry is gone)."""
        with self._lock:
            entry = self._entries.get(sha256)
            if entry is None:
                return False
            entry.jobs.discard(job)
            if entry.jobs:
                return False
            del self._entries[sha256]
            return True

    def release_job(self, job: int) -> list[str]:
        """Drop ``job``'s references; the models nobody refers to any more (their entries are gone)."""
        with self._lock:
            unused = []
            for sha, entry in list(self._entries.items()):
                entry.jobs.discard(job)
                if not entry.jobs:
                    del self._entries[sha]
                    unused.append(sha)
            return unused

    def count(self) -> int:
        with self._lock:
            return len(self._entries)
