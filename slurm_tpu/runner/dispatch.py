"""Which mode a ``slurm-tpu infer`` request runs in, and running it.

The modes: one input (timed, for pycoral's printout), a batch, a benchmark, and the first two
through ``slurm-tpu serve`` (``--server``). :func:`infer` returns what came of a run for the
caller to render; a batch's records and progress lines stream out through :class:`Streams`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, TextIO, Union

from .api import BenchResult, Runner, annotated_path
from .choices import AUTO, RAW
from .errors import UsageError
from .inputs import expand_output_pattern, list_inputs, shard, shard_from_environment
from .preprocess import Normalization, is_input_file
from .request import InferRequest
from .results import Layout, Progress, ResultWriter, format_for, write_batch
from .tasks import Task, TaskOptions


@dataclass(frozen=True)
class Streams:
    """Where a run's output goes while it runs (for the CLI: stdout and stderr)."""

    write: Callable[[str], Any]  # batch records, when there is no output file
    warn: Callable[[str], None]  # one-line warnings
    task_recognised: Callable[[str], None]  # batch: the task (named) was recognised from the outputs
    progress: TextIO  # progress lines


@dataclass(frozen=True)
class Timed:
    """One input run ``count`` times on this job's device(s)."""

    input: str
    task: Task
    result: Any  # the task's result (classes, objects, a segmentation, outputs)
    times: list[float]  # ms; the first includes loading the model onto an Edge TPU
    devices: list[str]
    runtime: str
    load_seconds: float
    on_edgetpu: bool
    annotated: str | None  # the annotated copy written, if asked for


@dataclass(frozen=True)
class RemoteTimed:
    """One input sent ``count`` times to a server."""

    input: str
    task: Task
    record: dict[str, Any]  # the server's answer: devices, runtime, results, its printout lines
    times: list[float]  # round trips, ms
    server: str  # the server's URL


@dataclass(frozen=True)
class BatchDone:
    """A batch (this process's share), locally or through a server."""

    processed: int
    errors: int
    output: str | None  # the results file written; None: stdout


Outcome = Union[Timed, RemoteTimed, BatchDone, BenchResult]


def is_batch(inputs: Sequence[str], output: str | None) -> bool:
    """Anything but one input file without an output file runs as a batch."""
    if output or len(inputs) != 1:
        return True
    only = inputs[0]
    return only.startswith("@") or os.path.isdir(only) or not is_input_file(only)


def _task_name(request: InferRequest) -> str:
    reading = request.reading
    if not reading.raw:
        return reading.task
    if reading.task not in (AUTO, RAW):
        raise UsageError(f"--raw contradicts --task {reading.task}")
    return RAW


def _set_locally(request: InferRequest) -> list[str]:
    """The options given that only a local run takes, as flags (with --server they are the server's)."""
    opening, prep = request.opening, request.preprocessing
    local_only = {
        "--labels": request.reading.labels,
        "--annotate": request.annotate_dir,
        "--device": opening.device,
        "--segment": request.segments,
        "--fallback": opening.fallback,
        "--threads": opening.num_threads,
        "--benchmark": request.benchmark,
        "--fast-resize": prep.fast_resize,
        "--keep-aspect-ratio": prep.keep_aspect_ratio,
        "--input-mean": prep.input_mean is not None,
        "--input-std": prep.input_std is not None,
    }
    return [flag for flag, value in local_only.items() if value]


def infer(request: InferRequest, streams: Streams, environ: Mapping[str, str] = os.environ) -> Outcome:
    """Run ``request`` in its mode; usage mistakes raise :class:`UsageError` before any device is opened."""
    task = _task_name(request)
    batch = request.batch
    if (batch.shard_index is None) != (batch.shard_count is None):
        raise UsageError("--shard-index and --shard-count go together")
    if not request.inputs and not request.benchmark:
        raise UsageError("no inputs: give image/.npy files, a directory, a glob or @list (or --benchmark)")
    batched = not request.benchmark and is_batch(request.inputs, batch.output)
    keys: list[str] = []
    listed: list[str] = []
    if batched:
        # List and shard before opening the device: a bad input path fails in milliseconds.
        keys = listed = list_inputs(request.inputs)
        share = (
            (batch.shard_index, batch.shard_count) if batch.shard_count is not None else shard_from_environment(environ)
        )
        if share is not None:
            # With --shard-count given, --shard-index is too (both or neither, checked above): ints.
            if batch.shard_count is not None and share[0] >= share[1]:  # type: ignore[operator]
                raise UsageError(f"--shard-index {batch.shard_index} must be below --shard-count {batch.shard_count}")
            keys = shard(keys, *share)  # type: ignore[arg-type]
    out = expand_output_pattern(batch.output, environ) if batched and batch.output else None
    if request.remote.server:
        given = _set_locally(request)
        if given:
            raise UsageError(f"{', '.join(given)}: set at the server ('slurm-tpu serve'), not with --server")
        progress = Progress(streams.progress, batch.progress_interval, enabled=batch.progress)
        return _remote(request, task, request.inputs[0] if not batched else None, keys, out, progress, streams, environ)
    return _local(request, task, keys if batched else None, listed, out, streams, environ)


