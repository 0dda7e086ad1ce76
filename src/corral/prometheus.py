"""Expose a store's lock (and cache) statistics to Prometheus.

    pip install 'corral[prometheus]'

    from prometheus_client import start_http_server
    import corral, corral.prometheus

    store = corral.connect("redis://cache:6379/0")
    corral.prometheus.register(store)
    start_http_server(9100)

The collector reads `store.stats()` at each scrape, so it costs nothing
between scrapes and always agrees with what the store itself reports. Works
with blocking and asyncio stores alike. Metrics carry a `store` label (the
store's URL, password removed), so several stores can share one registry.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from corral.core.stats import LOCK_COUNTERS, LOCK_HISTOGRAMS

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

__all__ = ["StoreCollector", "register"]


class _HasStats(Protocol):
    @property
    def server(self) -> str: ...

    def stats(self) -> dict[str, Any]: ...


def _histogram(
    name: str, documentation: str, snapshot: Mapping[str, Any], labels: dict[str, str]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=list(labels))
    buckets = [(bound, float(count)) for bound, count in snapshot["buckets"].items()]
    family.add_metric(list(labels.values()), buckets, float(snapshot["sum"]))
    return family


class StoreCollector(Collector):
    """A Prometheus collector over one store's `stats()`."""

    def __init__(self, store: _HasStats, namespace: str = "corral") -> None:
        self._store = store
        self._namespace = namespace

    def collect(self) -> Iterator[Metric]:
        stats = self._store.stats()
        store = {"store": self._store.server}
        prefix = f"{self._namespace}_lock"
        locks = stats["locks"]
        for counter, documentation in LOCK_COUNTERS.items():
            family = CounterMetricFamily(f"{prefix}_{counter}", documentation, labels=["store"])
            family.add_metric([store["store"]], float(locks[counter]))
            yield family
        for histogram, documentation in LOCK_HISTOGRAMS.items():
            yield _histogram(f"{prefix}_{histogram}", documentation, locks[histogram], store)
        for namespace, metrics in stats.get("caches", {}).items():
            labels = {**store, "namespace": namespace}
            for metric, value in metrics.items():
                name = f"{self._namespace}_cache_{metric}"
                if isinstance(value, Mapping):
                    yield _histogram(name, f"cache {metric}", value, labels)
                else:
                    family = CounterMetricFamily(name, f"cache {metric}", labels=list(labels))
                    family.add_metric(list(labels.values()), float(value))
                    yield family


def register(
    store: _HasStats, registry: CollectorRegistry = REGISTRY, namespace: str = "corral"
) -> StoreCollector:
    """Add a collector for `store` to `registry` (the default one unless given)."""
    collector = StoreCollector(store, namespace)
    registry.register(collector)
    return collector
