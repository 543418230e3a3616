"""What each endpoint (docs/user-guide.md's table) does, apart from HTTP's mechanics (see :mod:`.httpserver`).

Every refusal is a :class:`~.codec.RequestError` with its status and one line.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import SlurmTpuError
from ..errors import InputError, UsageError
from ..tasks import TASK_NAMES
from . import codec
from .codec import RequestError
from .devicequeue import DeviceQueue, Overloaded
from .metrics import CONTENT_TYPE as METRICS_TYPE, ServeMetrics
from .models import ServedModel, describe

JSON_TYPE = "application/json"
PREDICT = "predict"
_ROUTE = re.compile(r"^/v1/models/([^/:]+)(?:/versions/([^/:]+))?(?:(/metadata)|:([A-Za-z_]+))?$")


@dataclass(frozen=True)
class Limits:
    """What one client may ask of the server (memory and time stay bounded whatever it sends)."""

    max_body: int = 8 << 20  # bytes of one request body
    max_instances: int = 64  # inferences in one :predict request
    max_connections: int = 64  # open connections that have shown the token (each one thread)
    # Connections not yet past the token are a pool of their own, so that whoever lacks the
    # token never takes what its holder gets (see httpserver.py):
    max_pending: int = 128  # connections that have not yet shown the token, all peers together
    max_pending_per_peer: int = 32  # ... from one address (a new one closes that peer's oldest)
    head_timeout: float = 10.0  # seconds from accept to a request head carrying the token
    max_head: int = 64 << 10  # bytes a connection may send before it has shown the token
    queue: int = 64  # inferences waiting for a device
    decoders: int = 2  # bodies turned into tensors at once (JSON numbers take ~8x their size, images
    # up to 3 bytes a pixel): this, not the connection count, bounds the memory of decoding
    io_timeout: float = 30.0  # seconds a connection may sit idle or stall mid-request
    inference_timeout: float = 60.0  # seconds a request waits for its inferences

    @property
    def head_deadline(self) -> float:
        """Seconds a new connection has to authenticate (never longer than the idle timeout)."""
        return min(self.head_timeout, self.io_timeout)


@dataclass(frozen=True)
class Route:
    """A request's target: the endpoint and, for model endpoints, the served model."""

    endpoint: str  # status | metadata | predict | classify | detect | segment | raw | metrics
    model: ServedModel | None = None


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = JSON_TYPE


def json_response(status: int, payload: Any) -> Response:
    return Response(status, json.dumps(payload, separators=(",", ":")).encode())


