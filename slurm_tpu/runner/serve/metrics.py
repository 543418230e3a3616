"""``/metrics``: the server's counters in Prometheus' text format (version 0.0.4).

Requests and errors by model, endpoint and status code, a latency histogram by model
and endpoint, and per model and device the inferences and seconds the device spent
on them (read from the engines' own meters, :class:`~slurm_tpu.runner.meter.MeteredEngine`,
the figures the usage record gets). Label values come from a fixed set (endpoints,
status codes, served model names checked at start-up, device labels): a client
cannot grow the series by sending odd names.
"""

from __future__ import annotations

import bisect
import threading
from typing import Callable, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PREFIX = "slurm_tpu_serve"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}" if pairs else ""


class _Histogram:
    __slots__ = ("counts", "total", "count")

    def __init__(self) -> None:
        self.counts = [0] * len(BUCKETS)  # per bucket, not cumulative (summed when rendered)
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        index = bisect.bisect_left(BUCKETS, seconds)
        if index < len(BUCKETS):
            self.counts[index] += 1
        self.total += seconds
        self.count += 1


class ServeMetrics:
    """Thread-safe request counters; device figures and gauges are read when rendered."""

    def __init__(self, engines: Sequence[tuple[str, object]], gauges: Callable[[], dict[str, float]]):
        """``engines``: (model name, metered engine) pairs; ``gauges``: name -> value, read at scrape time."""
        self._engines = engines
        self._gauges = gauges
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, str], int] = {}
        self._latency: dict[tuple[str, str], _Histogram] = {}

    def observe(self, model: str, endpoint: str, status: int, seconds: float) -> None:
        """Count one answered request (``model`` '' when none or unknown)."""
        with self._lock:
            key = (model, endpoint, str(status))
            self._requests[key] = self._requests.get(key, 0) + 1
            histogram = self._latency.get((model, endpoint))
            if histogram is None:
                histogram = self._latency[(model, endpoint)] = _Histogram()
            histogram.observe(seconds)

    def render(self) -> str:
        with self._lock:
            requests = sorted(self._requests.items())
            latency = sorted((k, (list(h.counts), h.total, h.count)) for k, h in self._latency.items())
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str) -> None:
            lines.extend([f"# HELP {PREFIX}_{name} {help_text}", f"# TYPE {PREFIX}_{name} {kind}"])

        family("requests_total", "counter", "requests answered, by model, endpoint and HTTP status")
        for (model, endpoint, code), value in requests:
            lines.append(f"{PREFIX}_requests_total"
                         f"{_labels([('model', model), ('endpoint', endpoint), ('code', code)])} {value}")
        family("errors_total", "counter", "requests refused or failed (HTTP status 400 and above)")
        errors: dict[tuple[str, str, str], int] = {}
        for (model, endpoint, code), value in requests:
            if int(code) >= 400:
                errors[(model, endpoint, code)] = value
        for (model, endpoint, code), value in sorted(errors.items()):
            lines.append(f"{PREFIX}_errors_total"
                         f"{_labels([('model', model), ('endpoint', endpoint), ('code', code)])} {value}")
        family("request_duration_seconds", "histogram", "time from request line to response, by model and endpoint")
        for (model, endpoint), (counts, total, count) in latency:
            base = [("model", model), ("endpoint", endpoint)]
            running = 0
            for bound, n in zip(BUCKETS, counts):
                running += n
                lines.append(f"{PREFIX}_request_duration_seconds_bucket{_labels(base + [('le', repr(bound))])} "
                             f"{running}")
            lines.append(f"{PREFIX}_request_duration_seconds_bucket{_labels(base + [('le', '+Inf')])} {count}")
            lines.append(f"{PREFIX}_request_duration_seconds_sum{_labels(base)} {total:.9g}")
            lines.append(f"{PREFIX}_request_duration_seconds_count{_labels(base)} {count}")
        family("inferences_total", "counter", "inferences run, by model and device")
        for model, engine in self._engines:
            lines.append(f"{PREFIX}_inferences_total{_labels([('model', model), ('device', engine.label)])} "
                         f"{engine.inferences}")  # type: ignore[attr-defined]
        family("device_seconds_total", "counter", "seconds devices spent in inferences, by model and device")
        for model, engine in self._engines:
            lines.append(f"{PREFIX}_device_seconds_total{_labels([('model', model), ('device', engine.label)])} "
                         f"{engine.seconds:.9g}")  # type: ignore[attr-defined]
        for name, value in self._gauges().items():
            family(name, "gauge", _GAUGE_HELP.get(name, name))
            lines.append(f"{PREFIX}_{name} {value:.9g}")
        return "\n".join(lines) + "\n"


_GAUGE_HELP = {
    "queue_depth": "inferences waiting for a device",
    "queue_capacity": "inferences that may wait before requests are refused with 503",
    "in_flight_requests": "requests being handled",
    "open_connections": "client connections open that have shown the token",
    "pending_connections": "client connections open that have not yet shown the token",
}
