"""Stop requests heard as PostgreSQL notifications: one LISTEN connection per store, shared by its runs.

Migration 11 makes every stop request notify channel ``agentrun_stop``
(payload: the thread id) in the transaction that records it, whoever writes
it (the operator, the CLI, ``request_stop``); PostgreSQL delivers it when
that transaction commits, to every session listening. So a running run asks
the store whether it must stop only when told to (``StopWatch.notify``),
instead of once per ``stop_poll_interval``: at 1,000 runs that was 2,000
queries a second.

- One connection of its own per ``PgCheckpointer`` (not from the pool: a
  pooled connection must carry no session state), opened once a run has
  lived ``stop_poll_interval`` (a call shorter than that polls once or
  twice and opens nothing) and closed when the last run stops watching. A
  background task runs meanwhile: it connects and LISTENs, then every
  ``sweep_interval`` seconds asks, on that same connection, which watched
  threads have a pending request. The sweep catches what a notification
  could not carry and proves the connection alive (a silently dead socket
  raises no error).
- A notification or a sweep hit only makes the run's next check due: the
  stop request row stays the truth, read through the pool as before.

HAZARDS
- While the connection is down (not yet connected, lost, PostgreSQL
  restarting) every watch falls back to polling every
  ``stop_poll_interval``, as before this existed, so a stop still lands
  within about a second; the task reconnects with backoff (at most
  ``_MAX_BACKOFF`` seconds apart) and, once listening again, sweeps, since
  notifications sent meanwhile are lost.
- A connection that dies silently (a network partition, no RST) is found
  by the next sweep, so for up to ``sweep_interval`` plus 5 s a stop may
  wait for that sweep instead of landing within a second.
- Notifications are per database, not per schema: a store in another
  schema with the same thread id wakes this one up for nothing (one wasted
  check, never a wrong stop).
- Behind PgBouncer in transaction mode LISTEN does not work (the session is
  not kept): put ``agentrun_pooler=transaction`` in the store URL (runner
  pods: the store Secret; ``pg_url``), which turns this off with the rest of
  the session state; runs then poll, or hear Redis (``redis_stops``).
  ``agentrun_listen=off`` (``listen_for_stops=False``) polls without the rest.
- One more connection per process while a run lasts: size
  ``max_connections`` (or the pooler) for two or more per runner pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from typing_extensions import override

from .base import StopWatch, WatchedThreads
from .listen import Backoff, listen_with_backoff

log = logging.getLogger("agentrun.checkpoint.postgres")

STOP_CHANNEL = "agentrun_stop"
# The threads among those watched that have a pending stop request (the sweep).
_PENDING = "SELECT thread_id::text FROM stop_requests WHERE thread_id = ANY($1::text[])"
# How long a sweep may take before the connection is taken for dead.
_SWEEP_TIMEOUT = 5.0
_MIN_BACKOFF = 0.5
# How long the end of the last run waits for the task to end by itself.
_STOP_GRACE = 1.0
_MAX_BACKOFF = 10.0


class _Closed(ConnectionError):
    """The LISTEN connection closed (asyncpg's termination callback): reconnect at once, quietly."""


class PgStopWatch(StopWatch):
    """A run's watch on a ``StopListener``: due when notified, or by polling while the listener is down."""

    def __init__(self, listener: StopListener, thread_id: str) -> None:
        super().__init__()
        self.listener = listener
        self.thread_id = thread_id
        self._since = asyncio.get_running_loop().time()

    @override
    def poll_interval(self, interval: float) -> float:
        return math.inf if self.listener.listening else interval

    @override
    def due(self, now: float, interval: float) -> bool:
        if not self.listener.listening and now - self._since >= interval:
            self.listener.start()  # a run that lasts: worth a connection that hears its stop
        return super().due(now, interval)

    @override
    async def aclose(self) -> None:
        await self.listener.unwatch(self)


class StopListener:
    """``LISTEN agentrun_stop`` on one connection, dispatching to the watches of each thread id."""

    def __init__(self, connect: Callable[[], Awaitable[asyncpg.Connection[Any]]], *, sweep_interval: float = 10.0):
        self._connect = connect
        self.sweep_interval = sweep_interval
        self._conn: asyncpg.Connection[Any] | None = None
        self._watches = WatchedThreads()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._warned = False

    @property
    def listening(self) -> bool:
        """Whether notifications are being received (a watch then need not poll)."""
        return self._conn is not None and not self._conn.is_closed()

    def watch(self, thread_id: str) -> PgStopWatch:
        """A watch on ``thread_id``, due at once (the check before a run's first node), then when told."""
        watch = PgStopWatch(self, thread_id)
        self._watches.add(thread_id, watch)
        return watch

    def start(self) -> None:
        """Start listening in the background, if not already (watches poll until it listens)."""
        if self._watches and (self._task is None or self._task.done()):
            self._stopping = False
            self._task = asyncio.get_running_loop().create_task(self._run(), name="agentrun:stop-listener")

    async def unwatch(self, watch: PgStopWatch) -> None:
        """Forget ``watch``; with the last one the task ends and the connection closes."""
        self._watches.remove(watch.thread_id, watch)
        if not self._watches:
            await self.aclose()

    async def aclose(self) -> None:
        """End the task and close the connection."""
        self._watches.clear()
        await self._stop_task()
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await asyncio.wait_for(conn.close(), timeout=2)
            except (TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                conn.terminate()

    async def _stop_task(self) -> None:
        task = self._task
        if task is None:
            return
        self._stopping = True
        self._wake.set()
        # Not cancelled at once: the task ends between two awaits of its own, not inside a query
        # (asyncpg answers a cancelled query with a cancel request on a new connection). Only a task
        # still connecting after a second (PostgreSQL slow or down) is cancelled, so that the end of
        # a run never waits for a connect timeout.
        done, _ = await asyncio.wait({task}, timeout=_STOP_GRACE)
        if not done:
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if self._task is task:
            self._task = None

    # -- the task -------------------------------------------------------------------------

    def _notified(self, _conn: object, _pid: int, _channel: str, thread_id: str) -> None:
        self._watches.notify(thread_id)

    def _lost(self, _conn: object) -> None:
        self._wake.set()  # reconnect now; meanwhile the watches poll (``listening`` is false)

    async def _run(self) -> None:
        await listen_with_backoff(
            self._session,
            backoff=Backoff(first=_MIN_BACKOFF, most=_MAX_BACKOFF, after_lost=0.0),
            deaf=self._deaf,
            going=lambda: not self._stopping,
            rest=self._sleep,
        )

    async def _session(self, up: Callable[[], None]) -> None:
        """Connect and LISTEN, then sweep every ``sweep_interval`` until the connection fails or the task ends."""
        await self._listen()
        up()
        while not self._stopping:
            await self._sleep(self.sweep_interval)
            if self._stopping:
                return
            if not self.listening:
                raise _Closed("the LISTEN connection closed")
            await self._sweep()

    def _deaf(self, error: Exception, retry_in: float, was_up: bool) -> None:
        """The watches poll meanwhile (``listening`` is false); the loop tries again."""
        self._drop()
        if was_up:
            if not isinstance(error, _Closed):
                log.warning("the stop listener's connection failed (%s: %s); reconnecting", type(error).__name__, error)
        elif not self._warned:
            self._warned = True
            log.warning(
                "could not LISTEN for stop requests (%s: %s); runs poll every stop_poll_interval "
                "until it works, next try in %.1fs",
                type(error).__name__,
                error,
                retry_in,
            )

    async def _sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or less if woken (connection lost, stopping)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        self._wake.clear()

    async def _listen(self) -> None:
        conn = await self._connect()
        try:
            await conn.add_listener(STOP_CHANNEL, self._notified)  # type: ignore[arg-type]
            conn.add_termination_listener(self._lost)
        except BaseException:
            conn.terminate()
            raise
        self._conn = conn
        if self._warned:
            self._warned = False
            log.warning("listening for stop requests again; runs stop polling")
        # Requests made before LISTEN took effect (or while the connection was down) sent nothing here.
        await self._sweep()

    async def _sweep(self) -> None:
        conn = self._conn
        if conn is None or not self._watches:
            return
        rows = await conn.fetch(_PENDING, self._watches.threads(), timeout=_SWEEP_TIMEOUT)
        for row in rows:
            self._watches.notify(row[0])

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()
