"""The Python API: open a model on the job's device(s) once, then run inputs, batches or benchmarks.

from slurm_tpu.runner import Runner, TaskOptions
with Runner("model.tflite", labels="labels.txt") as runner:   # task recognised: runner.task
    print(runner.classify("cat.jpg", top_k=3))                # or runner.run("cat.jpg")
    runner.run_batch(["images/"], output="results.jsonl", options=TaskOptions(top_k=3))
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .benchmark import BenchResult, benchmark, random_inputs
from .devices import EDGETPU
from .errors import SlurmTpuError, UsageError
from .inputs import list_inputs
from .pipeline import decode_ordered, infer_ordered
from .preprocess import Geometry, Normalization, Prepared, Resize, load_input
from .progress import Progress
from .results import JSONL, Layout, ResultWriter
from .session import EngineSet, OpenOptions, open_engines, open_segments
from .spec import TensorSpec
from .tasks import AUTO, Class, TaskOptions, choose_task, read_labels
from .tasks.classify import Classify

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
    """Batch results to stdout (not resumable) when no --output is given."""

    def __init__(self, layout: Layout, write: Callable[[str], Any]):
        self.layout, self._write = layout, write
        self.done: set[str] = set()
        if layout.fmt != JSONL:
            write(layout.header())

    def write(self, record: dict) -> None:
        self._write(self.layout.render(record))

    def close(self) -> None:
        pass


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Runner:
    """A model opened on the devices this job was given (see :mod:`.devices`)."""

    def __init__(
        self,
        model: str | Sequence[str],
        labels: str | None = None,
        options: OpenOptions | None = None,
        environ: Mapping[str, str] = os.environ,
        warn: Callable[[str], None] = _log.warning,
        normalization: Normalization = Normalization(),
        task: str = AUTO,
        fast_resize: bool = False,
        keep_aspect_ratio: bool = False,
    ):
        """``task``: classify, detect, segment, raw or auto (from the outputs: see
        :mod:`.tasks`). ``fast_resize``: JPEG draft decoding + BILINEAR instead of pycoral's
        LANCZOS (changes the input tensor). ``keep_aspect_ratio``: pad instead of stretch
        for segmentation (pycoral's --keep_aspect_ratio; detection always pads)."""
        segments = [model] if isinstance(model, (str, os.PathLike)) else [str(m) for m in model]
        self.segmented = len(segments) > 1
        self.labels = read_labels(labels)  # before the device: a bad path costs no TPU time
        if self.segmented:
            self.engine_set: EngineSet = open_segments(segments, options, environ, warn)
        else:
            self.engine_set = open_engines(str(segments[0]), options, environ, warn)
        try:
            models = self.engine_set.models
            custom_ops = frozenset().union(*(m.custom_ops for m in models))
            self.task, self.task_reason = choose_task(
                task, models[-1].outputs, custom_ops, models[-1].path, keep_aspect_ratio
            )
        except BaseException:
            self.engine_set.close()
            raise
        self.normalization = normalization
        self.resize = Resize(keep_aspect=self.task.keep_aspect, fast=fast_resize)

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

    def prepare(self, path: str) -> Prepared:
        """An input file as the model's input tensor, prepared for this task (single-input models)."""
        if len(self.input_specs) != 1:
            raise UsageError(
                f"the model has {len(self.input_specs)} inputs; files feed single-input "
                "models only: use infer() with arrays"
            )
        return load_input(path, self.input_specs[0], self.normalization, self.resize)

    def load(self, path: str) -> list[np.ndarray]:
        """An input file as the model's input tensors."""
        return [self.prepare(path).tensor]

    def _load_with_geometry(self, path: str) -> tuple[list[np.ndarray], Geometry]:
        prepared = self.prepare(path)
        return [prepared.tensor], prepared.geometry

    # -- single inputs -----------------------------------------------------------------

    def infer(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One inference (through every segment in turn when segmented)."""
        values = list(inputs)
        for engine in self.engine_set.engines if self.segmented else self.engine_set.engines[:1]:
            values = engine.run(values)
        return values

    def _source(self, source: str | np.ndarray) -> Prepared:
        if isinstance(source, str):
            return self.prepare(source)
        array = np.asarray(source)
        shape = self.input_specs[0].shape
        size = (shape[2], shape[1]) if len(shape) == 4 else None
        return Prepared(array, Geometry(size, size, (1.0, 1.0), size))

    def run_timed(
        self, source: str | np.ndarray, count: int = 1, options: TaskOptions | None = None
    ) -> tuple[Any, list[float]]:
        """Run one input ``count`` times (as pycoral's examples do): this task's result and
        each time in ms. The first time includes the Edge TPU's model upload; report it apart."""
        prepared = self._source(source)
        times, outputs = [], []
        for _ in range(max(1, count)):
            started = time.perf_counter()
            outputs = self.infer([prepared.tensor])
            times.append((time.perf_counter() - started) * 1000)
        options = options or TaskOptions(labels=self.labels)
        return self.task.process(outputs, self.output_specs, prepared.geometry, options), times

    def run(self, source: str | np.ndarray, options: TaskOptions | None = None) -> Any:
        """This task's result for one input: classes, objects, a segmentation or raw outputs."""
        return self.run_timed(source, 1, options)[0]

    def classify(self, source: str | np.ndarray, top_k: int = 1, threshold: float = 0.0) -> list[Class]:
        """Top classes of one input, whatever the recognised task (the model must have one [1, N] output)."""
        classify = self.task if isinstance(self.task, Classify) else Classify()
        prepared = self._source(source)
        outputs = self.infer([prepared.tensor])
        return classify.process(
            outputs, self.output_specs, prepared.geometry, TaskOptions(self.labels, top_k, threshold)
        )

    def options(self, top_k: int = 1, threshold: float | None = None) -> TaskOptions:
        """Task options with this runner's labels."""
        return TaskOptions(self.labels, top_k, threshold)

    # -- batches -------------------------------------------------------------------------

    def _record(
        self,
        key: str,
        item_outputs: list[np.ndarray] | None,
        geometry: Geometry | None,
        error: str | None,
        options: TaskOptions,
        annotate_dir: str | None,
    ) -> dict:
        if error is not None:
            return {"input": key, "error": error}
        assert item_outputs is not None
        result = self.task.process(item_outputs, self.output_specs, geometry or Geometry(), options)
        record = {"input": key, **self.task.record(result)}
        if annotate_dir and not key.lower().endswith(".npy"):
            target = annotated_path(annotate_dir, key)
            try:
                self.task.annotate(key, result, target)
            except SlurmTpuError as exc:
                return {"input": key, "error": str(exc)}
            record["annotated"] = target
        return record

    def run_batch(
        self,
        inputs: Sequence[str],
        output: str | None = None,
        fmt: str = JSONL,
        options: TaskOptions | None = None,
        decode_threads: int | None = None,
        progress: Progress | None = None,
        expand: bool = True,
        stdout_write: Callable[[str], Any] | None = None,
        annotate_dir: str | None = None,
    ) -> BatchSummary:
        """Run every input, appending its record to ``output`` (resumable).

        ``inputs`` are expanded (directories, globs, list files) unless ``expand`` is
        False (the caller already listed and sharded them). ``annotate_dir``: write an
        annotated image per image input there (see :func:`annotated_path`).
        """
        keys = list(dict.fromkeys(list_inputs(inputs) if expand else inputs))  # de-duplicate, keep order
        options = options or TaskOptions(labels=self.labels)
        if annotate_dir:
            self.check_annotate(annotate_dir, keys)
        layout = Layout(fmt, self.task, options)
        writer: ResultWriter | _StdoutWriter
        if output:
            writer = ResultWriter(output, layout)
        else:
            import sys

            writer = _StdoutWriter(layout, stdout_write or sys.stdout.write)
        started = time.perf_counter()
        todo = [k for k in keys if k not in writer.done]
        skipped = len(keys) - len(todo)
        progress = progress or Progress(len(todo), enabled=False)
        progress.total, progress.skipped = len(todo), skipped
        processed = errors = 0
        threads = decode_threads or self._decode_threads()
        try:
            decoded = decode_ordered(
                todo,
                self._load_with_geometry,
                threads=threads,
                lookahead=max(8, 4 * threads * len(self.engine_set.engines)),
            )
            for item in infer_ordered(self.engine_set.engines, decoded, chain=self.segmented):
                record = self._record(item.key, item.outputs, item.meta, item.error, options, annotate_dir)
                writer.write(record)
                processed += 1
                failed = "error" in record
                errors += failed
                progress.update(1, int(failed))
        finally:
            writer.close()
            progress.close()
        return BatchSummary(len(keys), skipped, processed, errors, time.perf_counter() - started)

    def check_annotate(self, directory: str, keys: Sequence[str]) -> None:
        """Refuse --annotate before any work when it cannot be done (see :func:`check_annotate_dir`)."""
        if not self.task.draws:
            raise UsageError(f"--annotate draws classify, detect and segment results, not {self.task.name}")
        check_annotate_dir(directory, keys)

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
        return benchmark(
            engine,
            inputs,
            iterations,
            self.engine_set.load_seconds,
            self.engine_set.runtime,
            self.engine_set.edgetpu_version,
        )

    def close(self) -> None:
        self.engine_set.close()

    def __enter__(self) -> Runner:
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


def annotated_path(directory: str, key: str) -> str:
    """Where the annotated copy of input ``key`` goes: ``DIR/<input name without suffix>.png``."""
    return os.path.join(directory, os.path.splitext(os.path.basename(key))[0] + ".png")


def check_annotate_dir(directory: str, keys: Sequence[str]) -> None:
    """Refuse before any work: two inputs that would share an annotated file, or an
    annotated file that would overwrite an input."""
    os.makedirs(directory, exist_ok=True)
    seen: dict[str, str] = {}
    inputs = {os.path.realpath(k) for k in keys}
    for key in keys:
        if key.lower().endswith(".npy"):
            continue
        target = annotated_path(directory, key)
        if target in seen:
            raise UsageError(
                f"inputs {seen[target]} and {key} would both be annotated as {target}: "
                "rename one, or annotate them in separate runs"
            )
        if os.path.realpath(target) in inputs:
            raise UsageError(f"--annotate {directory} would overwrite input {key}: choose another directory")
        seen[target] = key
