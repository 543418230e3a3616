"""Requests to devices: one bounded queue, one worker thread per device.

An Edge TPU runs one inference at a time, so the server owns each device through exactly
one thread (a device reached through the node's TPU broker: as many threads as its engines
may have requests in flight, ``in_flight``, so the broker's device does not wait for this
process between them; the broker runs them one at a time). Every worker pulls from one
shared queue: whichever device is free takes the next inference. When the queue is full,
:meth:`DeviceQueue.submit` raises :class:`Overloaded` at once (the HTTP layer answers 503 with Retry-After) instead of
letting memory grow with the backlog.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, TimeoutError as FutureTimeout

import numpy as np

from ..modelinfo import Engine

_STOP = object()


class Overloaded(Exception):
    """The queue is full (or closing): try again after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class Inference(Future):
    """One queued inference: the future of its outputs, and once run, where and how long."""

    device = ""  # the label of the device that ran it
    seconds = 0.0  # time in the engine

    def __init__(self, model: int, inputs: Sequence[np.ndarray]):
        super().__init__()
        self.model = model
        self.inputs = inputs

    def wait(self, timeout: float | None = None) -> list[np.ndarray]:
        """The outputs; raises what the engine raised, or TimeoutError."""
        try:
            return self.result(timeout)
        except FutureTimeout:  # not the builtin TimeoutError before Python 3.11
            self.cancel()  # a worker that reaches it skips it
            raise TimeoutError(f"no device ran the inference within {timeout:g} s") from None


class DeviceQueue:
    """Workers for ``engines[d][m]`` (device d, model m), fed from one queue of ``capacity``."""

    def __init__(self, engines: Sequence[Sequence[Engine]], capacity: int):
        if capacity < 1:
            raise ValueError("queue capacity must be at least 1")
        self._queue: queue.Queue[object] = queue.Queue(maxsize=capacity)
        self.capacity = capacity
        self._threads = [
            threading.Thread(target=self._work, args=(list(device),), daemon=True, name=f"device-{i}")
            for i, device in enumerate(engines)
            for _ in range(max([1, *(getattr(engine, "in_flight", 1) for engine in device)]))
        ]
        self._closing = False
        self._producing = threading.Lock()
        self._mean_seconds = 0.0  # a running mean of inference time, for Retry-After

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    @property
    def depth(self) -> int:
        """Inferences waiting for a device."""
        return self._queue.qsize()

    def submit(self, model: int, inputs: Sequence[np.ndarray]) -> Inference:
        """Queue one inference of model ``model``; raises :class:`Overloaded` when full or closing."""
        return self.submit_all(model, [inputs])[0]

    def submit_all(self, model: int, instances: Sequence[Sequence[np.ndarray]]) -> list[Inference]:
        """Queue several inferences, all or none: raises :class:`Overloaded` unless every one fits."""
        with self._producing:  # producers one at a time: the places counted stay free until put
            if self._closing:
                raise Overloaded("the server is shutting down", 1)
            if self._queue.qsize() + len(instances) > self.capacity:
                backlog = self.capacity * self._mean_seconds / max(1, len(self._threads))  # when it has likely drained
                raise Overloaded(
                    f"{self._queue.qsize()} of {self.capacity} queue places are taken and the request "
                    f"needs {len(instances)}: retry later",
                    max(1, math.ceil(backlog)),
                )
            queued = [Inference(model, inputs) for inputs in instances]
            for inference in queued:
                self._queue.put_nowait(inference)
        return queued

    def _work(self, engines: list[Engine]) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            assert isinstance(item, Inference)
            if not item.set_running_or_notify_cancel():
                continue  # its request stopped waiting
            engine = engines[item.model]
            started = time.perf_counter()
            try:
                outputs, error = engine.run(item.inputs), None
            except BaseException as exc:  # noqa: BLE001 - reported to the request, never kills the worker
                outputs, error = None, exc
            item.seconds = time.perf_counter() - started
            item.device = engine.label
            item.inputs = ()
            self._mean_seconds += (item.seconds - self._mean_seconds) * 0.05
            if error is None:
                item.set_result(outputs)
            else:
                item.set_exception(error)

    def close(self, timeout: float | None = None) -> None:
        """Run what is queued, then stop the workers (wait at most ``timeout`` s for them)."""
        with self._producing:
            self._closing = True
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            for _ in self._threads:  # waits while full: the workers are emptying it
                self._queue.put(_STOP, timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except queue.Full:
            return  # a device that does not finish; its daemon thread goes with the process
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
