"""Prometheus exposition through ``prometheus_client``: the one place slurm-tpu renders metrics.

The node's metrics (:mod:`slurm_tpu.ops.metrics`) and ``slurm-tpu serve``'s
(:mod:`slurm_tpu.runner.serve.metrics`) are custom collectors whose ``collect()`` reads
the current figures each scrape; ``prometheus_client`` writes the text (escaping label
values, whatever a string holds). Nothing here formats a line by hand.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

# CONTENT_TYPE is re-exported (the serve's /metrics answers with it).
try:  # prometheus_client >= 0.22 names the classic text format; older ones call it the latest
    from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4 as CONTENT_TYPE
except ImportError:  # pragma: no cover (Debian bookworm's 0.16)
    from prometheus_client.exposition import CONTENT_TYPE_LATEST as CONTENT_TYPE  # noqa: F401


def gauge(name: str, documentation: str) -> GaugeMetricFamily:
    """An empty gauge family; samples are added with :func:`add`."""
    return GaugeMetricFamily(name, documentation)


def counter(name: str, documentation: str) -> CounterMetricFamily:
    """An empty counter family named ``name`` (which ends in ``_total``, the sample's name)."""
    return CounterMetricFamily(name, documentation)


def add(family: Metric, labels: Mapping[str, str], value: float) -> None:
    """One sample with its own label set (series of one family may differ in labels, as
    dcgm-exporter's do: a device's series have ``hpc_job`` only while a job holds it)."""
    name = family.name + "_total" if family.type == "counter" else family.name
    family.add_sample(name, dict(labels), float(value))


def registry_of(collector: Collector) -> CollectorRegistry:
    """A registry holding only ``collector`` (no process/platform collectors: the node's figures alone)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def render(collector: Collector) -> bytes:
    """The text exposition format (0.0.4) of one collection."""
    from prometheus_client.exposition import generate_latest

    return generate_latest(registry_of(collector))


class TextfileError(Exception):
    """The textfile target is unsafe or unwritable (one line naming it)."""


def write_textfile(path: str, collector: Collector) -> None:
    """Write one collection to ``path`` for node_exporter's textfile collector.

    ``prometheus_client.write_to_textfile`` writes ``<path>.<pid>.<thread>`` (not ``*.prom``,
    so never read) in the same directory and rename()s it over ``path``. It opens that name
    with a plain open(), following a symlink, so a directory others than its owner may write
    is refused: anyone could plant that name. Its owner (Debian: ``prometheus`` for
    /var/lib/prometheus/node-exporter) must be trusted as much as the writer.
    """
    from prometheus_client.exposition import write_to_textfile

    if not path.endswith(".prom"):
        raise TextfileError(f"{path}: node_exporter's textfile collector reads only *.prom files")
    directory = os.path.dirname(os.path.abspath(path))
    try:
        info = os.stat(directory)
    except OSError as exc:
        raise TextfileError(f"{directory}: {exc.strerror}") from exc
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise TextfileError(
            f"{directory} is mode {stat.S_IMODE(info.st_mode):04o}: others could plant the "
            "temporary file's name; use a directory only its owner can write"
        )
    mask = os.umask(0o022)  # node_exporter runs unprivileged: the file must be world-readable from its creation
    try:
        write_to_textfile(path, registry_of(collector))
    except OSError as exc:
        raise TextfileError(f"{path}: {exc.strerror}") from exc
    finally:
        os.umask(mask)


def serve_http(host: str, port: int, collector: Collector) -> None:
    """Serve ``collector`` at /metrics with prometheus_client's own server until interrupted."""
    import threading

    from prometheus_client.exposition import start_http_server

    start_http_server(port, addr=host, registry=registry_of(collector))
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
