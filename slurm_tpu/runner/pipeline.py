"""Keep the device busy: decode ahead in a thread pool, dispatch to free engines, keep order.

One engine runs inline (no thread hop on the hot path); several each get a thread, whichever is
free taking the next input; ``chain=True`` runs engine i on engine i-1's outputs (a model split
in segments), so N segments work on N inputs at once. TFLite's invoke() releases the GIL, so
these threads really overlap. An engine that may be shared (``in_flight`` > 1: a broker engine,
whose device is the node broker's) gets that many threads, so that many of its requests are at
the broker at once and its device never waits for this process between them.
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import SlurmTpuError
from .modelinfo import Engine


@dataclass
class Item:
    """One input on its way through: decoded tensors, then outputs, or an error."""

    seq: int
    key: str
    inputs: list[np.ndarray] | None = None
    outputs: list[np.ndarray] | None = None
    error: str | None = None
    meta: Any = None  # what the loader knows about the input (e.g. its image geometry)


def _in_order(futures: Iterable[Future[Item]], window: int, pools: Sequence[ThreadPoolExecutor]) -> Iterator[Item]:
    """The futures' results in submission order, with at most ``window`` submitted ahead of the one
    yielded (memory stays flat on a million inputs); then the pools are shut down, also when the
    consumer stops early or fails."""
    pending: collections.deque[Future[Item]] = collections.deque()
    try:
        for future in futures:
            pending.append(future)
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)


def decode_ordered(
    keys: Iterable[str], load: Callable[[str], tuple[list[np.ndarray], Any]], threads: int = 2, lookahead: int = 16
) -> Iterator[Item]:
    """Decode inputs in a pool (``load`` gives the tensors and their ``meta``); per-input
    errors (our SlurmTpuError) become ``Item.error``."""

    def task(seq: int, key: str) -> Item:
        try:
            inputs, meta = load(key)
            return Item(seq, key, inputs=inputs, meta=meta)
        except SlurmTpuError as exc:
            return Item(seq, key, error=str(exc))

    pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="decode")
    yield from _in_order((pool.submit(task, seq, key) for seq, key in enumerate(keys)), lookahead, [pool])


def _run(engine: Engine, item: Item) -> Item:
    if item.error is None:
        item.outputs = engine.run(item.inputs or [])
        item.inputs = None
    return item


def _run_next(engine: Engine, previous: Future[Item]) -> Item:
    """The next segment on the previous one's outputs."""
    item = previous.result()
    if item.error is None:
        item.inputs, item.outputs = item.outputs, None
    return _run(engine, item)


def infer_ordered(
    engines: Sequence[Engine], items: Iterable[Item], chain: bool = False, depth: int = 8
) -> Iterator[Item]:
    """Run every item, yielding them in input order with ``outputs`` (or ``error``) set."""
    if not chain:  # a shared engine once per request it may have in flight
        engines = [engine for engine in engines for _ in range(max(1, getattr(engine, "in_flight", 1)))]
    if len(engines) == 1:
        for item in items:
            yield _run(engines[0], item)
        return
    # Every engine is driven by one thread of its own, all its life.
    if chain:
        pools = [ThreadPoolExecutor(1, thread_name_prefix=f"segment-{i}") for i in range(len(engines))]

        def submit(item: Item) -> Future[Item]:
            future = pools[0].submit(_run, engines[0], item)
            for pool, engine in zip(pools[1:], engines[1:]):
                future = pool.submit(_run_next, engine, future)
            return future

    else:
        free: queue.SimpleQueue[Engine] = queue.SimpleQueue()
        for engine in engines:
            free.put(engine)
        mine = threading.local()  # a pool thread's engine, taken when the thread starts
        pools = [ThreadPoolExecutor(len(engines), "engine", initializer=lambda: setattr(mine, "engine", free.get()))]

        def submit(item: Item) -> Future[Item]:
            return pools[0].submit(lambda: _run(mine.engine, item))

    yield from _in_order(map(submit, items), depth * len(engines), pools)
