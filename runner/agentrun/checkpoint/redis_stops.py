"""Stop requests heard on Redis: ``CachedStore``'s optional fast path beside the inner store's own watch.

``CachedStore.request_stop`` records the request in the inner store (on
PostgreSQL its transaction notifies the LISTENing runs, ``pg_listen``), then
publishes it on Redis: on the thread's events channel, for listeners of
progress, and on ``<prefix>:stop:<thread>``. A run of a ``CachedStore``
that lasts longer than ``stop_poll_interval`` is also told through one
pattern subscription per store to those stop channels, so a stop reaches it
at once even where the inner store cannot notify (SQLite,
``listen_for_stops=False``, a LISTEN connection that is down), instead of at
its next poll.

- A message only makes the run's next check due: the inner store's stop
  request stays the truth (a stop for the same thread id in another
  environment sharing the prefix costs one check).
- Redis down: the subscription fails, is tried again every ``_RETRY``
  seconds while runs watch, and the runs rely on the inner store's watch
  (notification or polling). Nothing is lost but speed.
- Runs never ask for their own progress events: the stop channel carries
  stops only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from typing_extensions import override

from .base import StopWatch, WatchedThreads
from .listen import Backoff, listen_with_backoff
from .redis_cache import RedisHotCache

log = logging.getLogger("agentrun.checkpoint.redis")

# Seconds between tries of a subscription that failed (Redis down).
_RETRY = 5.0


class RedisStopWatch(StopWatch):
    """The inner store's watch, also made due by a stop published on Redis."""

    def __init__(self, inner: StopWatch, stops: RedisStops, thread_id: str) -> None:
        super().__init__()
        self.inner = inner
        self.stops = stops
        self.thread_id = thread_id
        self._since = asyncio.get_running_loop().time()

    @override
    def notify(self) -> None:
        self.inner.notify()

    @override
    async def heard(self) -> None:
        await self.inner.heard()

    @override
    def due(self, now: float, interval: float) -> bool:
        if now - self._since >= interval:
            self.stops.start()  # a run that lasts: worth the subscription
        return self.inner.due(now, interval)

    @override
    async def aclose(self) -> None:
        try:
            await self.stops.unwatch(self)
        finally:
            await self.inner.aclose()


class RedisStops:
    """One ``PSUBSCRIBE <prefix>:stop:*`` per store while runs watch, dispatching to their watches."""

    def __init__(self, cache: RedisHotCache) -> None:
        self.cache = cache
        self._watches = WatchedThreads()
        self._task: asyncio.Task[None] | None = None
        self._warned = False
        self._live: object | None = None  # the running loop's token; a loop whose token is gone ends

    def watch(self, thread_id: str, inner: StopWatch) -> RedisStopWatch:
        """``inner`` (the store's own watch of ``thread_id``), also made due by a stop published on Redis."""
        watch = RedisStopWatch(inner, self, thread_id)
        self._watches.add(thread_id, watch)
        return watch

    def start(self) -> None:
        """Subscribe in the background, if not already and while runs watch."""
        if self._watches and (self._task is None or self._task.done()):
            self._live = token = object()
            self._task = asyncio.get_running_loop().create_task(self._run(token), name="agentrun:redis-stops")

    async def unwatch(self, watch: RedisStopWatch) -> None:
        """Forget ``watch``; with the last one the subscription ends."""
        self._watches.remove(watch.thread_id, watch)
        if not self._watches:
            await self.aclose()

    async def aclose(self) -> None:
        """End the subscription (cancelled: a Redis read has nothing to cancel on the server), in 2 s at most.

        The loop also ends by itself at its next turn (its token is gone): a cancellation that lands as
        ``get_message``'s own 1 s timeout expires can come out as a ``TimeoutError`` (Python 3.11's
        ``asyncio.timeout``), which the loop takes for a Redis failure and retries: a chaos trial's
        runner hung at its exit here, its run completed, with the loop reconnecting for minutes.
        """
        self._watches.clear()
        self._live = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=2)

    def _heard(self, message: dict[str, Any]) -> None:
        channel = str(message.get("channel", ""))
        self._watches.notify(channel.removeprefix(self.cache.stop_channel("")))

    async def _run(self, token: object) -> None:
        async def session(up: Callable[[], None]) -> None:
            pubsub = self.cache.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.psubscribe(self.cache.stop_channel("*"))
                up()
                if self._warned:
                    self._warned = False
                    log.warning("hearing stop requests on Redis again")
                while self._live is token:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None and message.get("type") == "pmessage":
                        self._heard(message)
            finally:
                await pubsub.aclose()

        await listen_with_backoff(
            session, backoff=Backoff(first=_RETRY, most=_RETRY), deaf=self._deaf, going=lambda: self._live is token
        )

    def _deaf(self, error: Exception, retry_in: float, was_up: bool) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "cannot hear stop requests on Redis (%s: %s); runs rely on the store's own watch, next try in %.0fs",
                type(error).__name__,
                error,
                retry_in,
            )
