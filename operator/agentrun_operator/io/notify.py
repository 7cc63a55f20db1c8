"""Progress from the stores themselves: one LISTEN connection per PostgreSQL store, Redis pub/sub as a fast path.

After a checkpoint commits, the runner's store NOTIFYs channel
``agentrun_progress`` with its thread id, at most about twice per second per
thread (``agentrun/checkpoint/pg_progress.py``; the runner's stop check uses
channel ``agentrun_stop``, same payload). The operator holds one
dedicated connection per distinct DSN (``Listeners.open``, called when the
store's pool opens) and hands each thread id to ``on_progress``; nothing is
queried per run. A store whose DSN goes through a pooler in transaction mode
(PgBouncer) is listened to on the Secret's direct ``postgresListenDsn``, or not
at all (``stores.py``): a LISTEN through such a pooler hears nothing.

A notification is a wake-up, not the data: the reconcile it triggers reads
the progress. PostgreSQL delivers a notification only to sessions listening
when it commits: a reconcile reads progress only once the store's LISTEN is
in place (``listening``: the first connect is waited for, briefly), and after
an outage or a slow first connect ``on_resync(dsn)`` reconciles every live run
of that store as soon as the LISTEN is back, which covers whatever was
committed while no one listened. A connection that dies is seen at once (asyncpg's termination
callback) or at the next ping (``PING_SECONDS``, for a peer that vanished
without closing); reconnects back off up to ``MAX_BACKOFF`` seconds.

Redis: when a store has a ``redisUrl``, the runner also publishes each step on
``<prefix>:events:<thread>`` (``redis_cache.py``), including the steps of
``durableCheckpointEveryStep: false`` runs that reach PostgreSQL only at their
terminal points. One pattern subscription per Redis URL forwards those to
``on_progress`` too. Pub/sub is at most once; PostgreSQL stays the record.

The runner's notification is its own transaction with asynchronous commit,
not part of the checkpoint's: a notifying transaction holds PostgreSQL's
database-wide notify lock through its commit (``pg_progress`` says more).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Callable
from typing import Any

import asyncpg

from agentrun.checkpoint.base import ControlStore
from agentrun.checkpoint.pg_progress import CHANNEL

log = logging.getLogger("agentrun_operator.notify")

PING_SECONDS = 30.0
# Reconnects are cheap (one connection per store) and the resync after them is what ends an outage's
# blind spot: retry often.
MAX_BACKOFF = 5.0
REDIS_RETRY = 30.0
CONNECT_TIMEOUT = 10.0
FIRST_LISTEN_WAIT = 2.0


def _setter(event: asyncio.Event) -> Callable[[Any], None]:
    return lambda _conn: event.set()


class Listeners:
    """The listening side of every open store; callbacks run on the event loop and must not block."""

    def __init__(self, *, on_progress: Callable[[str], None], on_resync: Callable[[str], None]) -> None:
        self.on_progress = on_progress
        self.on_resync = on_resync
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._listen_dsn: dict[str, str] = {}  # store DSN -> the DSN its LISTEN connects to
        self._redis: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._ready: dict[str, asyncio.Event] = {}  # set while the store's LISTEN is in place
        self._ever: set[str] = set()  # stores listened to at least once
        self._gap: set[str] = set()  # stores whose progress may have been read while nobody listened

    def open(self, dsn: str, listen_dsn: str | None = None) -> None:
        """Listen for the progress of store ``dsn``, on ``listen_dsn`` (a direct DSN of the same database) if given."""
        if dsn not in self._tasks:
            self._listen_dsn[dsn] = listen_dsn or dsn
            self._ready[dsn] = asyncio.Event()
            # An empty context, not the opening reconcile's: that holds kopf's cause (a whole body) (wakeups.py).
            self._tasks[dsn] = asyncio.create_task(
                self._listen(dsn), name="agentrun-listen", context=contextvars.Context()
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

    def open_redis(self, dsn: str, redis_url: str, store: ControlStore) -> None:
        key = (dsn, redis_url)
        events = getattr(store, "events", None)
        if key not in self._redis and events is not None:
            self._redis[key] = asyncio.create_task(
                self._subscribe(events), name="agentrun-subscribe", context=contextvars.Context()
            )

    async def close(self, dsn: str) -> None:
        tasks = [self._tasks.pop(dsn)] if dsn in self._tasks else []
        tasks += [self._redis.pop(key) for key in [k for k in self._redis if k[0] == dsn]]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._ready.pop(dsn, None)
        self._listen_dsn.pop(dsn, None)
        self._ever.discard(dsn)
        self._gap.discard(dsn)

    async def aclose(self) -> None:
        for dsn in {*self._tasks, *(k[0] for k in self._redis)}:
            await self.close(dsn)

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: object) -> None:
        if isinstance(payload, str) and payload:
            self.on_progress(payload)

    async def _listen(self, dsn: str) -> None:
        backoff = 1.0
        while True:
            conn: asyncpg.Connection[Any] | None = None
            try:
                conn = await asyncpg.connect(
                    self._listen_dsn.get(dsn, dsn),
                    timeout=CONNECT_TIMEOUT,
                    server_settings={"application_name": "agentrun-operator-listen"},
                )
                lost = asyncio.Event()
                conn.add_termination_listener(_setter(lost))
                await conn.add_listener(CHANNEL, self._notified)
                self._ready[dsn].set()
                self._ever.add(dsn)
                backoff = 1.0
                if dsn in self._gap:  # whatever committed while nobody listened
                    self._gap.discard(dsn)
                    log.info("listening for store progress; resyncing the runs read while nobody listened")
                    self.on_resync(dsn)
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), PING_SECONDS)
                    if not lost.is_set():
                        await conn.fetchval("SELECT 1")
            except asyncio.CancelledError:
                raise
            except Exception as e:  # any failure: reconnect (the resync follows)
                if dsn not in self._gap:
                    log.warning(
                        "store progress listener lost (%s); reconnecting with backoff, runs of that store are "
                        "resynced once it is back",
                        type(e).__name__,
                    )
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.close(), 5)
            self._ready[dsn].clear()
            if dsn not in self._gap and dsn in self._ever:
                # The store just went away: reconcile its runs now so their StoreAvailable condition
                # shows the outage while it lasts, not only the resync once it is back.
                self.on_resync(dsn)
            self._gap.add(dsn)
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF, backoff * 2)

    async def _subscribe(self, events: Callable[..., Any]) -> None:
        while True:
            try:
                async for event in events(None):
                    thread = event.get("thread_id")
                    if event.get("type") == "progress" and isinstance(thread, str) and thread:
                        self.on_progress(thread)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.debug("Redis progress subscription failed (%s); retrying in %.0fs", e, REDIS_RETRY)
            await asyncio.sleep(REDIS_RETRY)
