"""The Prometheus collector shows exactly what `store.stats()` counts."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

import corral
import corral.aio
import corral.prometheus


def scrape(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_collector_reports_counters_and_histograms() -> None:
    registry = CollectorRegistry()
    with corral.connect("memory://metrics") as store:
        corral.prometheus.register(store, registry)
        lock = store.lock("job", ttl=10)
        assert lock.acquire()
        assert not store.lock("job", ttl=10).acquire()
        lock.release()
        text = scrape(registry)
    assert 'corral_lock_acquisitions_total{store="memory://metrics"} 1.0' in text
    assert 'corral_lock_timeouts_total{store="memory://metrics"} 1.0' in text
    assert 'corral_lock_hold_seconds_count{store="memory://metrics"} 1.0' in text
    assert 'corral_lock_wait_seconds_bucket{le="+Inf",store="memory://metrics"} 1.0' in text


async def test_collector_reads_an_asyncio_store_too() -> None:
    registry = CollectorRegistry()
    async with corral.aio.connect("memory://async-metrics") as store:
        corral.prometheus.register(store, registry, namespace="app")
        assert await store.lock("job", ttl=10).acquire()
        assert 'app_lock_acquisitions_total{store="memory://async-metrics"} 1.0' in scrape(registry)
