"""Count inferences and their time per device, and report them for accounting.

Every engine is wrapped in a :class:`MeteredEngine`, whatever the mode (single
input, batch, benchmark, segments), so the counts cannot miss a path. On close the
counts of leased accelerators go to the usage drop directory (see
:mod:`slurm_tpu.usage`) when the job has one.
"""

from __future__ import annotations

import time
from typing import Mapping, Sequence

import numpy as np

from ..usage import USAGE_DIR_ENV, UsageRecord, write_usage


class MeteredEngine:
    """An Engine that counts its runs and the wall time spent in them."""

    def __init__(self, engine, identity: str):
        self._engine = engine
        self.identity = identity
        self.label = engine.label
        self.inputs = engine.inputs
        self.outputs = engine.outputs
        self.inferences = 0
        self.seconds = 0.0

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        started = time.perf_counter()
        try:
            return self._engine.run(inputs)
        finally:
            self.seconds += time.perf_counter() - started
            self.inferences += 1

    def close(self) -> None:
        self._engine.close()

    def __getattr__(self, name: str):  # anything else an engine offers (e.g. GPU details)
        return getattr(self._engine, name)


def report_usage(engines: Sequence[MeteredEngine], environ: Mapping[str, str]) -> int:
    """Write one usage record per leased device used; returns how many were written."""
    directory, job = environ.get(USAGE_DIR_ENV), environ.get("SLURM_JOB_ID", "")
    if not directory or not job.isdigit():
        return 0
    totals: dict[str, tuple[int, float]] = {}
    for engine in engines:
        if engine.inferences and engine.identity.startswith(("usb-", "pci-", "platform-")):
            count, seconds = totals.get(engine.identity, (0, 0.0))
            totals[engine.identity] = (count + engine.inferences, seconds + engine.seconds)
    written = 0
    for identity, (count, seconds) in totals.items():
        written += write_usage(directory, UsageRecord(int(job), identity, count, round(seconds, 6))) is not None
    return written
