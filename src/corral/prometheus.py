"""Expose a store's lock (and cache) statistics to Prometheus.

    pip install 'corral[prometheus]'

    from prometheus_client import start_http_server
    import corral, corral.prometheus

    store = corral.connect("redis://cache:6379/0")
    corral.prometheus.register(store)
    start_http_server(9100)

The collector reads `store.stats()` at each scrape, so it costs nothing
between scrapes and always agrees with what the store itself reports. Works
with blocking and asyncio stores alike. Register as many stores as you like:
each metric is one family, with a sample per store (label `store`: the
store's URL, password removed); a store's counts stay after it is closed.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from corral.core.stats import CACHE_COUNTERS, CACHE_HISTOGRAMS, LOCK_COUNTERS, LOCK_HISTOGRAMS

try:
    from prometheus_client.core import (
        REGISTRY,
        CounterMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector, CollectorRegistry
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise ImportError(
        "corral.prometheus needs prometheus_client: pip install 'corral[prometheus]'"
    ) from exc

__all__ = ["StoresCollector", "register"]


class _HasStats(Protocol):
    @property
    def server(self) -> str: ...

    def stats(self) -> dict[str, Any]: ...


def _add_histograms(into: dict[str, Any] | None, more: Mapping[str, Any]) -> dict[str, Any]:
    if into is None:
        return {"sum": more["sum"], "buckets": dict(more["buckets"])}
    into["sum"] += more["sum"]
    for bound, count in more["buckets"].items():
        into["buckets"][bound] = into["buckets"].get(bound, 0) + count
    return into


class StoresCollector(Collector):
    """One Prometheus collector for every store registered in one registry and namespace.

    Each metric is one family with a sample per store (label `store`) and, for
    caches, per namespace: Prometheus refuses a metric name exposed twice.
    Stores on the same URL are added up. What a store counted stays in the
    totals after the store is closed or gone, since a Prometheus counter must
    never go down (it would read as a reset): the collector keeps each store's
    counters (a few numbers), not the store.
    """

    def __init__(self, namespace: str = "corral") -> None:
        self._namespace = namespace
        self._mutex = threading.Lock()
        self._sources: list[tuple[str, Any]] = []

    def add(self, store: _HasStats) -> None:
        source = getattr(store, "metrics", None)
        snapshot = source.snapshot if source is not None else store.stats
        with self._mutex:
            self._sources.append((store.server, snapshot))

    def collect(self) -> Iterator[Metric]:
        counters: dict[tuple[str, tuple[str, ...]], float] = {}
        histograms: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}
        labels_of: dict[str, list[str]] = {}
        docs: dict[str, str] = {}
        with self._mutex:
            sources = list(self._sources)
        for server, snapshot in sources:
            stats = snapshot()
            for kind, family_of in (("lock", "locks"), ("semaphore", "semaphores")):
                for name, value in stats.get(family_of, {}).items():
                    metric = f"{self._namespace}_{kind}_{name}"
                    labels_of[metric] = ["store"]
                    doc = {**LOCK_COUNTERS, **LOCK_HISTOGRAMS}.get(name, name)
                    docs[metric] = doc if kind == "lock" else f"{doc} (semaphore slots)"
                    key: tuple[str, tuple[str, ...]] = (metric, (server,))
                    if isinstance(value, Mapping):
                        histograms[key] = _add_histograms(histograms.get(key), value)
                    else:
                        counters[key] = counters.get(key, 0.0) + float(value)
            for namespace, metrics in stats.get("caches", {}).items():
                for name, value in metrics.items():
                    metric = f"{self._namespace}_cache_{name}"
                    labels_of[metric] = ["store", "namespace"]
                    docs[metric] = {**CACHE_COUNTERS, **CACHE_HISTOGRAMS}.get(name, name)
                    key = (metric, (server, namespace))
                    if isinstance(value, Mapping):
                        histograms[key] = _add_histograms(histograms.get(key), value)
                    else:
                        counters[key] = counters.get(key, 0.0) + float(value)
        for metric in sorted({m for m, _ in counters}):
            family = CounterMetricFamily(metric, docs[metric], labels=labels_of[metric])
            for (name, labels), value in sorted(counters.items()):
                if name == metric:
                    family.add_metric(list(labels), value)
            yield family
        for metric in sorted({m for m, _ in histograms}):
            histogram = HistogramMetricFamily(metric, docs[metric], labels=labels_of[metric])
            for (name, labels), value in sorted(histograms.items()):
                if name == metric:
                    buckets = [(bound, float(count)) for bound, count in value["buckets"].items()]
                    histogram.add_metric(list(labels), buckets, float(value["sum"]))
            yield histogram


_COLLECTORS: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, StoresCollector]] = (
    weakref.WeakKeyDictionary()
)
_MUTEX = threading.Lock()


def register(
    store: _HasStats, registry: CollectorRegistry = REGISTRY, namespace: str = "corral"
) -> StoresCollector:
    """Report `store` in `registry` (the default one unless given); any number of stores."""
    with _MUTEX:
        collectors = _COLLECTORS.setdefault(registry, {})
        collector = collectors.get(namespace)
        if collector is None:
            collector = collectors[namespace] = StoresCollector(namespace)
            registry.register(collector)
    collector.add(store)
    return collector
