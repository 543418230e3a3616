"""The Python API: open a model on the job's device(s) once, then run inputs, batches or benchmarks
(docs/user-guide.md shows its use)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from .devices import EDGETPU
from .errors import SlurmTpuError, UsageError
from .inputs import list_inputs
from .modelinfo import TensorSpec
from .pipeline import Item, decode_ordered, infer_ordered
from .preprocess import Geometry, Normalization, Prepared, Resize, as_input, load_input
from .results import JSONL, Layout, Progress, ResultWriter, write_batch
from .session import EngineSet, OpenOptions, open_models, usable_cpus
from .tasks import AUTO, Class, Task, TaskOptions, choose_task, read_labels
from .tasks.classify import Classify

_log = logging.getLogger("slurm_tpu.runner")


@dataclass(frozen=True)
class BatchSummary:
    total: int  # inputs in this run's share
    skipped: int  # already in the results file (resumed)
    processed: int
    errors: int
    seconds: float


@dataclass(frozen=True)
class BenchResult:
    """A benchmark's figures (:meth:`Runner.benchmark`): load time, first inference apart, latency
    percentiles, throughput."""

    device: str
    runtime: str
    load_ms: float
    first_ms: float  # includes the Edge TPU's model upload
    iterations: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    throughput_per_s: float
    edgetpu_version: str | None = None  # edgetpu_version() of the libedgetpu used, on an Edge TPU

    def as_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        rows = [
            ("device", self.device),
            ("runtime", self.runtime),
            ("load", f"{self.load_ms:.1f} ms"),
            ("first inference", f"{self.first_ms:.2f} ms"),
            ("iterations", str(self.iterations)),
            ("latency p50", f"{self.p50_ms:.2f} ms"),
            ("latency p90", f"{self.p90_ms:.2f} ms"),
            ("latency p99", f"{self.p99_ms:.2f} ms"),
            ("mean", f"{self.mean_ms:.2f} ms"),
            ("throughput", f"{self.throughput_per_s:.1f} inferences/s"),
        ]
        if self.edgetpu_version:
            rows.insert(2, ("libedgetpu", self.edgetpu_version))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows) + "\n"


def random_inputs(specs: Sequence[TensorSpec], seed: int = 0) -> list[np.ndarray]:
    """Inputs of the right shape and dtype (benchmarks do not depend on the values)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in specs:
        if np.issubdtype(s.dtype, np.integer):
            info = np.iinfo(s.dtype)
            out.append(rng.integers(info.min, info.max, size=s.shape, dtype=s.dtype, endpoint=True))
        else:
            out.append(rng.standard_normal(s.shape).astype(s.dtype))
    return out


