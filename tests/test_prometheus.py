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


def test_several_stores_share_one_registry_and_one_family_per_metric() -> None:
    registry = CollectorRegistry()
    with corral.connect("memory://first") as first, corral.connect("memory://second") as second:
        corral.prometheus.register(first, registry)
        corral.prometheus.register(second, registry)
        assert first.lock("a", ttl=10).acquire()
        assert second.lock("b", ttl=10).acquire()
        assert second.lock("c", ttl=10).acquire()
        text = scrape(registry)
    assert text.count("# TYPE corral_lock_acquisitions_total counter") == 1
    assert text.count("# TYPE corral_lock_wait_seconds histogram") == 1
    assert 'corral_lock_acquisitions_total{store="memory://first"} 1.0' in text
    assert 'corral_lock_acquisitions_total{store="memory://second"} 2.0' in text


def test_the_default_registry_takes_several_stores() -> None:
    from prometheus_client import REGISTRY

    with corral.connect("memory://one") as one, corral.connect("memory://two") as two:
        corral.prometheus.register(one)
        corral.prometheus.register(two)  # no DuplicateTimeseries
        assert 'store="memory://two"' in generate_latest(REGISTRY).decode()


def test_counters_never_go_down_when_a_store_is_closed_and_dropped() -> None:
    import gc

    registry = CollectorRegistry()
    kept = corral.connect("memory://shared")
    gone = corral.connect("memory://shared")
    corral.prometheus.register(kept, registry)
    corral.prometheus.register(gone, registry)
    assert kept.lock("a", ttl=10).acquire()
    for name in "bcd":
        assert gone.lock(name, ttl=10).acquire()
    line = 'corral_lock_acquisitions_total{store="memory://shared"} 4.0'
    assert line in scrape(registry)
    gone.close()
    del gone
    gc.collect()
    assert line in scrape(registry)
    kept.close()
