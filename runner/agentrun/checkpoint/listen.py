"""One listen-with-backoff loop for every store notification (PostgreSQL LISTEN, Redis pub/sub), and its events.

``listen_with_backoff`` runs a *session* (connect, subscribe, hold until the
connection fails) again and again: a session that fails before it was up
waits ``Backoff.first`` seconds, then twice as long each time up to
``Backoff.most``; one that was up and is lost retries after
``Backoff.after_lost`` (``first`` when not given). Every failure is reported
as a ``Deaf`` record (what failed, when the next try is). Its users:
the runs' stop watches (``pg_listen``, ``redis_stops``) and
``ControlStore.watch_progress`` (``postgres``, ``redis_cache``, ``cached``),
which the operator (``agentrun_operator/io/notify.py``) and the history
server consume.

``watch_progress`` yields ``ProgressEvent`` records: ``Listening`` when the
listen is (again) in place, ``Progressed`` per notification, ``Deaf`` when it
failed or was lost. HAZARDS: a notification is a hint, never the data (read
the store); what committed while nobody listened (before the first
``Listening``, between a ``Deaf`` and the next ``Listening``) was not heard:
a consumer that must not miss progress reads again after ``Listening``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

Source = Literal["postgres", "redis"]


@dataclass(frozen=True)
class Progressed:
    """A checkpoint of ``thread_id`` committed (or, on Redis, a step was published)."""

    thread_id: str
    source: Source


@dataclass(frozen=True)
class Listening:
    """The listen is in place: progress from now on is heard; what came before it was not."""

    source: Source


@dataclass(frozen=True)
class Deaf:
    """The listen failed (``was_up``: after it had been in place); nothing is heard until the next ``Listening``."""

    source: Source
    error: Exception
    retry_in: float
    was_up: bool


ProgressEvent = Progressed | Listening | Deaf


@dataclass(frozen=True)
class Backoff:
    """Seconds between tries: ``first``, then doubled up to ``most``; ``after_lost`` after a session that was up."""

    first: float
    most: float
    after_lost: float | None = None


Session = Callable[[Callable[[], None]], Awaitable[None]]


async def listen_with_backoff(
    session: Session,
    *,
    backoff: Backoff,
    deaf: Callable[[Exception, float, bool], None],
    going: Callable[[], bool] = lambda: True,
    rest: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Run ``session(up)`` until ``going()`` is false or the task is cancelled.

    ``session`` connects and subscribes, calls ``up()`` once the subscription is in place, and holds
    it: it raises when the connection fails and returns only to end (``going()`` false). Each failure
    while still going is reported as ``deaf(error, retry_in, was_up)``, then ``rest(retry_in)``
    (``asyncio.sleep``, or a wait a stop may cut short) before the next try. A failure after
    ``going()`` turned false ends the loop quietly (a cancellation that came out as a timeout).
    """
    delay = backoff.first
    while going():
        was_up = False

        def up() -> None:
            nonlocal delay, was_up
            delay, was_up = backoff.first, True

        try:
            await session(up)
        except Exception as e:
            if not going():
                return
            wait = delay
            if was_up and backoff.after_lost is not None:
                wait = backoff.after_lost
            else:
                delay = min(backoff.most, delay * 2)
            deaf(e, wait, was_up)
            await rest(wait)


Emit = Callable[[ProgressEvent], None]


async def events(session: Callable[[Emit], Coroutine[Any, Any, None]]) -> AsyncGenerator[ProgressEvent, None]:
    """The events ``session(emit)`` emits, as they come; closing the generator cancels the session."""
    queue: asyncio.Queue[ProgressEvent | None] = asyncio.Queue()  # None: the session ended

    async def run() -> None:
        try:
            await session(queue.put_nowait)
        finally:
            queue.put_nowait(None)

    task = asyncio.create_task(run(), name="agentrun:watch-progress")
    try:
        while (event := await queue.get()) is not None:
            yield event
        task.result()  # the session's own error, if it ended with one
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def merged(*streams: AsyncGenerator[ProgressEvent, None]) -> AsyncGenerator[ProgressEvent, None]:
    """The events of every stream as they come; ends when all have ended, closes them all when closed."""

    async def pump(stream: AsyncGenerator[ProgressEvent, None], emit: Emit) -> None:
        async with contextlib.aclosing(stream):
            async for event in stream:
                emit(event)

    async def session(emit: Emit) -> None:
        tasks = [asyncio.create_task(pump(s, emit), name="agentrun:watch-progress-pump") for s in streams]
        try:
            await asyncio.gather(*tasks)
        finally:  # every stream closed before this returns (gather alone would not wait once one is cancelled)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async with contextlib.aclosing(events(session)) as merged_events:
        async for event in merged_events:
            yield event


async def nothing() -> AsyncGenerator[ProgressEvent, None]:
    """No events: a store that cannot be heard (SQLite, memory, a PostgreSQL store behind a transaction pooler)."""
    return
    yield  # an async generator