def percentile(sorted_ms: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_ms:
        return 0.0
    rank = max(1, int(np.ceil(q / 100 * len(sorted_ms))))
    return float(sorted_ms[rank - 1])


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
        segments = [str(model)] if isinstance(model, (str, os.PathLike)) else [str(m) for m in model]
        self.segmented = len(segments) > 1
        self.labels = read_labels(labels)  # before the device: a bad path costs no TPU time
        self.engine_set: EngineSet = open_models(segments, options, environ, warn, segmented=self.segmented)
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

    @property
    def input_specs(self) -> Sequence[TensorSpec]:
        return self.engine_set.engines[0].inputs

    @property
    def output_specs(self) -> Sequence[TensorSpec]:
        return self.engine_set.engines[-1].outputs

    @property
    def on_edgetpu(self) -> bool:
        return self.engine_set.engines[0].device.kind == EDGETPU

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

    def infer(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One inference (through every segment in turn when segmented)."""
        values = list(inputs)
        for engine in self.engine_set.engines if self.segmented else self.engine_set.engines[:1]:
            values = engine.run(values)
        return values

    def run_timed(
        self, source: str | np.ndarray, count: int = 1, options: TaskOptions | None = None, task: Task | None = None
    ) -> tuple[Any, list[float]]:
        """Run one input ``count`` times (as pycoral's examples do): the result of ``task``
        (default: this runner's) and each time in ms. The first time includes the Edge TPU's
        model upload; report it apart."""
        prepared = (
            self.prepare(source) if isinstance(source, str) else as_input(np.asarray(source), self.input_specs[0])
        )
        times, outputs = [], []
        for _ in range(max(1, count)):
            started = time.perf_counter()
            outputs = self.infer([prepared.tensor])
            times.append((time.perf_counter() - started) * 1000)
        options = options or TaskOptions(labels=self.labels)
        return (task or self.task).process(outputs, self.output_specs, prepared.geometry, options), times

    def run(self, source: str | np.ndarray, options: TaskOptions | None = None) -> Any:
        """This task's result for one input: classes, objects, a segmentation or raw outputs."""
        return self.run_timed(source, 1, options)[0]

    def classify(self, source: str | np.ndarray, top_k: int = 1, threshold: float = 0.0) -> list[Class]:
        """Top classes of one input, whatever the recognised task (the model must have one [1, N] output)."""
        classify = self.task if isinstance(self.task, Classify) else Classify()
        return self.run_timed(source, 1, self.options(top_k, threshold), classify)[0]

    def options(self, top_k: int = 1, threshold: float | None = None) -> TaskOptions:
        """Task options with this runner's labels."""
        return TaskOptions(self.labels, top_k, threshold)

    def _record(self, item: Item, options: TaskOptions, annotate_dir: str | None) -> dict:
        key = item.key
        if item.error is not None:
            return {"input": key, "error": item.error}
        assert item.outputs is not None
        result = self.task.process(item.outputs, self.output_specs, item.meta or Geometry(), options)
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
        writer = ResultWriter(output, Layout(fmt, self.task, options), stdout_write)
        started = time.perf_counter()
        progress = progress or Progress(enabled=False)
        threads = decode_threads or self._decode_threads()

        def records(todo: list[str]) -> Iterator[dict]:
            lookahead = max(8, 4 * threads * len(self.engine_set.engines))
            decoded = decode_ordered(todo, self._load_with_geometry, threads=threads, lookahead=lookahead)
            for item in infer_ordered(self.engine_set.engines, decoded, chain=self.segmented):
                yield self._record(item, options, annotate_dir)

        processed, errors = write_batch(keys, writer, progress, records)
        return BatchSummary(len(keys), progress.skipped, processed, errors, time.perf_counter() - started)

    def check_annotate(self, directory: str, keys: Sequence[str]) -> None:
        """Refuse --annotate before any work when it cannot be done: a task that draws nothing, two
        inputs that would share an annotated file, or an annotated file that would overwrite an input."""
        if not self.task.draws:
            raise UsageError(f"--annotate draws classify, detect and segment results, not {self.task.name}")
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

    def _decode_threads(self) -> int:
        """Decoders to run ahead of the device.

        A CPU interpreter already uses every core with XNNPACK's statically split
        work, so extra decoders only make its threads wait for each other: one
        decoder fills the gaps. An Edge TPU or GPU leaves the CPU idle during
        invoke(): then decode on several cores.
        """
        if all(e.label == "cpu" for e in self.engine_set.engines):
            return 1
        return max(1, min(4, usable_cpus()))

    def benchmark(self, iterations: int = 100, source: str | None = None) -> BenchResult:
        """Latency and throughput on the first device (the whole chain when segmented, one input
        at a time): ``iterations`` inferences timed after the first one, which is reported apart."""
        inputs = self.load(source) if source else random_inputs(self.input_specs)
        run = self.infer if self.segmented else self.engine_set.engines[0].run
        started = time.perf_counter()
        run(inputs)
        first = time.perf_counter() - started
        latencies = []
        total_start = time.perf_counter()
        for _ in range(iterations):
            t = time.perf_counter()
            run(inputs)
            latencies.append((time.perf_counter() - t) * 1000)
        total = time.perf_counter() - total_start
        latencies.sort()
        return BenchResult(
            " -> ".join(self.device_labels) if self.segmented else self.device_labels[0],
            self.engine_set.runtime,
            self.engine_set.load_seconds * 1000,
            first * 1000,
            iterations,
            percentile(latencies, 50),
            percentile(latencies, 90),
            percentile(latencies, 99),
            float(np.mean(latencies)) if latencies else 0.0,
            iterations / total if total > 0 else 0.0,
            self.engine_set.edgetpu_version,
        )

    def close(self) -> None:
        self.engine_set.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def annotated_path(directory: str, key: str) -> str:
    """Where the annotated copy of input ``key`` goes: ``DIR/<input name without suffix>.png``."""
    return os.path.join(directory, os.path.splitext(os.path.basename(key))[0] + ".png")
