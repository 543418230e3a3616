"""Benchmark mode: load time, first inference apart, latency percentiles, throughput."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from .spec import Engine, TensorSpec


@dataclass(frozen=True)
class BenchResult:
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


def benchmark(
    engine: Engine,
    inputs: Sequence[np.ndarray],
    iterations: int,
    load_seconds: float,
    runtime: str,
    edgetpu_version: str | None = None,
) -> BenchResult:
    """Time ``iterations`` inferences after the first one (reported apart)."""
    started = time.perf_counter()
    engine.run(inputs)
    first = time.perf_counter() - started
    latencies = []
    total_start = time.perf_counter()
    for _ in range(iterations):
        t = time.perf_counter()
        engine.run(inputs)
        latencies.append((time.perf_counter() - t) * 1000)
    total = time.perf_counter() - total_start
    latencies.sort()
    return BenchResult(
        engine.label,
        runtime,
        load_seconds * 1000,
        first * 1000,
        iterations,
        percentile(latencies, 50),
        percentile(latencies, 90),
        percentile(latencies, 99),
        float(np.mean(latencies)) if latencies else 0.0,
        iterations / total if total > 0 else 0.0,
        edgetpu_version,
    )
