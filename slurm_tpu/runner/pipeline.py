"""Keep the device busy: decode ahead in a thread pool, dispatch to free engines, keep order.

- ``decode_ordered``: a thread pool decodes/preprocesses up to ``lookahead`` inputs
  ahead of the device (a bounded window, so memory stays flat on a million images);
  results come out in input order.
- ``infer_ordered``: one engine runs inline (no thread hop on the hot path); several
  engines each get a thread pulling from one bounded queue (whichever is free takes
  the next input) and a reorder buffer restores input order; ``chain=True`` instead
  runs engine i on the output of engine i-1 (a model split in segments), each stage
  in its own thread, with a queue of its own, so N segments work on N inputs at once.
TFLite's invoke() releases the GIL, so these threads really overlap.
"""

from __future__ import annotations

import collections
import contextlib
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
    window: collections.deque[Future[Item]] = collections.deque()
    try:
        for seq, key in enumerate(keys):
            window.append(pool.submit(task, seq, key))
            if len(window) >= lookahead:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()
    finally:
        for future in window:
            future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


_DONE = object()  # end marker; a worker's or the feeder's failure travels as the exception itself


def _run(engine: Engine, item: Item) -> Item:
    if item.error is None:
        item.outputs = engine.run(item.inputs or [])
        item.inputs = None
    return item


def infer_ordered(
    engines: Sequence[Engine], items: Iterable[Item], chain: bool = False, depth: int = 8
) -> Iterator[Item]:
    """Run every item, yielding them in input order with ``outputs`` (or ``error``) set."""
    if len(engines) == 1:
        for item in items:
            yield _run(engines[0], item)
        return
    # Stages of worker threads, each stage's workers pulling from one queue: a pool is one
    # stage of every engine (the free one takes the next input), a chain one stage per engine.
    stages = [[e] for e in engines] if chain else [list(engines)]
    copies = len(stages[0])  # end markers each queue carries: one per worker of a stage
    queues: list[queue.Queue[Any]] = [queue.Queue(maxsize=depth * copies) for _ in stages]
    queues.append(queue.Queue(maxsize=depth if chain else 0))  # the results (a pool's out of order)
    stop = threading.Event()

    def work(engine: Engine, inbox: queue.Queue[Any], outbox: queue.Queue[Any], last: bool) -> None:
        while True:
            item = inbox.get()
            if item is _DONE or stop.is_set():
                outbox.put(_DONE)
                return
            if not isinstance(item, BaseException):
                try:
                    _run(engine, item)
                    if not last and item.error is None:  # the next segment's input
                        item.inputs, item.outputs = item.outputs, None
                except BaseException as exc:  # noqa: BLE001 - the worker's failure goes to the consumer, which raises it
                    item = exc
            outbox.put(item)

    threads = [threading.Thread(target=_feed, args=(items, queues[0], stop, copies), daemon=True)]
    for i, stage in enumerate(stages):
        threads += [
            threading.Thread(
                target=work,
                args=(e, queues[i], queues[i + 1], i == len(stages) - 1),
                daemon=True,
                name=f"segment-{i}" if chain else f"engine-{j}",
            )
            for j, e in enumerate(stage)
        ]
    for t in threads:
        t.start()
    pending: dict[int, Item] = {}
    next_seq, finished = 0, 0
    try:
        while finished < copies:
            got = queues[-1].get()
            if got is _DONE:
                finished += 1
                continue
            if isinstance(got, BaseException):
                raise got
            pending[got.seq] = got
            while next_seq in pending:
                yield pending.pop(next_seq)
                next_seq += 1
        for seq in sorted(pending):  # only if sequence numbers had gaps
            yield pending.pop(seq)
    finally:
        _shutdown(stop, queues, threads, copies)


def _feed(items: Iterable[Item], out: queue.Queue[Any], stop: threading.Event, copies: int) -> None:
    try:
        for item in items:
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
    except BaseException as exc:  # noqa: BLE001 - decoding crashed: let the consumer raise it
        out.put(exc)
    for _ in range(copies):
        out.put(_DONE)


def _shutdown(
    stop: threading.Event, queues: list[queue.Queue[Any]], threads: list[threading.Thread], copies: int
) -> None:
    """Stop early (consumer gone or failed): unblock every thread, then wait for them."""
    stop.set()
    for q in queues:
        with contextlib.suppress(queue.Empty):
            while True:
                q.get_nowait()
        for _ in range(copies):
            try:
                q.put_nowait(_DONE)
            except queue.Full:
                pass
    for t in threads:
        t.join(timeout=5)
