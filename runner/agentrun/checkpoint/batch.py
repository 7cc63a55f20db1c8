"""Calls asked in one event-loop turn, served together: one round trip for the parallel calls of a message.

The tool node starts the calls of one assistant message together, so their
ledger lookups (``ledger_get``) and intent claims (``intent_claim``) arrive in
the same loop turn. ``TurnBatch`` gathers the items asked under one group key
(a thread, a writer) until the callbacks already due this turn have run, then
serves them with one call of its ``serve`` function (on PostgreSQL one
statement), and answers each caller with its own result.

Failure: a batch has one fate. When ``serve`` raises, every caller of the
batch gets that error (a ``BaseException`` such as a cancellation is raised
in the batch's task as well). A caller cancelled while waiting gets no
answer (its item was still served); the others get theirs.

This is not the ledger's group commit (``group``): that one waits up to a
window for sibling results; this one waits for nothing but the current turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

G = TypeVar("G", bound=Hashable)  # the group key: items of one group share one serve call
I = TypeVar("I")  # noqa: E741  an item asked
R = TypeVar("R")  # its answer


class TurnBatch(Generic[G, I, R]):
    """Items asked in one loop turn under one group, served by one ``serve(group, items)`` call.

    ``serve`` returns one answer per item, in order. ``name(group)`` names the
    batch's task (seen in a task dump).
    """

    def __init__(self, serve: Callable[[G, list[I]], Awaitable[list[R]]], name: Callable[[G], str]) -> None:
        self._serve = serve
        self._name = name
        self._pending: dict[G, list[tuple[I, asyncio.Future[R]]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def ask(self, group: G, item: I) -> R:
        """``item``'s answer, from the one ``serve`` call of this loop turn's batch of ``group``."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        pending = self._pending.get(group)
        if pending is None:
            pending = self._pending[group] = []
            # After the callbacks already due this turn: the sibling calls' items join the batch.
            loop.call_soon(self._start, loop, group)
        pending.append((item, future))
        return await future

    def _start(self, loop: asyncio.AbstractEventLoop, group: G) -> None:
        task = loop.create_task(self._run(group), name=self._name(group))
        self._tasks.add(task)  # a reference until it ends (the loop holds tasks weakly)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, group: G) -> None:
        waiting = self._pending.pop(group, [])
        try:
            answers = await self._serve(group, [item for item, _ in waiting])
        except BaseException as e:
            for _, future in waiting:
                if not future.done():
                    future.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        for (_, future), answer in zip(waiting, answers, strict=True):
            if not future.done():
                future.set_result(answer)
