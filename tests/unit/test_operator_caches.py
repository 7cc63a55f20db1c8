"""Watch-fed caches (``io/caches.py``): a Secret read once, kept current by its watch; a created pod not lost.

Guarantees: a burst of runs naming one Secret costs one API read; a watch event replaces the entry
(a password rotated, a label added), even one that arrives while the first read is in flight; other
Secrets are never kept; a pod the operator just created is not taken for a missing one before its
watch event arrives (that would reschedule the attempt: a second pod).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from agentrun_operator.io.caches import PodCache, SecretCache
from agentrun_operator.io.kube import NotFound


def _secret(name: str, version: str, dsn: str = "postgresql://a@db/x", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "shop", "resourceVersion": version, "labels": labels},
        "data": {"postgresDsn": base64.b64encode(dsn.encode()).decode(), "token": "c2VjcmV0"},
    }


class _Api:
    """The API's answers for the cache's only call (GET by name), slow enough to race a watch event."""

    def __init__(self, objects: dict[str, dict[str, Any]], delay: float = 0.0) -> None:
        self.objects, self.delay, self.gets = objects, delay, 0

    async def get(self, path: str) -> dict[str, Any]:
        self.gets += 1
        await asyncio.sleep(self.delay)
        name = path.rsplit("/", 1)[-1]
        if name not in self.objects:
            raise NotFound(404, "NotFound", name)
        return self.objects[name]


async def test_a_burst_reads_a_secret_once_and_its_watch_keeps_it_current() -> None:
    api = _Api({"agentrun-store": _secret("agentrun-store", "1")}, delay=0.01)
    cache = SecretCache(api)  # type: ignore[arg-type]
    views = await asyncio.gather(*(cache.get("shop", "agentrun-store") for _ in range(50)))
    assert api.gets == 1, "fifty runs naming one Secret must cost one read"
    assert views[0].exists and "token" not in views[0].data, "only the store keys are kept"
    assert cache.observe("MODIFIED", _secret("agentrun-store", "2", dsn="postgresql://b@db/x", team="a"))
    view = await cache.get("shop", "agentrun-store")
    assert view.resource_version == "2" and view.labels == {"team": "a"} and api.gets == 1
    assert not cache.observe("ADDED", _secret("unrelated", "7")), "a Secret no run named was kept"
    cache.observe("DELETED", _secret("agentrun-store", "3"))
    assert not (await cache.get("shop", "agentrun-store")).exists and api.gets == 1
    cache.invalidate("shop", "agentrun-store")  # the store refused the credentials
    assert (await cache.get("shop", "agentrun-store")).exists and api.gets == 2


async def test_a_watch_event_during_the_first_read_wins_over_the_read() -> None:
    api = _Api({"agentrun-store": _secret("agentrun-store", "1")}, delay=0.05)
    cache = SecretCache(api)  # type: ignore[arg-type]
    reading = asyncio.create_task(cache.get("shop", "agentrun-store"))
    await asyncio.sleep(0.01)
    cache.observe("MODIFIED", _secret("agentrun-store", "2"))
    assert (await reading).resource_version == "2", "the older read replaced a newer watch event"
    assert (await cache.get("shop", "agentrun-store")).resource_version == "2"


async def test_a_created_pod_is_assumed_until_its_watch_event_and_read_once_past_the_window() -> None:
    created = {"metadata": {"name": "run-1", "namespace": "shop"}, "status": {"phase": "Pending"}}
    api = _Api({})
    pods = PodCache(api)  # type: ignore[arg-type]
    # the index is empty: the watch has not reported the pod yet
    assert await pods.get("shop", "run-1") is None
    pods.assume("shop", created)
    seen = await pods.get("shop", "run-1")
    assert seen is not None and seen.phase == "Pending" and api.gets == 0
    pods._assumed[("shop", "run-1")] = (seen, 0.0)  # the window has passed with no watch event
    assert await pods.get("shop", "run-1") is None and api.gets == 1, "past the window the API decides"


async def test_secrets_naming_one_dsn_share_one_pool_and_an_idle_pool_is_closed() -> None:
    from agentrun_operator.io.stores import StoreRegistry

    dsn = "postgresql://agentrun@db:5432/shared"
    api = _Api(
        {
            "team-a": _secret("team-a", "1", dsn=dsn),
            "team-b": _secret("team-b", "1", dsn=dsn),
            "other": _secret("other", "1", dsn="postgresql://agentrun@db:5432/other"),
        }
    )
    registry = StoreRegistry(SecretCache(api), idle_seconds=0.0)  # type: ignore[arg-type]
    try:
        a = await registry.get("shop", "team-a", user="run-a")
        b = await registry.get("shop", "team-b", user="run-b")
        c = await registry.get("shop", "other", user="run-c")
        assert a is b, "two Secrets naming one DSN must share one pool"
        assert c is not a and len(registry._pools) == 2
        assert registry.users_of(dsn) == {"run-a", "run-b"}
        registry.release("run-a")
        assert await registry.sweep() == 0, "a pool a live run still uses was closed"
        registry.release("run-b")
        assert await registry.sweep() == 1 and set(registry._pools) == {"postgresql://agentrun@db:5432/other"}
        assert await registry.get("shop", "team-a", user="run-a") is not a, "a closed pool was handed out again"
    finally:
        await registry.close()


async def test_a_secret_with_a_redis_url_gets_a_redis_cache_over_the_shared_pool() -> None:
    from agentrun.checkpoint.cached import CachedStore
    from agentrun_operator.io.stores import StoreRegistry

    dsn = "postgresql://agentrun@db:5432/shared"
    cached = _secret("cached", "1", dsn=dsn)
    cached["data"]["redisUrl"] = base64.b64encode(b"redis://127.0.0.1:6379/0").decode()
    api = _Api({"plain": _secret("plain", "1", dsn=dsn), "cached": cached})
    registry = StoreRegistry(SecretCache(api), idle_seconds=0.0)  # type: ignore[arg-type]
    try:
        plain = await registry.get("shop", "plain", user="run-a")
        store = await registry.get("shop", "cached", user="run-b")
        assert isinstance(store, CachedStore) and store.inner is plain, "the Redis cache must share the DSN's pool"
        assert await registry.get("shop", "cached", user="run-b") is store
    finally:
        await registry.close()
    assert not registry._pools


def test_the_operator_loads_redis_only_for_a_store_with_a_redis_url() -> None:
    # About 7 MB of the operator's memory (bench/operator.py: operator_rss_mb_1000_runs): most stores have none.
    import subprocess
    import sys

    code = "import sys, agentrun_operator.__main__; print('redis' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "False", "importing the operator loaded redis"
