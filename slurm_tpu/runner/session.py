"""Open a model on the job's devices: policy (which errors, which warnings) + ordering.

The order is the reason this module exists: lock the device, create its delegate by
path, build the interpreter; on close the reverse, so no other process can grab a TPU
that is still in use. Why an allocated Edge TPU cannot be used is one line naming it,
the cause and the fix, as seen with the real libedgetpu (tests/libedgetpu).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import DeviceError
from ..families.coral import USB_BOOTLOADER, USB_IDS, USB_RUNTIME
from ..identity import is_identity
from ..protocol import jobenv
from ..protocol.usage import USAGE_DIR_ENV, add_usage
from . import engines, gpu_select
from .devices import BROKER, CPU, EDGETPU, GPU, Device, resolve_devices
from .engines import EdgeTpuLibrary
from .errors import GpuError, ModelError, UsageError
from .lock import DeviceLock
from .modelinfo import Engine, ModelInfo, read_model_info
from .request import OpenOptions  # defined with the rest of a request; api and serve import it here

Warn = Callable[[str], None]
_log = logging.getLogger("slurm_tpu.runner")


class MeteredEngine:
    """An Engine that counts its runs and the device time spent in them: the wall time of each
    run, or for an engine that knows its device's own time (``device_seconds``: a broker engine,
    whose runs overlap and wait behind other jobs') that time."""

    def __init__(self, engine, device: Device):
        self._engine = engine
        self.device = device
        self.label = engine.label
        self.inputs = engine.inputs
        self.outputs = engine.outputs
        self.in_flight = getattr(engine, "in_flight", 1)  # callers that may share it (pipeline, serve)
        self._device_seconds = getattr(engine, "device_seconds", None)
        self._lock = threading.Lock()  # a shared engine's runs end in several threads
        self.inferences = 0
        self._wall = 0.0

    @property
    def seconds(self) -> float:
        return self._device_seconds() if self._device_seconds is not None else self._wall

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        started = time.perf_counter()
        try:
            return self._engine.run(inputs)
        finally:
            elapsed = time.perf_counter() - started
            with self._lock:
                self._wall += elapsed
                self.inferences += 1

    def close(self) -> None:
        self._engine.close()