def _local(
    request: InferRequest,
    task: str,
    keys: list[str] | None,
    listed: list[str],
    out: str | None,
    streams: Streams,
    environ: Mapping[str, str],
) -> Outcome:
    """On this job's device(s): a benchmark, a batch (``keys``: this share, into ``out``) or one input."""
    prep, batch, reading = request.preprocessing, request.batch, request.reading
    with Runner(
        [request.model, *request.segments],  # one file: not segmented
        reading.labels,
        request.opening,
        environ=environ,
        warn=streams.warn,
        normalization=Normalization(prep.input_mean, prep.input_std),
        task=task,
        fast_resize=prep.fast_resize,
        keep_aspect_ratio=prep.keep_aspect_ratio,
    ) as runner:
        task_options = runner.options(reading.top_k, reading.threshold)
        if request.benchmark:
            return runner.benchmark(request.iterations, request.inputs[0] if request.inputs else None)
        if keys is None:  # one input, timed
            path, annotated = request.inputs[0], None
            result, times = runner.run_timed(path, request.count, task_options)
            if request.annotate_dir:
                runner.check_annotate(request.annotate_dir, [path])
                annotated = annotated_path(request.annotate_dir, path)
                runner.task.annotate(path, result, annotated)
            return Timed(
                path,
                runner.task,
                result,
                times,
                runner.device_labels,
                runner.engine_set.runtime,
                runner.engine_set.load_seconds,
                runner.on_edgetpu,
                annotated,
            )
        if request.annotate_dir:
            runner.check_annotate(request.annotate_dir, listed)  # all shares: names must not collide across tasks
        if runner.task_reason != "--task" and batch.progress:
            # Said in the job's log next to the progress lines; a single input's printout
            # (and its --json "task") shows the task by itself.
            streams.task_recognised(runner.task.name)
        progress = Progress(streams.progress, batch.progress_interval, enabled=batch.progress)
        summary = runner.run_batch(
            keys,
            out,
            format_for(out or "", batch.fmt),
            task_options,
            batch.decode_threads,
            progress,
            expand=False,
            stdout_write=streams.write,
            annotate_dir=request.annotate_dir,
        )
        return BatchDone(summary.processed, summary.errors, out)


def _remote(
    request: InferRequest,
    task: str,
    single: str | None,
    keys: list[str],
    out: str | None,
    progress: Progress,
    streams: Streams,
    environ: Mapping[str, str],
) -> Outcome:
    """``infer --server``: the same inputs and outputs as local inference, answered by a server."""
    from .serve.client import RemoteModel, ServeClient, remote_records, resolve_target, result_fields

    reading, batch = request.reading, request.batch
    client = ServeClient(resolve_target(request.remote.server or "", environ))
    try:
        remote = RemoteModel(client, request.model, task)
        options = {"top_k": reading.top_k, "threshold": reading.threshold}
        if single is not None:  # sent ``count`` times: the record and each round trip in ms
            times, record = [], {}
            for _ in range(max(1, request.count)):
                started = time.perf_counter()
                record = remote.infer(single, options)
                times.append((time.perf_counter() - started) * 1000)
            return RemoteTimed(single, remote.task, record, times, client.url)
        task_options = TaskOptions(top_k=reading.top_k, threshold=reading.threshold)
        writer = ResultWriter(out, Layout(format_for(out or "", batch.fmt), remote.task, task_options), streams.write)
        in_flight = request.remote.in_flight
        processed, errors = write_batch(
            keys, writer, progress, lambda todo: map(result_fields, remote_records(remote, todo, options, in_flight))
        )
        return BatchDone(processed, errors, out)
    finally:
        client.close()
