"""Progress notifications: a committed checkpoint NOTIFYs ``agentrun_progress`` with its thread id (pg_progress).

The operator listens instead of polling every run (``agentrun_operator/io/notify.py``); a missed
notification would leave a status stale until the resync, an extra one costs a reconcile, so both
are checked here, with the throttle counted (at once, then at most one more per second per thread,
the trailing one never dropped; when each is sent is asserted on loop time in
unit/test_progress_notifier.py) and the reason the notification left the commit (no trigger).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import asyncpg
import pytest

from agentrun import StaleStateError
from agentrun.checkpoint.pg_progress import notify_sql
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.messages import user
from tests.support.checkpointers import write

CHANNEL = "agentrun_progress"


async def _listen(dsn: str) -> tuple[asyncpg.Connection, asyncio.Queue[tuple[float, str]]]:
    conn = await asyncpg.connect(dsn)
    queue: asyncio.Queue[tuple[float, str]] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    await conn.add_listener(CHANNEL, lambda _c, _pid, _ch, payload: queue.put_nowait((loop.time(), payload)))
    return conn, queue


async def _next(queue: asyncio.Queue[tuple[float, str]], within: float = 5) -> tuple[float, str]:
    return await asyncio.wait_for(queue.get(), within)


async def test_a_commit_notifies_its_thread_at_once_and_a_refused_write_does_not(pg_dsn: str) -> None:
    cp = PgCheckpointer(pg_dsn)
    await cp.setup()
    conn, queue = await _listen(pg_dsn)
    try:
        await cp.aput("ns/thread-a", write((0, user("a")), count=1), expected_version=0)
        assert (await _next(queue))[1] == "ns/thread-a"
        await cp.aput("ns/thread-b", write((0, user("b")), count=1), expected_version=0)
        assert (await _next(queue))[1] == "ns/thread-b", "another thread is not throttled by the first"
        with pytest.raises(StaleStateError):
            await cp.aput("ns/thread-a", write(count=1, step=9), expected_version=0)
        await asyncio.sleep(1.3)
        assert queue.empty(), "a write refused as stale committed nothing and must not wake the operator"
    finally:
        await conn.close()
        await cp.aclose()


async def test_a_burst_notifies_at_its_start_and_once_more_for_its_end(pg_dsn: str) -> None:
    cp = PgCheckpointer(pg_dsn)
    await cp.setup()
    conn, queue = await _listen(pg_dsn)
    try:
        began = time.monotonic()
        for step in range(20):
            await cp.aput("ns/burst", write(count=0, step=step), expected_version=step)
        burst = time.monotonic() - began
        heard = [(await _next(queue))[1]]
        with contextlib.suppress(TimeoutError):
            while True:  # until a quiet spell longer than the throttle's interval
                heard.append((await _next(queue, 2.5))[1])
        # Counted, not timed (when each is sent is unit/test_progress_notifier.py's, on loop time): the leading
        # edge and the trailing one, plus one per further interval the burst lasted on a loaded machine.
        assert set(heard) == {"ns/burst"}
        assert 2 <= len(heard) <= 2 + int(burst), f"20 steps in {burst:.2f}s made {len(heard)} notifications"
    finally:
        await conn.close()
        await cp.aclose()


async def test_a_final_checkpoint_notifies_at_once_and_closing_sends_what_is_due(pg_dsn: str) -> None:
    cp = PgCheckpointer(pg_dsn)
    await cp.setup()
    conn, queue = await _listen(pg_dsn)
    try:
        # That the final one is not held back to the interval's end is unit/test_progress_notifier.py's (loop
        # time); here: it arrives, once.
        await cp.aput("ns/final", write(count=0), expected_version=0)
        assert (await _next(queue))[1] == "ns/final"
        await cp.aput("ns/final", write(count=0, step=1, status="completed"), expected_version=1)
        assert (await _next(queue))[1] == "ns/final"
        await asyncio.sleep(1.5)
        assert queue.empty(), "two commits, two notifications: nothing more comes"

        await cp.aput("ns/closing", write(count=0), expected_version=0)
        await _next(queue)
        await cp.aput("ns/closing", write(count=0, step=1), expected_version=1)  # due at the interval's end
        await cp.aclose()
        # Sent by aclose or never: a closed store's pool cannot send it at the interval's end.
        _, thread = await _next(queue)
        assert thread == "ns/closing", "a closing store sends the notification it still owed"
    finally:
        await conn.close()
        await cp.aclose()


async def test_no_trigger_notifies_inside_the_commit_and_any_thread_id_arrives_intact(pg_dsn: str) -> None:
    cp = PgCheckpointer(pg_dsn)
    await cp.setup()
    conn, queue = await _listen(pg_dsn)
    try:
        # The checkpoint's own transaction must not NOTIFY (the lock it takes serializes every runner's commits).
        assert await conn.fetchval("SELECT count(*) FROM pg_trigger WHERE tgname = 'agentrun_progress_notify'") == 0
        for thread in ("ns/it's", "ns/$p$ and $pp$", "ns/back\\slash", "ns/ends with $p", "ns/é ✓"):
            await conn.execute(notify_sql(thread))
            assert (await _next(queue))[1] == thread
    finally:
        await conn.close()
        await cp.aclose()


async def test_watch_progress_hears_postgres_and_redis_as_typed_events_and_closes_everything(
    pg_dsn: str, redis_prefix: str
) -> None:
    """``ControlStore.watch_progress`` (issue 21 item 3): what the operator and the history server consume.

    A store with a Redis cache is heard on both (``Listening`` from each, then ``Progressed`` per commit
    and per published step; stop events are not progress); closing the generator ends every connection
    and task (the tier's leaked-task check); a store it cannot reach says ``Deaf`` with a growing backoff.
    """
    import contextlib

    from agentrun.checkpoint import open_store
    from agentrun.checkpoint.cached import CachedStore
    from agentrun.checkpoint.listen import Deaf, Listening, Progressed

    from .conftest import redis_url

    store = open_store(pg_dsn, redis_url=redis_url(), redis_prefix=redis_prefix)
    assert isinstance(store, CachedStore)
    await store.setup()
    heard: list[object] = []

    async def publishing() -> None:
        # Pub/sub reaches only subscribers already in place: publish until heard (a stop first, which is no progress).
        while True:
            await store.cache.publish("redis/1", {"type": "stop", "thread_id": "redis/stop"})
            await store.cache.publish("redis/1", {"type": "progress", "thread_id": "redis/1"})
            await asyncio.sleep(0.2)

    publisher: asyncio.Task[None] | None = None
    try:
        async with contextlib.aclosing(store.watch_progress(name="agentrun-test-listen")) as progress:
            async for event in progress:
                heard.append(event)
                if len([e for e in heard if isinstance(e, Listening)]) == 2 and len(heard) == 2:
                    await store.aput("pg/1", write((0, user("hi")), count=1), expected_version=0)
                    publisher = asyncio.create_task(publishing())
                if {"pg/1", "redis/1"} <= {e.thread_id for e in heard if isinstance(e, Progressed)}:
                    break
    finally:
        if publisher is not None:
            publisher.cancel()
            await asyncio.gather(publisher, return_exceptions=True)
        await store.aclose()
    assert {e.source for e in heard if isinstance(e, Listening)} == {"postgres", "redis"}
    assert {(e.thread_id, e.source) for e in heard if isinstance(e, Progressed)} >= {
        ("pg/1", "postgres"),
        ("redis/1", "redis"),
    }
    assert "redis/stop" not in {e.thread_id for e in heard if isinstance(e, Progressed)}, "a stop is no progress"

    unreachable = PgCheckpointer("postgresql://postgres@127.0.0.1:1/postgres")
    deaf: list[Deaf] = []
    async with contextlib.aclosing(unreachable.watch_progress()) as progress:
        async for event in progress:
            assert isinstance(event, Deaf) and not event.was_up, event
            deaf.append(event)
            if len(deaf) == 2:
                break
    assert [d.retry_in for d in deaf] == [1.0, 2.0], "the listen backs off, doubling"


async def test_the_operator_hears_store_progress_on_postgres_and_redis(pg_dsn: str, redis_prefix: str) -> None:
    """The operator's listeners (io/notify.py) over ``watch_progress``: a commit (LISTEN) and a step published on
    Redis (a ``durableCheckpointEveryStep: false`` run) each wake the run's thread; closing the store's listeners
    ends them (the tier's leaked-task check)."""
    import contextlib

    from agentrun.checkpoint.redis_cache import RedisHotCache
    from agentrun_operator.io.notify import LISTEN_NAME, Listeners

    from .conftest import redis_url

    woken: asyncio.Queue[str] = asyncio.Queue()
    listeners = Listeners(on_progress=woken.put_nowait, on_resync=lambda _dsn: None)
    store = PgCheckpointer(pg_dsn)
    await store.setup()
    cache = RedisHotCache(redis_url(), prefix=redis_prefix)
    try:
        listeners.open(pg_dsn, store.watch_progress(name=LISTEN_NAME))
        listeners.open_redis(pg_dsn, redis_url(), cache.watch_progress())
        await listeners.listening(pg_dsn)  # the LISTEN is in place (the first connect is waited for)
        await store.aput("pg/1", write((0, user("hi")), count=1), expected_version=0)
        assert await asyncio.wait_for(woken.get(), 5) == "pg/1", "a commit did not wake its thread"

        async def published_until_heard() -> str:
            # Pub/sub reaches only subscribers already in place, and the Listeners say nothing of Redis being
            # subscribed yet: publish the step again until it is heard.
            while True:
                await cache.publish("redis/1", {"type": "progress", "thread_id": "redis/1"})
                with contextlib.suppress(TimeoutError):
                    return await asyncio.wait_for(woken.get(), 0.2)

        assert await asyncio.wait_for(published_until_heard(), 10) == "redis/1", "a Redis step did not wake its thread"
    finally:
        await listeners.aclose()
        await cache.aclose()
        await store.aclose()
