"""One thread per shared device, running the jobs' requests one at a time in the scheduler's order.

Each device keeps an interpreter per model it ran (by sha256; built the first time one of the
device's requests needs it, through the runner's :class:`InterpreterEngine` with a delegate
from the device's libedgetpu, by (type, path) as the runner opens a whole TPU), and drops it
when no job refers to the model any more. A device running a model other than its last is a
*swap*: on an Edge TPU that re-uploads the parameter cache, so the scheduler breaks ties toward
the model a device holds, and swaps are counted per device and per job.

The model bytes reach the interpreter through a private file (a root 0700 temp directory,
unlinked once the interpreter has it): the broker never opens a path a user names.

An Edge TPU executable a job's libedgetpu forwarded (``load`` of kind ``executable``) runs as its
one-op model (oneop.py) through the device's delegate, like any model. **Twin mode** (``twin``:
``python -m slurm_tpu.broker --twin`` or ``SLURM_TPU_BROKER_TWIN=1``; tests and the demo only,
where no silicon can run an executable) runs the executable's own bytes instead, which must then
be a quantized CPU .tflite (the test models' "executable" is their CPU twin), through the same
interpreter with the device's delegate still created on the device's node (so opening and owning
the device is exercised as for real). Either way the model's tensors must be the ones the job's
op declared, or the load fails with one line.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import dataclass, field

import numpy as np

from ..errors import SlurmTpuError
from ..protocol import broker_wire as wire
from ..runner import engines
from .models import ModelEntry, ModelRegistry, answer_limit_error, tensor_bytes
from .oneop import describe, same_tensors
from .scheduler import Scheduler

_log = logging.getLogger("slurm_tpu.broker")

UTILIZATION_WINDOW_S = 10.0
SAMPLE_EVERY_S = 0.1  # the device thread's (time, busy) samples for utilization: at most one per this


@dataclass(frozen=True)
class SharedDevice:
    """A device the broker owns: its identity and libedgetpu's (type, path); type None: the CPU alone."""

    identity: str
    edgetpu_type: str | None
    path: str | None