class ServeApp:
    """The served models behind the endpoints; counts requests in flight for a graceful stop."""

    def __init__(
        self, models: Sequence[ServedModel], queue: DeviceQueue, limits: Limits, token: str, runtime: str = ""
    ):
        self.models: Mapping[str, ServedModel] = {m.name: m for m in models}
        self.queue = queue
        self.limits = limits
        self.token = token
        self.runtime = runtime
        self._held = 0  # bytes of request bodies held at once, all connections: at most 4 * max_body
        self._decoders = threading.BoundedSemaphore(limits.decoders)
        self._in_flight = 0
        self._idle = threading.Condition()
        self.draining = False
        self.connections = 0  # set by the HTTP server (gauges): connections past the token...
        self.pending_connections = 0  # ...and those not yet
        engines = [(m.name, e) for m in models for e in m.engines]
        self.metrics = ServeMetrics(engines, self._gauges)
        self.answered = 0

    def begin(self) -> bool:
        """Count a request in; False when draining (the caller answers 503)."""
        with self._idle:
            if self.draining:
                return False
            self._in_flight += 1
            return True

    def end(self) -> None:
        with self._idle:
            self._in_flight -= 1
            self.answered += 1
            if self._in_flight == 0:
                self._idle.notify_all()

    def hold(self, amount: int) -> bool:
        """Count in a request body of ``amount`` bytes; False when it does not fit (the caller answers 503)."""
        with self._idle:
            if self._held + amount > 4 * self.limits.max_body:
                return False
            self._held += amount
            return True

    def release(self, amount: int) -> None:
        with self._idle:
            self._held -= amount

    def drain(self, timeout: float) -> bool:
        """Refuse new requests and wait for those in flight; True when none is left."""
        with self._idle:
            self.draining = True
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    def _gauges(self) -> dict[str, tuple[float, str]]:
        return {  # name: (value, help)
            "queue_depth": (self.queue.depth, "inferences waiting for a device"),
            "queue_capacity": (self.queue.capacity, "inferences that may wait before requests are refused with 503"),
            "in_flight_requests": (self._in_flight, "requests being handled"),
            "open_connections": (self.connections, "client connections open that have shown the token"),
            "pending_connections": (
                self.pending_connections,
                "client connections open that have not yet shown the token",
            ),
        }

    def route(self, method: str, path: str) -> Route:
        """The endpoint a method and path (without query) name, or a 404/405 RequestError."""
        endpoint, model = "metrics", None
        if path != "/metrics":
            match = _ROUTE.match(path)
            if not match:
                raise RequestError(
                    404,
                    f"no endpoint {path}: use /v1/models/NAME[/metadata|:predict|:classify|"
                    ":detect|:segment|:raw] or /metrics",
                )
            name, version, metadata, verb = match.groups()
            model = self.models.get(name)
            if model is None:
                raise RequestError(404, f"no model '{name[:100]}' is served here (served: {', '.join(self.models)})")
            if version is not None and version != codec.VERSION:
                raise RequestError(404, f"model '{name}' has only version {codec.VERSION}, not '{version[:20]}'")
            if verb is not None and verb != PREDICT and verb not in TASK_NAMES:
                raise RequestError(404, f"no method ':{verb[:40]}': use :predict or :{', :'.join(TASK_NAMES)}")
            endpoint = "metadata" if metadata else verb or "status"
        allowed = "GET" if endpoint in ("metrics", "metadata", "status") else "POST"
        if method != allowed:
            raise RequestError(405, f"{endpoint} takes {allowed}, not {method}")
        return Route(endpoint, model)

    def dispatch(self, route: Route, body: bytes, content_type: str, query: str) -> Response:
        """The answer to an authorized request (or a RequestError)."""
        if route.endpoint == "metrics":
            return Response(200, self.metrics.render().encode(), METRICS_TYPE)
        model = route.model
        assert model is not None
        if route.endpoint == "status":
            return json_response(200, codec.MODEL_STATUS)
        if route.endpoint == "metadata":
            extra = {**describe(model), "runtime": self.runtime}
            return json_response(200, codec.model_metadata(model.name, model.inputs, model.outputs, extra))
        if route.endpoint == PREDICT:
            return self._predict(model, body)
        return self._task(model, route.endpoint, body, content_type, query)

    def _predict(self, model: ServedModel, body: bytes) -> Response:
        def binary(data: bytes, where: str):
            try:
                return model.prepare(data, model.task, where).tensor[0]
            except InputError as exc:
                raise RequestError(400, str(exc)) from None

        with self._decoders:
            instances, columnar = codec.parse_predict(body, model.inputs, binary, self.limits.max_instances)
        results = [self._wait(i) for i in self._submit_all(model, instances)]
        return json_response(200, codec.encode_predict(results, model.outputs, columnar))

    def _task(self, model: ServedModel, name: str, body: bytes, content_type: str, query: str) -> Response:
        with self._decoders:
            data, options = codec.task_request(body, content_type, query)
            try:
                task = model.task_named(name)
                prepared = model.prepare(data, task, "the request body")
            except (InputError, UsageError) as exc:
                raise RequestError(400, str(exc)) from None
        (inference,) = self._submit_all(model, [[prepared.tensor]])
        outputs = self._wait(inference)
        with self._decoders:  # segmentation maps are resized to the source image: memory again
            result = task.process(outputs, model.outputs, prepared.geometry, model.options(**options))
        record = {
            "task": task.name,
            "devices": [inference.device],
            "runtime": self.runtime,
            "times_ms": [round(inference.seconds * 1000, 3)],
            **task.record(result),
            "lines": task.lines(result),
        }  # the printout of 'slurm-tpu infer' for one input
        return json_response(200, record)

    def _submit_all(self, model: ServedModel, instances):
        try:
            return self.queue.submit_all(model.index, instances)
        except Overloaded as exc:
            raise RequestError(503, str(exc), retry_after=exc.retry_after) from None

    def _wait(self, inference):
        try:
            return inference.wait(self.limits.inference_timeout)
        except TimeoutError as exc:
            raise RequestError(503, str(exc), retry_after=1) from None
        except (SlurmTpuError, ValueError, RuntimeError) as exc:  # the runtime refused the tensors
            raise RequestError(
                500, f"inference failed on {inference.device}: {str(exc).splitlines()[0][:300]}"
            ) from None
