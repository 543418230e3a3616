"""Open a model on the job's devices: policy (which errors, which warnings) + ordering.

The order matters and is the reason this module exists: lock the device, create its
delegate by path, build the interpreter; on close, the reverse (interpreter, then
delegate, then lock), so no other process can grab a TPU that is still in use.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Callable

from ..errors import DeviceError
from ..protocol import jobenv
from . import edgetpu_faults, engines, gpu_select
from .devices import CPU, EDGETPU, GPU, Device, resolve_devices
from .errors import GpuError, ModelError, UsageError
from .lock import DeviceLock
from .meter import MeteredEngine, report_usage
from .modelinfo import ModelInfo, read_model_info
from .request import OpenOptions  # defined with the rest of a request; api and serve import it here
from .spec import Engine

Warn = Callable[[str], None]
_log = logging.getLogger("slurm_tpu.runner")


@dataclass
class EngineSet:
    """Open engines (one per device, or per segment) and the locks that guard them."""

    engines: list[Engine]
    devices: list[Device]
    runtime: str
    load_seconds: float
    models: list[ModelInfo]
    _locks: list[DeviceLock] = field(default_factory=list)
    environ: Mapping[str, str] = field(default_factory=dict)
    edgetpu_version: str | None = None  # edgetpu_version() when an Edge TPU was opened

    def __post_init__(self) -> None:
        # Count every inference per device, whichever mode drives the engines.
        self.engines = [MeteredEngine(e, d.identity) for e, d in zip(self.engines, self.devices)]

    def close(self) -> None:
        if self.engines:
            # MeteredEngines since __init__ (see above), which the field types as Engine.
            report_usage(self.engines, self.environ)  # type: ignore[arg-type]
        for engine in reversed(self.engines):
            engine.close()
        for lock in reversed(self._locks):
            lock.release()
        self.engines, self._locks = [], []

    def __enter__(self) -> EngineSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cpu_threads(engines: int) -> int:
    try:
        cpus = len(os.sched_getaffinity(0))  # what Slurm's cgroup/affinity gave us
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus // max(engines, 1))


class _Opener:
    def __init__(self, options: OpenOptions, warn: Warn):
        self.options = options
        self.warn = warn
        self.runtime = engines.select_runtime(options.runtime)
        self.library: engines.EdgeTpuLibrary | None = None
        self.locks: list[DeviceLock] = []
        self.engines: list[Engine] = []
        self._held: dict[str, DeviceLock] = {}  # identity -> its lock: several models may share a device

    def threads(self, engines: int) -> int:
        return self.options.num_threads or _cpu_threads(engines)

    def open(self, model: ModelInfo, device: Device, threads: int, environ: Mapping[str, str]) -> Engine:
        if device.kind == EDGETPU:
            engine = self._open_edgetpu(model, device, threads, environ)
        elif device.kind == GPU:
            engine = self._open_gpu(model, threads, environ)
        else:
            engine = engines.InterpreterEngine(model.path, CPU, self.runtime, threads)
        self.engines.append(engine)
        return engine

    def _open_edgetpu(self, model: ModelInfo, device: Device, threads: int, environ: Mapping[str, str]) -> Engine:
        if self.library is None:
            self.library = engines.EdgeTpuLibrary(self.options.libedgetpu)
        # Never ask libedgetpu to open what it does not list: on a USB path it cannot
        # enumerate it retries for about 25 s before giving up.
        listed = self.library.list_devices()
        if (device.edgetpu_type, device.path) not in listed:
            # The library reads the variable from this process's own environment.
            visible = os.environ.get(jobenv.EDGETPU_VISIBLE)
            raise DeviceError(edgetpu_faults.absent_message(device, listed, visible), device.identity)
        lock = self._held.get(device.identity) or DeviceLock(device.identity, environ)
        log: list[str] = []
        delegate = self.library.create_delegate(device.edgetpu_type or "usb", device.path or "", log=log)
        if delegate is None:
            if device.identity not in self._held:
                lock.release()
            reason = engines.libedgetpu_reason(log, device.path or "")
            raise DeviceError(edgetpu_faults.open_failure_message(device, reason), device.identity)
        if device.identity not in self._held:
            self._held[device.identity] = lock
            self.locks.append(lock)
        return engines.InterpreterEngine(model.path, device.label, self.runtime, threads, delegate)

    def _open_gpu(self, model: ModelInfo, threads: int, environ: Mapping[str, str]) -> Engine:
        choice = gpu_select.choose(environ)
        if choice.uncertain:
            self.warn(f"LiteRT will use {choice.how}")
        _log.info("GPU: %s", choice.how)
        gpu_select.apply(choice)  # this process's own environment, which Vulkan reads
        try:
            return engines.GpuEngine(model.path, model.inputs, model.outputs)
        except GpuError as exc:
            if self.options.fallback != CPU:
                raise
            self.warn(f"{exc}; falling back to the CPU as --fallback cpu asked")
            return engines.InterpreterEngine(model.path, CPU, self.runtime, threads)

    def open_all(
        self,
        pairs: Sequence[tuple[ModelInfo, Device]],
        environ: Mapping[str, str],
        warnings: Sequence[str],
        concurrent: int | None = None,
    ) -> None:
        """Open every (model, device) pair, or none: a failure closes what was opened.

        ``concurrent``: how many engines will run at once (default: all), which shares
        out the CPU threads. The warnings are emitted only once every device opened,
        so a failing run prints its one error line and nothing else.
        """
        threads = self.threads(concurrent or len(pairs))
        try:
            for model, device in pairs:
                self.open(model, device, threads, environ)
        except BaseException:
            self.abort()
            raise
        for message in warnings:
            self.warn(message)

    def edgetpu_version(self) -> str | None:
        return self.library.version() if self.library is not None else None

    def abort(self) -> None:
        for engine in reversed(self.engines):
            engine.close()
        for lock in reversed(self.locks):
            lock.release()


def _check_model_fits(model: ModelInfo, devices: list[Device]) -> list[str]:
    """Raise when the model cannot run on these devices; return warnings to emit once opened
    (a failing run then prints only its error, on one line)."""
    kind = devices[0].kind
    if model.is_edgetpu and kind != EDGETPU:
        raise ModelError(
            f"model {model.path} is compiled for the Edge TPU (contains edgetpu-custom-op) "
            f"but this job has no Edge TPU ({kind} only): submit with --gres=tpu:1, or "
            "pass --device usb:PATH|pci:PATH",
            model.path,
        )
    if kind == EDGETPU and not model.is_edgetpu:
        return [
            f"model {model.path} is not compiled for the Edge TPU (no edgetpu-custom-op): it runs on "
            "the CPU; compile it with edgetpu_compiler to use the TPU"
        ]
    return []


def open_engines(
    model_path: str,
    options: OpenOptions | None = None,
    environ: Mapping[str, str] = os.environ,
    warn: Warn = _log.warning,
) -> EngineSet:
    """One engine per device the job was given (or --device named)."""
    options = options or OpenOptions()
    model = read_model_info(model_path)
    devices = resolve_devices(options.device, environ)
    warnings = _check_model_fits(model, devices)
    started = time.perf_counter()
    opener = _Opener(options, warn)
    opener.open_all([(model, device) for device in devices], environ, warnings)
    return EngineSet(
        opener.engines,
        devices,
        opener.runtime,
        time.perf_counter() - started,
        [model],
        opener.locks,
        environ,
        opener.edgetpu_version(),
    )


def open_segments(
    segment_paths: Sequence[str],
    options: OpenOptions | None = None,
    environ: Mapping[str, str] = os.environ,
    warn: Warn = _log.warning,
) -> EngineSet:
    """Segment i of a model split by ``edgetpu_compiler --num_segments`` on device i.

    On the CPU (no TPU allocated) every segment gets its own CPU interpreter, which
    keeps the pipeline testable anywhere.
    """
    options = options or OpenOptions()
    models = [read_model_info(p) for p in segment_paths]
    devices = resolve_devices(options.device, environ)
    kind = devices[0].kind
    if kind == EDGETPU and len(devices) < len(models):
        raise UsageError(
            f"{len(models)} model segments need {len(models)} Edge TPUs but this job has "
            f"{len(devices)}: submit with --gres=tpu:{len(models)}"
        )
    if kind != EDGETPU:
        devices = [devices[0]] * len(models)
    warnings = list(dict.fromkeys(w for m, d in zip(models, devices) for w in _check_model_fits(m, [d])))
    started = time.perf_counter()
    opener = _Opener(options, warn)
    opener.open_all(list(zip(models, devices)), environ, warnings)
    return EngineSet(
        opener.engines,
        devices[: len(models)],
        opener.runtime,
        time.perf_counter() - started,
        models,
        opener.locks,
        environ,
        opener.edgetpu_version(),
    )


def open_models(
    model_paths: Sequence[str],
    options: OpenOptions | None = None,
    environ: Mapping[str, str] = os.environ,
    warn: Warn = _log.warning,
) -> EngineSet:
    """Several models on every device the job was given (``slurm-tpu serve``): one lock per
    device, one engine per (model, device), model-major: the engines of model i are
    ``engines[i * D:(i + 1) * D]`` for D devices. Edge TPU models compiled together
    (``edgetpu_compiler a.tflite b.tflite``) share a device's parameter cache."""
    options = options or OpenOptions()
    models = [read_model_info(p) for p in model_paths]
    devices = resolve_devices(options.device, environ)
    warnings = list(dict.fromkeys(w for m in models for w in _check_model_fits(m, devices)))
    pairs = [(model, device) for model in models for device in devices]
    started = time.perf_counter()
    opener = _Opener(options, warn)
    opener.open_all(pairs, environ, warnings, concurrent=len(devices))  # one inference per device at a time
    return EngineSet(
        opener.engines,
        [d for _, d in pairs],
        opener.runtime,
        time.perf_counter() - started,
        models,
        opener.locks,
        environ,
        opener.edgetpu_version(),
    )
