"""The models jobs have loaded: bytes by sha256, their tensors, and which jobs refer to each.

Two jobs that load the same bytes share one entry (and so one interpreter per device); an
entry goes when the last job referring to it closes. A job's models are bounded in number and
in bytes, so one job cannot fill the broker's memory with models.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field

import numpy as np

from ..runner.modelinfo import TensorSpec


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
        """LimitError when ``job`` may not add a model of ``size`` bytes (asked before the bytes are read)."""
        with self._lock:
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
    ) -> tuple[ModelEntry, bool]:
        """The entry for ``data`` with ``job`` referring to it; True when no entry had these bytes.
        ``executable``/``declared``: ``data`` is the one-op model of that executable (oneop.py)."""
        sha = self.digest(data)
        with self._lock:
            entry = self._entries.get(sha)
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
