"""Progress from the stores themselves: one LISTEN connection per PostgreSQL store, Redis pub/sub as a fast path.

After a checkpoint commits, the runner's store NOTIFYs channel
``agentrun_progress`` with its thread id, at most about twice per second per
thread (``agentrun/checkpoint/pg_progress.py``; the runner's stop check uses
channel ``agentrun_stop``, same payload). The operator holds one
dedicated connection per distinct DSN (``Listeners.open``, called when the
store's pool opens) and hands each thread id to ``on_progress``; nothing is
queried per run. The listening itself is the store's (``ControlStore.watch_progress``, typed events,
one listen-with-backoff loop in ``agentrun/checkpoint/listen.py``); this module decides what the
events mean for reconciles. A store whose DSN goes through a pooler in transaction mode
(PgBouncer) is listened to on the Secret's direct ``postgresListenDsn``, or not
at all (``stores.py``): a LISTEN through such a pooler hears nothing.

A notification is a wake-up, not the data: the reconcile it triggers reads
the progress. PostgreSQL delivers a notification only to sessions listening
when it commits: a reconcile reads progress only once the store's LISTEN is
in place (``listening``: the first connect is waited for, briefly), and after
an outage or a slow first connect ``on_resync(dsn)`` reconciles every live run
of that store as soon as the LISTEN is back, which covers whatever was
committed while no one listened. A connection that dies is seen at once (asyncpg's termination
callback) or at the next ping (``pg_progress.PING_SECONDS``, for a peer that vanished
without closing); reconnects back off up to ``pg_progress.MAX_BACKOFF`` seconds.

Redis: when a store has a ``redisUrl``, the runner also publishes each step on
``<prefix>:events:<thread>`` (``redis_cache.py``), including the steps of
``durableCheckpointEveryStep: false`` runs that reach PostgreSQL only at their
terminal points. One pattern subscription per Redis URL forwards those to
``on_progress`` too (``RedisHotCache.watch_progress``, retried every 30 s while Redis is down).
Pub/sub is at most once; PostgreSQL stays the record.

The runner's notification is its own transaction with asynchronous commit,
not part of the checkpoint's: a notifying transaction holds PostgreSQL's
database-wide notify lock through its commit (``pg_progress`` says more).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncGenerator, Callable

from agentrun.checkpoint.listen import Deaf, Listening, Progressed, ProgressEvent

log = logging.getLogger("agentrun_operator.notify")

# What the operator's LISTEN connections are called on the server (pg_stat_activity).
LISTEN_NAME = "agentrun-operator-listen"
FIRST_LISTEN_WAIT = 2.0


class Listeners:
    """The listening side of every open store; callbacks run on the event loop and must not block."""

    def __init__(self, *, on_progress: Callable[[str], None], on_resync: Callable[[str], None]) -> None:
        self.on_progress = on_progress
        self.on_resync = on_resync
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._redis: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._ready: dict[str, asyncio.Event] = {}  # set while the store's LISTEN is in place
        self._ever: set[str] = set()  # stores listened to at least once
        self._gap: set[str] = set()  # stores whose progress may have been read while nobody listened

    def open(self, dsn: str, progress: AsyncGenerator[ProgressEvent, None]) -> None:
        """Follow the PostgreSQL progress of store ``dsn`` (its ``watch_progress``, named ``LISTEN_NAME``)."""
        if dsn not in self._tasks:
            self._ready[dsn] = asyncio.Event()
            # An empty context, not the opening reconcile's: that holds kopf's cause (a whole body) (wakeups.py).
            self._tasks[dsn] = asyncio.create_task(
                self._follow(dsn, progress), name="agentrun-listen", context=contextvars.Context()
            )

    async def listening(self, dsn: str) -> None:
        """Call before reading a run's progress: a commit after the read must wake the run.

        Listening: returns at once. The store's first LISTEN still connecting: waits for it (at most
        ``FIRST_LISTEN_WAIT`` seconds), so the runs read first need no resync. Otherwise (an outage, a
        first connect that is slow or failing) the store is marked: its runs are resynced once it is back.
        """
        ready = self._ready.get(dsn)
        if ready is None or ready.is_set():
            return
        if dsn not in self._ever and dsn not in self._gap:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ready.wait(), FIRST_LISTEN_WAIT)
            if ready.is_set():
                return
        self._gap.add(dsn)

    def open_redis(self, dsn: str, redis_url: str, progress: AsyncGenerator[ProgressEvent, None]) -> None:
        """Follow the steps store ``dsn``'s runs publish on ``redis_url`` (its cache's ``watch_progress``)."""
        key = (dsn, redis_url)
        if key not in self._redis:
            self._redis[key] = asyncio.create_task(
                self._follow_redis(progress), name="agentrun-subscribe", context=contextvars.Context()
            )

    async def close(self, dsn: str) -> None:
        """Stop following store ``dsn`` (its LISTEN and its Redis subscriptions)."""
        tasks = [self._tasks.pop(dsn)] if dsn in self._tasks else []
        tasks += [self._redis.pop(key) for key in [k for k in self._redis if k[0] == dsn]]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._ready.pop(dsn, None)
        self._ever.discard(dsn)
        self._gap.discard(dsn)

    async def aclose(self) -> None:
        """Stop following every store."""
        for dsn in {*self._tasks, *(k[0] for k in self._redis)}:
            await self.close(dsn)

    async def _follow(self, dsn: str, progress: AsyncGenerator[ProgressEvent, None]) -> None:
        async with contextlib.aclosing(progress):
            async for event in progress:
                if isinstance(event, Progressed):
                    self.on_progress(event.thread_id)
                elif isinstance(event, Listening):
                    self._listening(dsn)
                else:
                    self._deaf(dsn, event)

    def _listening(self, dsn: str) -> None:
        self._ready[dsn].set()
        self._ever.add(dsn)
        if dsn in self._gap:  # whatever committed while nobody listened
            self._gap.discard(dsn)
            log.info("listening for store progress; resyncing the runs read while nobody listened")
            self.on_resync(dsn)

    def _deaf(self, dsn: str, deaf: Deaf) -> None:
        if dsn not in self._gap:
            log.warning(
                "store progress listener lost (%s); reconnecting with backoff, runs of that store are "
                "resynced once it is back",
                type(deaf.error).__name__,
            )
        self._ready[dsn].clear()
        if dsn not in self._gap and dsn in self._ever:
            # The store just went away: reconcile its runs now so their StoreAvailable condition
            # shows the outage while it lasts, not only the resync once it is back.
            self.on_resync(dsn)
        self._gap.add(dsn)

    async def _follow_redis(self, progress: AsyncGenerator[ProgressEvent, None]) -> None:
        async with contextlib.aclosing(progress):
            async for event in progress:
                if isinstance(event, Progressed):
                    self.on_progress(event.thread_id)
                elif isinstance(event, Deaf):
                    log.debug("Redis progress subscription failed (%s); retrying in %.0fs", event.error, event.retry_in)