@dataclass
class EngineSet:
    """Engines (one per device, or per segment) opened one by one, and the locks that guard them."""

    engines: list[MeteredEngine]  # each knows its device; every inference counted, whichever mode runs it
    runtime: str
    load_seconds: float
    models: list[ModelInfo]
    _locks: dict[str, DeviceLock] = field(default_factory=dict)  # identity -> its lock
    environ: Mapping[str, str] = field(default_factory=dict)
    _library: EdgeTpuLibrary | None = None  # loaded for the first Edge TPU

    @property
    def edgetpu_version(self) -> str | None:
        """edgetpu_version() of the libedgetpu loaded, when an Edge TPU was opened."""
        return self._library.version() if self._library is not None else None

    def report_usage(self) -> int:
        """Add this process's counts per leased device used to the job's usage box; how many were written.

        Called while the runner still holds its device locks: that serialises the
        read-modify-write of each device's record between the job's processes.
        """
        directory = self.environ.get(USAGE_DIR_ENV)
        if not directory:
            return 0
        totals: dict[str, tuple[int, float]] = {}
        for engine in self.engines:
            # A broker device is not counted here: the broker's own figures are the job's books.
            if engine.inferences and engine.device.kind != BROKER and is_identity(engine.device.identity):
                count, seconds = totals.get(engine.device.identity, (0, 0.0))
                totals[engine.device.identity] = (count + engine.inferences, seconds + engine.seconds)
        return sum(add_usage(directory, identity, count, seconds) for identity, (count, seconds) in totals.items())

    def close(self) -> None:
        self.report_usage()
        for engine in reversed(self.engines):
            engine.close()
        for lock in reversed(self._locks.values()):
            lock.release()
        self.engines, self._locks = [], {}

    def open(self, model: ModelInfo, device: Device, threads: int, options: OpenOptions, warn: Warn) -> None:
        """Open ``model`` on ``device`` and hold the engine (and the device's lock)."""
        if device.kind == EDGETPU:
            engine = self._open_edgetpu(model, device, threads, options.libedgetpu)
        elif device.kind == BROKER:
            from .broker_client import BrokerEngine

            engine = BrokerEngine(model.path, device.path or "", device.label)
        elif device.kind == GPU:
            engine = self._open_gpu(model, threads, options.fallback, warn)
        else:
            engine = engines.InterpreterEngine(model.path, CPU, self.runtime, threads)
        self.engines.append(MeteredEngine(engine, device))

    def _open_edgetpu(self, model: ModelInfo, device: Device, threads: int, libedgetpu: str | None) -> Engine:
        if self._library is None:
            self._library = EdgeTpuLibrary(libedgetpu)
        # Never ask libedgetpu to open what it does not list: on a USB path it cannot
        # enumerate it retries for about 25 s before giving up.
        listed = self._library.list_devices()
        if (device.edgetpu_type, device.path) not in listed:
            # The library reads the variable from this process's own environment.
            visible = os.environ.get(jobenv.EDGETPU_VISIBLE)
            raise DeviceError(absent_message(device, listed, visible), device.identity)
        lock = self._locks.get(device.identity) or DeviceLock(device.identity, self.environ)
        log: list[str] = []
        delegate = self._library.create_delegate(device.edgetpu_type or "usb", device.path or "", log=log)
        if delegate is None:
            if device.identity not in self._locks:
                lock.release()
            reason = engines.libedgetpu_reason(log, device.path or "")
            raise DeviceError(open_failure_message(device, reason), device.identity)
        self._locks[device.identity] = lock
        return engines.InterpreterEngine(model.path, device.label, self.runtime, threads, delegate)

    def _open_gpu(self, model: ModelInfo, threads: int, fallback: str | None, warn: Warn) -> Engine:
        choice = gpu_select.choose(self.environ)
        if choice.uncertain:
            warn(f"LiteRT will use {choice.how}")
        _log.info("GPU: %s", choice.how)
        gpu_select.apply(choice)  # this process's own environment, which Vulkan reads
        try:
            return engines.GpuEngine(model.path, model.inputs, model.outputs)
        except GpuError as exc:
            if fallback != CPU:
                raise
            warn(f"{exc}; falling back to the CPU as --fallback cpu asked")
            return engines.InterpreterEngine(model.path, CPU, self.runtime, threads)


CHECK = "run 'slurm-tpu detect --check-runtime' on the node"


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def absent_message(device: Device, listed: Sequence[tuple[str, str]], visible: str | None = None) -> str:
    """The device is not in libedgetpu's list: say why, from the process's
    ``EDGETPU_VISIBLE_DEVICES`` (``visible``; None: unset) and what sysfs and /dev show."""
    path = device.path or ""
    name = f"Edge TPU {device.identity}"
    usb = device.edgetpu_type == "usb"
    if not os.path.exists(path):
        if usb:
            return (
                f"{name} is not present: nothing at {path} (the stick was unplugged or moved to another "
                "port): plug it back into that port, or ask the admin to rerun 'slurm-tpu detect'"
            )
        return (
            f"{name} is not present: {path} does not exist (the apex driver is not loaded, or the card "
            f"is gone): {CHECK}"
        )
    ids = (_read_text(f"{path}/idVendor"), _read_text(f"{path}/idProduct")) if usb else None
    if ids is not None and ids not in USB_IDS:
        coral = " or ".join(":".join(pair) for pair in (USB_RUNTIME, USB_BOOTLOADER))
        return (
            f"{name}: {path} is a {ids[0] or '?'}:{ids[1] or '?'} USB device, not a Coral Edge TPU "
            f"({coral}): check --device or the node's inventory"
        )
    # libedgetpu enumerates only the paths the variable names: a user who changed it must be
    # told so, not sent to debug libusb.
    if visible is not None and path not in [entry.strip() for entry in visible.split(",")]:
        return (
            f"{name}: {path} is not in EDGETPU_VISIBLE_DEVICES ({visible if visible.strip() else 'empty'}), "
            "so libedgetpu hides it from this process; the task prolog sets that variable to the job's "
            "Edge TPUs: do not change it, or name one of its devices"
        )
    seen = ", ".join(f"{t}:{p}" for t, p in listed) or "none"
    if usb:
        return (
            f"{name} is at {path} but libedgetpu does not list it (it lists: {seen}): libusb cannot "
            f"enumerate it; {CHECK}"
        )
    return (
        f"{name}: {path} exists but libedgetpu does not list it (it lists: {seen}; it looks in "
        f"/sys/class/apex): {CHECK}"
    )