@dataclass
class JobFigures:
    """One job's figures (broker_wire FIGURES), kept in seconds, sent in ms."""

    busy_s: float = 0.0
    inferences: int = 0
    swaps: int = 0
    wait_s: float = 0.0
    loads: int = 0

    def as_dict(self) -> dict[str, float | int]:
        return {
            wire.BUSY_MS: round(self.busy_s * 1000, 3),
            wire.INFERENCES: self.inferences,
            wire.SWAPS: self.swaps,
            wire.WAIT_MS: round(self.wait_s * 1000, 3),
            wire.LOADS: self.loads,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> JobFigures:
        """Figures saved by an earlier broker (stats/<job>), read as the Epilog reads them."""
        figures = wire.decode_figures(data, "saved figures")
        return cls(
            figures[wire.BUSY_MS] / 1000,
            int(figures[wire.INFERENCES]),
            int(figures[wire.SWAPS]),
            figures[wire.WAIT_MS] / 1000,
            int(figures[wire.LOADS]),
        )


# done(outputs or None, error or None, busy_s, wait_s): called on the device's thread; must not block.
Done = Callable[[list[np.ndarray] | None, str | None, float, float], None]


@dataclass
class Work:
    """One request: the job's inputs for a model, and where its answer goes."""

    job: int
    model: str
    inputs: list[np.ndarray]
    done: Done
    enqueued: float = field(default_factory=time.perf_counter)
    # A load's build (prepare): the device that picks it builds this model's interpreter, charged to
    # the job like a request (so a job looping on loads gets no more than its share); done gets [] or the error.
    build: ModelEntry | None = None


class BrokerDeviceError(SlurmTpuError):
    """A shared device or a model on it could not be opened."""


class _Device:
    def __init__(self, spec: SharedDevice):
        self.spec = spec
        self.engines: dict[str, engines.InterpreterEngine] = {}
        self.controls: deque[tuple[Callable[[], object], Future]] = deque()
        self.last_model: str | None = None
        self.busy_s = 0.0
        self.inferences = self.swaps = self.loads = 0
        # (time, busy_s) taken by the device's thread (at most one per SAMPLE_EVERY_S), read-only for stats
        self.samples: deque[tuple[float, float]] = deque(maxlen=int(4 * UTILIZATION_WINDOW_S / SAMPLE_EVERY_S))
        self.thread: threading.Thread | None = None


class DevicePool:
    """The shared devices, their threads, the scheduler between the jobs, and the jobs' figures."""

    def __init__(
        self,
        devices: Sequence[SharedDevice],
        registry: ModelRegistry,
        runtime: str | None = None,
        threads: int = 1,
        libedgetpu: str | None = None,
        tie_window: float = 0.0005,
        twin: bool = False,
    ):
        if not devices:
            raise BrokerDeviceError("the broker has no shared device to run on")
        self.registry = registry
        self.twin = twin
        self.runtime = engines.select_runtime(runtime)
        self.threads = threads
        self._libedgetpu = libedgetpu
        self._library: engines.EdgeTpuLibrary | None = None
        self._devices = [_Device(spec) for spec in devices]
        self._scheduler = Scheduler(tie_window)
        self._cond = threading.Condition()
        self._figures: dict[int, JobFigures] = {}
        self._stopping = False
        self._scratch = tempfile.mkdtemp(prefix="slurm-tpu-broker-")  # 0700, this process's own
        self._open_lock = threading.Lock()  # engine opens capture fd 2 process-wide: one at a time
        self.started = time.monotonic()

    # ---- life ----

    def start(self) -> None:
        for device in self._devices:
            device.thread = threading.Thread(target=self._thread, args=(device,), name=f"device {device.spec.identity}")
            device.thread.daemon = True
            device.thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for device in self._devices:
            if device.thread is not None:
                device.thread.join(timeout=10)
        shutil.rmtree(self._scratch, ignore_errors=True)

    def alive(self) -> bool:
        """Whether every device's thread runs (False once one died: the broker serves no more on it)."""
        return all(d.thread is not None and d.thread.is_alive() for d in self._devices)

    # ---- jobs ----

    def add_job(self, job: int, shares: int, figures: JobFigures | None = None) -> None:
        with self._cond:
            self._scheduler.add_job(job, shares)
            self._figures.setdefault(job, figures or JobFigures())

    def remove_job(self, job: int) -> tuple[JobFigures, list[Work]]:
        """Forget the job: its figures, and its queued requests (never run)."""
        with self._cond:
            dropped = self._scheduler.remove_job(job)
            figures = self._figures.pop(job, JobFigures())
        return figures, dropped

    def figures(self, job: int) -> JobFigures | None:
        with self._cond:
            found = self._figures.get(job)
            return JobFigures(**vars(found)) if found else None

    def all_figures(self) -> dict[int, JobFigures]:
        with self._cond:
            return {job: JobFigures(**vars(f)) for job, f in self._figures.items()}

    def queued(self) -> int:
        """Requests waiting for a device (the server sends an answer from the device's thread only when none is)."""
        with self._cond:
            return self._scheduler.queued()

    def submit(self, work: Work) -> bool:
        """Queue a request; False when its job is gone."""
        with self._cond:
            if not self._scheduler.has_job(work.job) or self._stopping:
                return False
            self._scheduler.submit(work.job, work.model, work)
            self._cond.notify()
        return True

    # ---- models ----

    def prepare(self, entry: ModelEntry, job: int, timeout: float = 120.0) -> None:
        """Build ``entry``'s interpreter on a device and learn its tensors; BrokerDeviceError with one
        line when it cannot be built. The build waits its job's turn (the scheduler) and is charged
        to the job as device time."""
        future: Future = Future()

        def done(outputs, error, busy_s, wait_s) -> None:
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(BrokerDeviceError(error))

        if not self.submit(Work(job, entry.sha256, [], done, build=entry)):
            raise BrokerDeviceError("this job's shares were closed")
        try:
            future.result(timeout=timeout)
        except FutureTimeout:  # not the builtin TimeoutError before Python 3.11
            raise BrokerDeviceError(f"the model was not built within {timeout:g} s: the broker is busy") from None

    def drop_models(self, shas: Sequence[str]) -> None:
        """Close the interpreters of models no job refers to any more (on their devices' threads)."""
        if not shas:
            return
        wanted = set(shas)
        with self._cond:
            for device in self._devices:

                def drop(device: _Device = device) -> None:
                    for sha in wanted & set(device.engines):
                        device.engines.pop(sha).close()
                        if device.last_model == sha:
                            device.last_model = None

                device.controls.append((drop, Future()))
            self._cond.notify_all()

    def _engine(self, device: _Device, entry: ModelEntry, job: int) -> engines.InterpreterEngine:
        engine = device.engines.get(entry.sha256)
        if engine is not None:
            return engine
        started = time.perf_counter()
        try:
            engine = self._build(device, entry)
        finally:
            self._charge_build(device, job, time.perf_counter() - started)
        if entry.declared is not None and not (
            same_tensors(entry.declared[0], engine.inputs) and same_tensors(entry.declared[1], engine.outputs)
        ):
            engine.close()
            ran = "its CPU twin" if self.twin else "the executable"
            raise BrokerDeviceError(
                f"the Edge TPU op's tensors ({describe(entry.declared[0])} -> {describe(entry.declared[1])}) "
                f"are not those of {ran} ({describe(engine.inputs)} -> {describe(engine.outputs)})"
            )
        # The interpreter's own view, bounded as the model was (models.check_model) before it is kept.
        problem = answer_limit_error(engine.inputs, engine.outputs)
        if problem is not None:
            engine.close()
            raise BrokerDeviceError(problem)
        device.engines[entry.sha256] = engine
        with self._cond:
            device.loads += 1
            figures = self._figures.get(job)
            if figures is not None:
                figures.loads += 1
        if not entry.ready:
            entry.inputs, entry.outputs = list(engine.inputs), list(engine.outputs)
            entry.input_sizes = [tensor_bytes(spec) for spec in engine.inputs]
            entry.ready = True
        return engine

    def _charge_build(self, device: _Device, job: int, build_s: float) -> None:
        """A model's build is the job's device time: its busy time and its place in the scheduler."""
        with self._cond:
            self._scheduler.charge(job, build_s)
            device.busy_s += build_s
            figures = self._figures.get(job)
            if figures is not None:
                figures.busy_s += build_s
            self._sample(device)

    def _build(self, device: _Device, entry: ModelEntry) -> engines.InterpreterEngine:
        spec = device.spec
        data = entry.data
        if self.twin and entry.executable is not None:
            if entry.executable[4:8] != b"TFL3":
                raise BrokerDeviceError(
                    "this broker runs in twin mode (tests): an Edge TPU executable runs as its CPU twin, "
                    "a .tflite, and this one is not"
                )
            data = entry.executable
        fd, path = tempfile.mkstemp(suffix=".tflite", dir=self._scratch)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            with self._open_lock:
                delegate = None
                if spec.edgetpu_type is not None:
                    if self._library is None:
                        self._library = engines.EdgeTpuLibrary(self._libedgetpu)
                    log: list[str] = []
                    delegate = self._library.create_delegate(spec.edgetpu_type, spec.path or "", log=log)
                    if delegate is None:
                        reason = engines.libedgetpu_reason(log, spec.path or "") or "no reason given"
                        raise BrokerDeviceError(
                            f"the broker cannot open its Edge TPU {spec.identity} ({reason}): tell the node's admin"
                        )
                try:
                    return engines.InterpreterEngine(
                        path, f"edgetpu {spec.identity}", self.runtime, self.threads, delegate
                    )
                except SlurmTpuError as exc:
                    message = str(exc).replace(f"model {path}", "the model").replace(path, "the model")
                    raise BrokerDeviceError(message) from None
        finally:
            os.unlink(path)

    # ---- figures ----

    def device_figures(self) -> dict[str, dict[str, float | int]]:
        """identity -> busy_s, utilization (over the last ~10 s), model_swaps, inferences, model_loads, models.
        Read-only: the window comes from the samples the device's thread took, whoever asks how often."""
        now = time.monotonic()
        answer = {}
        with self._cond:
            for device in self._devices:
                # Busy at the window's start: the last sample at or before it; none there means nothing
                # ran before it (the ring, one sample per SAMPLE_EVERY_S at most, spans 4 windows when full).
                then, busy_then = max(self.started, now - UTILIZATION_WINDOW_S), 0.0
                for when, busy in device.samples:  # oldest first
                    if when > now - UTILIZATION_WINDOW_S:
                        break
                    then, busy_then = when, busy
                span = max(now - then, 1e-6)
                answer[device.spec.identity] = {
                    "busy_s": round(device.busy_s, 6),
                    "utilization": round(min(1.0, max(0.0, device.busy_s - busy_then) / span), 4),
                    wire.SWAPS: device.swaps,
                    "inferences": device.inferences,
                    wire.LOADS: device.loads,
                    "models": len(device.engines),
                }
        return answer

    def _sample(self, device: _Device) -> None:
        """A (time, busy) sample for the utilization window (the device's thread, under the lock)."""
        now = time.monotonic()
        if not device.samples or now - device.samples[-1][0] >= SAMPLE_EVERY_S:
            device.samples.append((now, device.busy_s))

    # ---- the device's thread ----

    def _thread(self, device: _Device) -> None:
        try:
            self._loop(device)
        except BaseException as exc:  # said once; ping then answers devices_alive false
            _log.error("broker: the thread of device %s died: %s: %s", device.spec.identity, type(exc).__name__, exc)
            raise

    def _loop(self, device: _Device) -> None:
        while True:
            with self._cond:
                while not self._stopping and not device.controls and not self._scheduler.queued():
                    self._cond.wait()
                if self._stopping:
                    control_list = list(device.controls)
                    device.controls.clear()
                    for _, future in control_list:
                        future.cancel()
                    break
                control = device.controls.popleft() if device.controls else None
                picked = None if control else self._scheduler.pick(device.last_model)
            if control is not None:
                function, future = control
                try:
                    future.set_result(function())
                except BaseException as exc:  # noqa: BLE001 - handed to the waiting connection
                    future.set_exception(exc)
                continue
            if picked is not None:
                self._run(device, picked[2])
        for engine in device.engines.values():
            engine.close()
        device.engines.clear()

    def _run(self, device: _Device, work: Work) -> None:
        """Run one request (or build, for a load) and hand its answer to ``work.done``. Whatever goes
        wrong (the runtime, memory, the answer's own making) becomes the requester's error answer and
        the job is charged: the device's thread goes on."""
        started = time.perf_counter()
        wait = started - work.enqueued
        outputs: list[np.ndarray] | None = None
        error: str | None = None
        ran: float | None = None
        busy = 0.0
        try:
            if work.build is not None:
                self._engine(device, work.build, work.job)  # charged there
                outputs = []
            else:
                entry = self.registry.get(work.model)
                if entry is None:
                    raise BrokerDeviceError("the model is no longer loaded: load it again")
                engine = self._engine(device, entry, work.job)  # a build is charged there
                ran = time.perf_counter()
                outputs = engine.run(work.inputs)
                busy = time.perf_counter() - ran
        except SlurmTpuError as exc:
            error = str(exc)
        except (ValueError, RuntimeError) as exc:  # the runtime refused the tensors
            error = f"the model did not run: {_first_line(exc)}"
        except MemoryError:
            error = "the model's outputs do not fit in the broker's memory"
        except BaseException as exc:  # noqa: BLE001 - never the device's thread's end
            _log.warning("broker: device %s: job %s: %s: %s", device.spec.identity, work.job, type(exc).__name__, exc)
            error = f"the broker could not run the request ({type(exc).__name__})"
        if error is not None:
            outputs = None
            busy = 0.0 if ran is None else time.perf_counter() - ran
            with self._cond:
                self._scheduler.charge(work.job, busy)
                self._sample(device)
            self._answer(device, work, None, error, 0.0, wait)
            return
        if work.build is None:
            with self._cond:
                self._scheduler.charge(work.job, busy)
                swapped = device.last_model is not None and device.last_model != work.model
                device.last_model = work.model
                device.busy_s += busy
                device.inferences += 1
                device.swaps += swapped
                self._sample(device)
                figures = self._figures.get(work.job)
                if figures is not None:
                    figures.busy_s += busy
                    figures.inferences += 1
                    figures.swaps += swapped
                    figures.wait_s += wait
        self._answer(device, work, outputs, None, busy, wait)

    @staticmethod
    def _answer(device: _Device, work: Work, outputs, error: str | None, busy: float, wait: float) -> None:
        """``work.done``, contained: when it raises (an answer too large to frame, memory), the requester
        gets an error answer instead, best effort; the device's thread goes on either way."""
        try:
            work.done(outputs, error, busy, wait)
            return
        except BaseException as exc:  # noqa: BLE001 - never the device's thread's end
            _log.warning(
                "broker: device %s: job %s: the answer failed: %s: %s",
                device.spec.identity,
                work.job,
                type(exc).__name__,
                _first_line(exc),
            )
            if error is not None:
                return
            failure = f"the broker could not send the model's answer ({type(exc).__name__}: {_first_line(exc)})"
        try:
            work.done(None, failure, busy, wait)
        except BaseException as exc:  # noqa: BLE001
            _log.warning(
                "broker: device %s: job %s: its error answer failed too: %s", device.spec.identity, work.job, exc
            )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
