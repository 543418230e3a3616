"""``/metrics``: the server's counters in Prometheus' text format (version 0.0.4), through prometheus_client.

Device figures are the engines' own meters (:class:`~slurm_tpu.runner.session.MeteredEngine`),
the figures the usage record gets. Label values come from a fixed set (endpoints, status
codes, served model names, device labels): a client cannot grow the series by sending odd names.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Iterable, Sequence
from typing import Callable

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ...promtext import CONTENT_TYPE, add, counter, gauge, render
from ..session import MeteredEngine

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PREFIX = "slurm_tpu_serve"
Gauges = Callable[[], dict[str, tuple[float, str]]]  # name -> (value, help)
__all__ = ["BUCKETS", "CONTENT_TYPE", "PREFIX", "ServeMetrics"]


class ServeMetrics(Collector):
    """Thread-safe request counters; device figures and gauges are read when collected."""

    def __init__(self, engines: Sequence[tuple[str, MeteredEngine]], gauges: Gauges):
        """``engines``: (model name, metered engine) pairs; ``gauges``: name -> (value, help), read at scrape time."""
        self._engines = engines
        self._gauges = gauges
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, str], int] = {}
        # (model, endpoint) -> (count per bucket, the last above every bound, not cumulative; sum of seconds)
        self._latency: dict[tuple[str, str], tuple[list[int], float]] = {}

    def observe(self, model: str, endpoint: str, status: int, seconds: float) -> None:
        """Count one answered request (``model`` '' when none or unknown)."""
        with self._lock:
            key = (model, endpoint, str(status))
            self._requests[key] = self._requests.get(key, 0) + 1
            counts, total = self._latency.get((model, endpoint), ([0] * (len(BUCKETS) + 1), 0.0))
            counts[bisect.bisect_left(BUCKETS, seconds)] += 1
            self._latency[(model, endpoint)] = (counts, total + seconds)

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            requests = sorted(self._requests.items())
            latency = sorted((key, (list(counts), total)) for key, (counts, total) in self._latency.items())
        requests_f = counter(f"{PREFIX}_requests", "requests answered, by model, endpoint and HTTP status")
        errors_f = counter(f"{PREFIX}_errors", "requests refused or failed (HTTP status 400 and above)")
        for (model, endpoint, code), value in requests:
            labels = {"model": model, "endpoint": endpoint, "code": code}
            add(requests_f, labels, value)
            if int(code) >= 400:
                add(errors_f, labels, value)
        duration = HistogramMetricFamily(
            f"{PREFIX}_request_duration_seconds",
            "time from request line to response, by model and endpoint",
            labels=("model", "endpoint"),
        )
        bounds = [repr(bound) for bound in BUCKETS] + ["+Inf"]
        for (model, endpoint), (counts, total) in latency:
            duration.add_metric([model, endpoint], list(zip(bounds, itertools.accumulate(counts))), total)
        inferences = counter(f"{PREFIX}_inferences", "inferences run, by model and device")
        device_seconds = counter(f"{PREFIX}_device_seconds", "seconds devices spent in inferences, by model and device")
        for model, engine in self._engines:
            labels = {"model": model, "device": engine.label}
            add(inferences, labels, engine.inferences)
            add(device_seconds, labels, engine.seconds)
        families: list[Metric] = [requests_f, errors_f, duration, inferences, device_seconds]
        for name, (reading, text) in self._gauges().items():
            family = gauge(f"{PREFIX}_{name}", text)
            add(family, {}, reading)
            families.append(family)
        return families

    def render(self) -> str:
        """The exposition text of one collection."""
        return render(self).decode()
