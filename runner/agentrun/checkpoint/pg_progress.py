"""Progress notifications for the operator: ``NOTIFY agentrun_progress, '<thread id>'`` after a checkpoint commits.

The operator LISTENs on one connection per store (``agentrun_operator/io/notify.py``) and folds a
run's progress into at most one reconcile per second; so a thread notifies at most once per
``interval`` here: at once after a quiet spell (the leading edge) and once more at the end of the
interval when it committed again meanwhile (the trailing edge, so the last step of a burst is never
left unannounced); a thread's final checkpoint (any status but running) notifies at once.

Why not a trigger on ``states`` (migration 10 did that; migration 12 drops it): a transaction that
NOTIFYs takes PostgreSQL's database-wide notify lock before it commits and holds it through its WAL
flush, so every checkpoint commit of every runner on the database serialized on it (measured here:
16 concurrent writers, 13,500 commits/s without the trigger, 3,500 with it). Sent here, the
notification is its own transaction, off the step's path (a task), with ``synchronous_commit`` off
(a notification lost in a server crash only delays the operator to its resync), so it holds that
lock for microseconds, at most twice per second per thread. Best effort throughout: a failure is
logged at debug level and the operator's resync (30 s) covers it.

The listening side is here too (``hear``, behind ``PgCheckpointer.watch_progress``): one connection
that LISTENs on ``CHANNEL``, pinged every ``PING_SECONDS`` (a peer that vanished without closing is
found then; a closed connection at once, by asyncpg's termination callback), reconnected with backoff
(``listen.listen_with_backoff``: 1 s doubling to ``MAX_BACKOFF``; the operator's resync after a
reconnect is what ends an outage's blind spot, so it retries often).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from .listen import Backoff, Deaf, Emit, Listening, Progressed, listen_with_backoff

log = logging.getLogger("agentrun.checkpoint")

CHANNEL = "agentrun_progress"
PING_SECONDS = 30.0
MAX_BACKOFF = 5.0
# Prune the per-thread clock beyond this many threads (a long-lived process that ran many threads).
_MAX_THREADS = 1024


def notify_sql(thread_id: str) -> str:
    """One simple-query batch (one round trip): its own transaction, asynchronous commit, the NOTIFY.

    The payload is dollar-quoted with a tag the thread id does not contain, which no setting of
    ``standard_conforming_strings`` changes; parameters are not possible in a multi-statement batch.
    """
    tag = "p"
    while f"${tag}$" in thread_id or thread_id.endswith(f"${tag}"):
        tag += "p"
    return (
        f"BEGIN; SET LOCAL synchronous_commit = off; SELECT pg_notify('{CHANNEL}', ${tag}${thread_id}${tag}$); COMMIT;"
    )


class ProgressNotifier:
    """Throttles a store's progress notifications per thread and sends them off the caller's path."""

    def __init__(self, send: Callable[[str], Awaitable[None]], *, interval: float = 1.0) -> None:
        self._send = send  # sends one notification for a thread; may raise
        self.interval = interval
        self._last: dict[str, float] = {}  # thread -> loop time of its last notification
        self._trailing: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def committed(self, thread_id: str, *, final: bool) -> None:
        """A checkpoint of ``thread_id`` committed; ``final``: it ended the run (completed, interrupted, ...)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        last = self._last.get(thread_id)
        if final or last is None or now - last >= self.interval:
            self._now(thread_id, now)
        elif thread_id not in self._trailing:
            self._trailing[thread_id] = loop.call_later(last + self.interval - now, self._trail, thread_id)
        if len(self._last) > _MAX_THREADS:
            for thread in [t for t, at in self._last.items() if now - at >= self.interval and t not in self._trailing]:
                del self._last[thread]

    def _now(self, thread_id: str, now: float) -> None:
        handle = self._trailing.pop(thread_id, None)
        if handle is not None:
            handle.cancel()
        self._last[thread_id] = now
        task = asyncio.create_task(self._quietly(thread_id), name=f"agentrun-progress-{thread_id[:40]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _trail(self, thread_id: str) -> None:
        self._trailing.pop(thread_id, None)
        self._now(thread_id, asyncio.get_running_loop().time())

    async def _quietly(self, thread_id: str) -> None:
        try:
            await self._send(thread_id)
        except Exception as e:  # best effort: the operator's resync covers a lost notification
            log.debug("progress notification for %s not sent: %s", thread_id, e)

    async def aclose(self) -> None:
        """Send the notifications still due (a closing store's last steps), then wait for every send."""
        for thread_id in list(self._trailing):
            self._now(thread_id, asyncio.get_running_loop().time())
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), timeout=5)


class _Closed(ConnectionError):
    """The LISTEN connection closed (asyncpg's termination callback)."""


async def hear(connect: Callable[[], Awaitable[asyncpg.Connection[Any]]], emit: Emit) -> None:
    """LISTEN on ``CHANNEL`` on connections from ``connect``, emitting what is heard, until cancelled."""

    def notified(_conn: object, _pid: int, _channel: str, payload: object) -> None:
        if isinstance(payload, str) and payload:
            emit(Progressed(payload, "postgres"))

    async def session(up: Callable[[], None]) -> None:
        conn = await connect()
        try:
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _conn: lost.set())
            await conn.add_listener(CHANNEL, notified)
            up()
            emit(Listening("postgres"))
            while not lost.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lost.wait(), PING_SECONDS)
                if not lost.is_set():
                    await conn.fetchval("SELECT 1")
            raise _Closed("the LISTEN connection closed")
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 5)

    await listen_with_backoff(
        session,
        backoff=Backoff(first=1.0, most=MAX_BACKOFF),
        deaf=lambda error, retry_in, was_up: emit(Deaf("postgres", error, retry_in, was_up)),
    )
