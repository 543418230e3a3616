"""What ``slurm-tpu infer`` (and, for the shared parts, ``serve``) asks of the runner.

Plain typed values with the defaults the CLI shows, for :func:`slurm_tpu.runner.dispatch.infer`.
Stdlib-only like ``choices``: the CLI reads these defaults at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .choices import AUTO


@dataclass
class OpenOptions:
    """How to open a model; every field has a sensible default for a Slurm job."""

    device: Sequence[str] = ()  # --device values; empty: from the job's environment
    libedgetpu: str | None = None  # else $SLURM_TPU_LIBEDGETPU, else libedgetpu.so.1
    fallback: str | None = None  # "cpu": run on the CPU when the GPU cannot be set up
    num_threads: int | None = None  # CPU threads per interpreter; default: CPUs / engines
    runtime: str | None = None  # "litert" | "tflite-runtime"; default: the first importable


@dataclass(frozen=True)
class Preprocessing:
    """How input files become tensors (``serve`` takes the same, set at serve time)."""

    input_mean: float | None = None  # None: the model's input quantization
    input_std: float | None = None
    fast_resize: bool = False  # JPEG draft decoding + BILINEAR instead of pycoral's LANCZOS
    keep_aspect_ratio: bool = False  # segmentation pads instead of stretching


@dataclass(frozen=True)
class Reading:
    """How to read the outputs: what they mean, and which results to report."""

    task: str = AUTO  # a task name, or auto: recognised from the model's outputs
    raw: bool = False  # --raw: the same as task "raw"
    labels: str | None = None  # labels file
    top_k: int = 1  # classify: classes to report
    threshold: float | None = None  # minimum score; None: the task's own default


@dataclass(frozen=True)
class BatchOptions:
    """Many inputs: where the results go, which share is this process's, how it reports."""

    output: str | None = None  # results file (sbatch patterns expanded); None: stdout
    fmt: str | None = None  # jsonl or csv; None: by the output's suffix
    shard_index: int | None = None  # with shard_count; None: from the Slurm environment
    shard_count: int | None = None
    decode_threads: int | None = None  # threads decoding inputs ahead of the device
    progress_interval: float = 30.0  # seconds between progress lines when stderr is not a terminal
    progress: bool = True


@dataclass(frozen=True)
class RemoteOptions:
    """Inputs answered by ``slurm-tpu serve`` in another job instead of a device here."""

    server: str | None = None  # JOBID or HOST:PORT; None: run locally
    in_flight: int = 8  # requests in flight at once


@dataclass(frozen=True)
class InferRequest:
    """One ``slurm-tpu infer`` run: the model, its inputs, and how to run and report them."""

    model: str
    inputs: tuple[str, ...] = ()  # files, directories, globs, @list files
    segments: tuple[str, ...] = ()  # further segments of a model split by edgetpu_compiler
    reading: Reading = field(default_factory=Reading)
    preprocessing: Preprocessing = field(default_factory=Preprocessing)
    opening: OpenOptions = field(default_factory=OpenOptions)
    batch: BatchOptions = field(default_factory=BatchOptions)
    remote: RemoteOptions = field(default_factory=RemoteOptions)
    count: int = 5  # one input: inferences to time
    benchmark: bool = False
    iterations: int = 100  # benchmark iterations
    annotate_dir: str | None = None  # write each image input with its results drawn here