def open_failure_message(device: Device, reason: str | None) -> str:
    """libedgetpu listed the device but could not open it: its reason, and what to do."""
    said = f"libedgetpu says: {reason}" if reason else "libedgetpu gave no reason"
    head = f"libedgetpu cannot open Edge TPU {device.identity} at {device.edgetpu_type}:{device.path} ({said})"
    text = reason or ""
    if "Permission denied" in text or "Operation not permitted" in text:
        return (
            f"{head}: this job may not open {device.path}; the node's slurm-tpu prolog did not hand "
            f"it over (see its log), or another process holds it; {CHECK}"
        )
    if device.edgetpu_type == "usb":
        return (
            f"{head}: the stick does not answer; unplug it and plug it back in (a USB 3 port, or a "
            f"powered hub), look for USB errors in 'dmesg', then {CHECK}"
        )
    if "mmap" in text:
        return (
            f"{head}: the apex driver could not map the card; look for apex errors in 'dmesg', "
            f"reload the driver (modprobe -r apex; modprobe apex) or reboot the node, then {CHECK}"
        )
    return f"{head}: {CHECK}"


def usable_cpus() -> int:
    """The CPUs this process may run on (what Slurm's cgroup/affinity gave it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _check_model_fits(model: ModelInfo, kind: str) -> list[str]:
    """Raise when the model cannot run on this kind of device; return warnings to emit once opened."""
    if model.is_edgetpu and kind not in (EDGETPU, BROKER):
        raise ModelError(
            f"model {model.path} is compiled for the Edge TPU (contains edgetpu-custom-op) "
            f"but this job has no Edge TPU ({kind} only): submit with --gres=tpu:1, or "
            "pass --device usb:PATH|pci:PATH",
            model.path,
        )
    if kind in (EDGETPU, BROKER) and not model.is_edgetpu:
        return [
            f"model {model.path} is not compiled for the Edge TPU (no edgetpu-custom-op): it runs on "
            "the CPU; compile it with edgetpu_compiler to use the TPU"
        ]
    return []


def open_models(
    model_paths: Sequence[str],
    options: OpenOptions | None = None,
    environ: Mapping[str, str] = os.environ,
    warn: Warn = _log.warning,
    segmented: bool = False,
) -> EngineSet:
    """Open the models on the devices the job was given (or --device named): all, or none.

    By default every model on every device (``slurm-tpu serve``): one lock per device, one
    engine per (model, device), model-major: the engines of model i are
    ``engines[i * D:(i + 1) * D]`` for D devices. Edge TPU models compiled together
    (``edgetpu_compiler a.tflite b.tflite``) share a device's parameter cache.
    ``segmented``: segment i of a model split by ``edgetpu_compiler --num_segments`` on
    device i; without a TPU every segment gets its own CPU interpreter, which keeps the
    pipeline testable anywhere. The warnings are emitted only once every device opened,
    so a failing run prints its one error line and nothing else.
    """
    options = options or OpenOptions()
    models = [read_model_info(p) for p in model_paths]
    devices = resolve_devices(options.device, environ)
    if not segmented:
        pairs = [(model, device) for model in models for device in devices]
    elif devices[0].kind != EDGETPU:
        pairs = [(model, devices[0]) for model in models]
    elif len(devices) < len(models):
        raise UsageError(
            f"{len(models)} model segments need {len(models)} Edge TPUs but this job has "
            f"{len(devices)}: submit with --gres=tpu:{len(models)}"
        )
    else:
        pairs = list(zip(models, devices))
    warnings = list(dict.fromkeys(w for model, device in pairs for w in _check_model_fits(model, device.kind)))
    started = time.perf_counter()
    runtime = engines.select_runtime(options.runtime)
    engine_set = EngineSet([], runtime, 0.0, models, environ=environ)
    # CPU threads shared out among the engines running at once: one per device, or every segment.
    concurrent = len(pairs) if segmented else len(devices)
    threads = options.num_threads or max(1, usable_cpus() // concurrent)
    try:
        for model, device in pairs:
            engine_set.open(model, device, threads, options, warn)
    except BaseException:
        engine_set.close()  # nothing ran: no usage to report
        raise
    for message in warnings:
        warn(message)
    engine_set.load_seconds = time.perf_counter() - started
    return engine_set
