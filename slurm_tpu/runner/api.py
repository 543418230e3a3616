"""The Python API: open a model on the job's device(s) once, then classify, batch or benchmark.

    from slurm_tpu.runner import Runner
    with Runner("model.tflite", labels="labels.txt") as runner:
        print(runner.classify("cat.jpg", top_k=3))
        runner.run_batch(["images/"], output="results.jsonl")
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .benchmark import BenchResult, benchmark, random_inputs
from .classify import Class, read_labels, top_classes
from .devices import EDGETPU
from .errors import UsageError
from .inputs import list_inputs
from .pipeline import decode_ordered, infer_ordered
from .preprocess import Normalization, load_input
from .progress import Progress
from .results import JSONL, ResultWriter, render_line
from .session import EngineSet, OpenOptions, open_engines, open_segments
from .spec import TensorSpec

_log = logging.getLogger("slurm_tpu.runner")


@dataclass(frozen=True)
class BatchSummary:
    total: int  # inputs in this run's share
    skipped: int  # already in the results file (resumed)
    processed: int
    errors: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.processed / self.seconds if self.seconds > 0 else 0.0


class _StdoutWriter:
    """Batch results to stdout (JSONL, not resumable) when no --output is given."""

    def __init__(self, fmt: str, top_k: int, write: Callable[[str], Any]):
        self.fmt, self.top_k, self._write, self.done = fmt, top_k, write, set()

    def write(self, record: dict) -> None:
        self._write(render_line(record, self.fmt, self.top_k))

    def close(self) -> None:
        pass


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Runner:
    """A model opened on the devices this job was given (see :mod:`.devices`)."""

    def __init__(self, model: str | Sequence[str], labels: str | None = None,
                 options: OpenOptions | None = None, environ: Mapping[str, str] = os.environ,
                 warn: Callable[[str], None] = _log.warning, normalization: Normalization = Normalization()):
        segments = [model] if isinstance(model, (str, os.PathLike)) else [str(m) for m in model]
        self.segmented = len(segments) > 1
        opener = open_segments if self.segmented else open_engines
        self.engine_set: EngineSet = opener(segments if self.segmented else str(segments[0]),
                                            options, environ, warn)  # type: ignore[arg-type]
        self.labels = read_labels(labels)
        self.normalization = normalization

    # -- what the model expects / produces -------------------------------------------

    @property
    def input_specs(self) -> Sequence[TensorSpec]:
        return self.engine_set.engines[0].inputs

    @property
    def output_specs(self) -> Sequence[TensorSpec]:
        return self.engine_set.engines[-1].outputs

    @property
    def on_edgetpu(self) -> bool:
        return self.engine_set.devices[0].kind == EDGETPU

    @property
    def device_labels(self) -> list[str]:
        return [e.label for e in self.engine_set.engines]

    def load(self, path: str) -> list[np.ndarray]:
        """An input file as the model's input tensors (single-input models)."""
        if len(self.input_specs) != 1:
            raise UsageError(f"the model has {len(self.input_specs)} inputs; files feed single-input "
                             "models only: use infer() with arrays")
        return [load_input(path, self.input_specs[0], self.normalization)]

    # -- single inputs -----------------------------------------------------------------

    def infer(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One inference (through every segment in turn when segmented)."""
        values = list(inputs)
        for engine in self.engine_set.engines if self.segmented else self.engine_set.engines[:1]:
            values = engine.run(values)
        return values

    def classify(self, source: str | np.ndarray, top_k: int = 1, threshold: float = 0.0) -> list[Class]:
        return self.classify_timed(source, 1, top_k, threshold)[0]

    def classify_timed(self, source: str | np.ndarray, count: int = 1, top_k: int = 1,
                       threshold: float = 0.0) -> tuple[list[Class], list[float]]:
        """Classify ``count`` times (as classify_image.py does); returns classes and each time in ms.

        The first time includes the Edge TPU's model upload; report it apart.
        """
        inputs = self.load(source) if isinstance(source, str) else [np.asarray(source)]
        times, outputs = [], []
        for _ in range(max(1, count)):
            started = time.perf_counter()
            outputs = self.infer(inputs)
            times.append((time.perf_counter() - started) * 1000)
        return top_classes(outputs[0], self.output_specs[0], self.labels, top_k, threshold), times

    # -- batches -------------------------------------------------------------------------

    def _record(self, key: str, outputs: list[np.ndarray] | None, error: str | None,
                top_k: int, threshold: float, raw: bool) -> dict:
        if error is not None:
            return {"input": key, "error": error}
        assert outputs is not None
        if raw:
            return {"input": key, "outputs": [np.round(spec.dequantize(o), 6).tolist()
                                              for spec, o in zip(self.output_specs, outputs)]}
        classes = top_classes(outputs[0], self.output_specs[0], self.labels, top_k, threshold)
        return {"input": key, "classes": [{"index": c.index, "label": c.label, "score": round(c.score, 6)}
                                          for c in classes]}

    def run_batch(self, inputs: Sequence[str], output: str | None = None, fmt: str = JSONL,
                  top_k: int = 1, threshold: float = 0.0, raw: bool = False,
                  decode_threads: int | None = None, progress: Progress | None = None,
                  expand: bool = True, stdout_write: Callable[[str], Any] | None = None) -> BatchSummary:
        """Run every input, appending one line per input to ``output`` (resumable).

        ``inputs`` are expanded (directories, globs, list files) unless ``expand`` is
        False (the caller already listed and sharded them).
        """
        keys = list(dict.fromkeys(list_inputs(inputs) if expand else inputs))  # de-duplicate, keep order
        width = 0 if raw else top_k
        writer: ResultWriter | _StdoutWriter
        if output:
            writer = ResultWriter(output, fmt, width)
        else:
            import sys

            writer = _StdoutWriter(fmt, width, stdout_write or sys.stdout.write)
        started = time.perf_counter()
        todo = [k for k in keys if k not in writer.done]
        skipped = len(keys) - len(todo)
        progress = progress or Progress(len(todo), enabled=False)
        progress.total, progress.skipped = len(todo), skipped
        processed = errors = 0
        threads = decode_threads or self._decode_threads()
        try:
            decoded = decode_ordered(todo, self.load, threads=threads,
                                     lookahead=max(8, 4 * threads * len(self.engine_set.engines)))
            for item in infer_ordered(self.engine_set.engines, decoded, chain=self.segmented):
                writer.write(self._record(item.key, item.outputs, item.error, top_k, threshold, raw))
                processed += 1
                errors += item.error is not None
                progress.update(1, int(item.error is not None))
        finally:
            writer.close()
            progress.close()
        return BatchSummary(len(keys), skipped, processed, errors, time.perf_counter() - started)

    def _decode_threads(self) -> int:
        """Decoders to run ahead of the device.

        A CPU interpreter already uses every core with XNNPACK's statically split
        work, so extra decoders only make its threads wait for each other: one
        decoder fills the gaps. An Edge TPU or GPU leaves the CPU idle during
        invoke(): then decode on several cores.
        """
        if all(e.label == "cpu" for e in self.engine_set.engines):
            return 1
        return max(1, min(4, _cpus()))

    # -- benchmark -----------------------------------------------------------------------

    def benchmark(self, iterations: int = 100, source: str | None = None) -> BenchResult:
        """Latency and throughput on the first device (the whole chain when segmented)."""
        inputs = self.load(source) if source else random_inputs(self.input_specs)
        engine = _Chain(self) if self.segmented else self.engine_set.engines[0]
        return benchmark(engine, inputs, iterations, self.engine_set.load_seconds, self.engine_set.runtime,
                         self.engine_set.edgetpu_version)

    def close(self) -> None:
        self.engine_set.close()

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Chain:
    """All segments as one engine (for latency: one input at a time through the chain)."""

    def __init__(self, runner: Runner):
        self._runner = runner
        self.label = " -> ".join(runner.device_labels)
        self.inputs, self.outputs = runner.input_specs, runner.output_specs

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self._runner.infer(inputs)

    def close(self) -> None:
        pass
