"""Count inferences and their time per device, and report them for accounting.

Every engine is wrapped in a :class:`MeteredEngine`, whatever the mode (single
input, batch, benchmark, segments), so the counts cannot miss a path. On close the
counts of leased accelerators are added to the job's usage box (see
:mod:`slurm_tpu.protocol.usage`) when the job has one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np

from ..identity import is_identity
from ..protocol.usage import USAGE_DIR_ENV, add_usage


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
    """Add this process's counts per leased device used to the job's usage box; how many were written.

    Called while the runner still holds its device locks: that serialises the
    read-modify-write of each device's record between the job's processes.
    """
    directory = environ.get(USAGE_DIR_ENV)
    if not directory:
        return 0
    totals: dict[str, tuple[int, float]] = {}
    for engine in engines:
        if engine.inferences and is_identity(engine.identity):
            count, seconds = totals.get(engine.identity, (0, 0.0))
            totals[engine.identity] = (count + engine.inferences, seconds + engine.seconds)
    return sum(add_usage(directory, identity, count, seconds) for identity, (count, seconds) in totals.items())
