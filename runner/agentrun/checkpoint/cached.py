"""The Redis hot cache as a wrapper: ``CachedStore(inner, redis_url=...)`` over any checkpointer.

Everything is delegated to ``inner``, the source of truth; the cache
(``redis_cache.RedisHotCache``, whose docstring has the Lua compare-and-set
rules) only makes reads cheaper and news faster:

- ``aget`` asks ``inner.ahead`` for the latest version and incarnation (one
  cheap read) and serves the cached entry only if both match exactly; a miss
  is answered by ``inner.aget`` and written back (never over a newer entry).
- ``acommit``/``aput`` advance the entry after ``inner`` committed, from the
  exact version the write started from; a ``StaleStateError`` clears it.
- ``cache_put`` (``durable_checkpoint_every_step: false``) publishes the
  step as progress on Redis only; ``aget_progress`` reports it with
  ``durable=False`` when it is newer than ``inner``'s step of the same
  version and incarnation, and never understates ``inner``'s version.
- Progress and stop requests are published (``events()``) for listeners
  that want them at once rather than by polling (``watch_progress`` merges
  the published steps with ``inner``'s own); a run also hears stops on
  Redis (``redis_stops``), beside the inner store's own watch.

HAZARDS
- Redis down: every cache operation is a fast no-op or a miss, one warning
  per outage; the run goes on against ``inner`` alone and never fails for it.
- ``cache_put`` is not fenced (a zombie may publish a non-durable step until
  its successor's first durable write supersedes it); ledger, intents,
  fencing and stop requests never touch Redis.
- ``aget_progress`` overlays a non-durable step only when ``inner`` reports
  the thread's incarnation (PostgreSQL and memory do; SQLite does not, so
  there it reports durable steps only).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Sequence
from typing import Any

from redis.exceptions import RedisError
from typing_extensions import override

from ..errors import StaleStateError, StorageError
from ..messages import Message, stored_text
from .base import (
    Checkpoint,
    Checkpointer,
    CheckpointWrite,
    Commit,
    Head,
    Intent,
    LedgerEntry,
    LedgerRow,
    Progress,
    RunInputsRecord,
    StopWatch,
    Turn,
)
from .listen import ProgressEvent, merged
from .redis_cache import RedisHotCache
from .redis_stops import RedisStops


def _body(message: Message) -> str:
    # A message loaded from ``inner`` and not read since: its stored text, not validated for the copy.
    if (text := stored_text(message)) is not None:
        return text
    return json.dumps(message.to_json(), allow_nan=False, separators=(",", ":"), ensure_ascii=False)


class CachedStore(Checkpointer):
    """``CachedStore(PgCheckpointer(dsn), redis_url="redis://host:6379/0")``: ``inner`` plus a Redis hot cache.

    ``redis_prefix`` namespaces the Redis keys and channels (one per
    environment sharing a Redis); ``cache_ttl`` bounds how long an idle
    thread's entry stays. Closing the store closes ``inner`` too.
    """

    def __init__(
        self, inner: Checkpointer, *, redis_url: str, redis_prefix: str = "agentrun", cache_ttl: float = 3600.0
    ) -> None:
        self.inner = inner
        self.backend = inner.backend
        self.cache = RedisHotCache(redis_url, prefix=redis_prefix, ttl=cache_ttl)
        self._stops = RedisStops(self.cache)
        # Incarnation of each thread this process touched, so non-durable progress can carry it.
        self._incarnations: dict[str, str] = {}

    def _remember(self, thread_id: str, incarnation: str) -> None:
        if len(self._incarnations) > 10_000:
            self._incarnations.clear()
        self._incarnations[thread_id] = incarnation

    @override
    async def setup(self) -> None:
        await self.inner.setup()

    @override
    async def aclose(self) -> None:
        try:
            await self._stops.aclose()
            await self.cache.aclose()
        finally:
            await self.inner.aclose()

    # -- state -------------------------------------------------------------------------------

    @override
    async def ahead(self, thread_id: str) -> Head | None:
        return await self.inner.ahead(thread_id)

    async def aget(self, thread_id: str) -> Checkpoint | None:
        """The latest checkpoint; from Redis only if it holds exactly ``inner``'s latest version and incarnation."""
        if not self.cache.usable:
            return await self.inner.aget(thread_id)
        head = await self.inner.ahead(thread_id)
        if head is None:
            return None
        self._remember(thread_id, head.incarnation)
        cached = await self.cache.get(thread_id, head.incarnation, head.version)
        if cached is not None:
            return cached
        checkpoint = await self.inner.aget(thread_id)
        if checkpoint is None:
            return None
        # Read after the head: the checkpoint is that version or newer. Were the thread deleted and
        # created again in between, the entry carries the dead incarnation and no reader matches it.
        await self.cache.fill(thread_id, head.incarnation, checkpoint, [_body(m) for m in checkpoint.messages])
        return checkpoint

    @override
    async def acommit(
        self,
        thread_id: str,
        write: CheckpointWrite,
        *,
        expected_version: int,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> Commit:
        return await self._committed(
            thread_id,
            write,
            expected_version,
            attempt,
            run_uid,
            self.inner.acommit(thread_id, write, expected_version=expected_version, attempt=attempt, run_uid=run_uid),
        )

    @property
    def rides_lg_steps(self) -> bool:
        """Whether ``acommit_with_lg_step`` is there: the inner store's (PostgreSQL)."""
        return hasattr(self.inner, "acommit_with_lg_step")

    async def acommit_with_lg_step(
        self,
        thread_id: str,
        write: CheckpointWrite,
        lg_step: tuple[Any, ...],
        *,
        expected_version: int,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> Commit:
        """``acommit`` with a LangGraph super-step in its statement (``PgCheckpointer.acommit_with_lg_step``)."""
        inner = self.inner.acommit_with_lg_step(  # type: ignore[attr-defined]
            thread_id, write, lg_step, expected_version=expected_version, attempt=attempt, run_uid=run_uid
        )
        return await self._committed(thread_id, write, expected_version, attempt, run_uid, inner)

    async def _committed(
        self,
        thread_id: str,
        write: CheckpointWrite,
        expected_version: int,
        attempt: int | None,
        run_uid: str | None,
        inner: Awaitable[Commit],
    ) -> Commit:
        """Await the inner store's commit, then the cache's copy of it."""
        try:
            commit = await inner
        except StaleStateError:
            await self.cache.invalidate(thread_id)
            raise
        self._remember(thread_id, commit.incarnation)
        await self.cache.apply_write(
            thread_id,
            commit.incarnation,
            base_version=expected_version,
            version=commit.version,
            write=write,
            created_at=commit.created_at,
            bodies=[(index, _body(message)) for index, message in write.messages],
            event=self._progress_event(
                thread_id, commit.incarnation, commit.version, write, durable=True, attempt=attempt, run_uid=run_uid
            ),
        )
        return commit

    async def cache_put(self, thread_id: str, write: CheckpointWrite, *, version: int) -> None:
        """Publish a non-durable step's progress on Redis; ``inner`` is not touched."""
        incarnation = self._incarnations.get(thread_id, "")
        event = self._progress_event(thread_id, incarnation, version, write, durable=False, attempt=None, run_uid=None)
        await self.cache.put_progress(thread_id, event)

    @staticmethod
    def _progress_event(
        thread_id: str,
        incarnation: str,
        version: int,
        write: CheckpointWrite,
        *,
        durable: bool,
        attempt: int | None,
        run_uid: str | None,
    ) -> dict[str, Any]:
        return {
            "type": "progress",
            "thread_id": thread_id,
            "incarnation": incarnation,
            "version": version,
            "current_node": write.current_node,
            "step": write.step,
            "status": write.status,
            "durable": durable,
            "attempt": attempt,
            "run_uid": run_uid,
        }

    async def aget_progress(self, thread_id: str) -> Progress | None:
        """``inner``'s progress, or a newer non-durable step of the same version from Redis (``durable=False``)."""
        progress = await self.inner.aget_progress(thread_id)
        if progress is None:
            return None
        live = await self.cache.get_progress(thread_id)
        if (
            live is not None
            and progress.incarnation is not None
            and not live.get("durable", True)
            and live.get("incarnation") in ("", progress.incarnation)
            and live.get("version") == progress.version
            and isinstance(live.get("step"), int)
            and live["step"] > progress.step
        ):
            return dataclasses.replace(
                progress,
                current_node=live.get("current_node"),
                step=live["step"],
                status=live.get("status", progress.status),
                durable=False,
            )
        return progress

    async def events(self, thread_id: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """Progress and stop events as they are published; ``StorageError`` when Redis cannot be reached.

        Pub/sub wakes listeners up, it is not a queue: after an error, re-read
        ``aget_progress`` and subscribe again.
        """
        try:
            async for event in self.cache.events(thread_id):
                yield event
        except (RedisError, OSError, TimeoutError) as e:
            raise StorageError(f"Redis events unavailable: {e}") from e

    def watch_progress(self, *, name: str = "agentrun-progress") -> AsyncGenerator[ProgressEvent, None]:
        """``inner``'s progress events merged with the steps published on Redis (``RedisHotCache.watch_progress``)."""
        return merged(self.inner.watch_progress(name=name), self.cache.watch_progress())

    @override
    async def delete_thread(self, thread_id: str) -> None:
        await self.inner.delete_thread(thread_id)
        self._incarnations.pop(thread_id, None)
        await self.cache.forget(thread_id)

    @override
    async def list_threads(self) -> list[str]:
        return await self.inner.list_threads()

    # -- ledger and intents: never cached ----------------------------------------------------

    @override
    async def ledger_get(self, thread_id: str, key: str) -> LedgerEntry | None:
        return await self.inner.ledger_get(thread_id, key)

    @override
    async def ledger_put(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        result: Any,
        *,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> bool:
        return await self.inner.ledger_put(thread_id, key, tool_name, result, attempt=attempt, run_uid=run_uid)

    @override
    async def ledger_put_many(
        self,
        thread_id: str,
        rows: Sequence[LedgerRow],
        *,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> list[bool]:
        return await self.inner.ledger_put_many(thread_id, rows, attempt=attempt, run_uid=run_uid)

    @property
    @override
    def ledger_group_window(self) -> float:
        return self.inner.ledger_group_window

    @override
    async def ledger_replace(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        result: Any,
        *,
        expected_text: str,
        attempt: int | None = None,
        run_uid: str | None = None,
    ) -> bool:
        return await self.inner.ledger_replace(
            thread_id, key, tool_name, result, expected_text=expected_text, attempt=attempt, run_uid=run_uid
        )

    @override
    async def ledger_list(self, thread_id: str) -> list[LedgerEntry]:
        return await self.inner.ledger_list(thread_id)

    @override
    async def intent_get(self, thread_id: str, key: str) -> Intent | None:
        return await self.inner.intent_get(thread_id, key)

    @override
    async def intent_put(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        idempotency_key: str | None,
        *,
        attempt: int | None = None,
        run_uid: str | None = None,
        args_digest: str | None = None,
    ) -> None:
        await self.inner.intent_put(
            thread_id, key, tool_name, idempotency_key, attempt=attempt, run_uid=run_uid, args_digest=args_digest
        )

    @override
    async def intent_claim(
        self,
        thread_id: str,
        key: str,
        tool_name: str,
        idempotency_key: str | None,
        *,
        attempt: int | None = None,
        run_uid: str | None = None,
        args_digest: str | None = None,
    ) -> Intent | None:
        return await self.inner.intent_claim(
            thread_id, key, tool_name, idempotency_key, attempt=attempt, run_uid=run_uid, args_digest=args_digest
        )

    # -- control -------------------------------------------------------------------------------

    @override
    async def register_attempt(self, thread_id: str, attempt: int, *, run_uid: str | None = None) -> None:
        await self.inner.register_attempt(thread_id, attempt, run_uid=run_uid)

    async def request_stop(self, thread_id: str, reason: str = "") -> None:
        """Record the request in ``inner`` (the truth the run polls), then announce it on Redis."""
        await self.inner.request_stop(thread_id, reason)
        await self.cache.publish_stop(thread_id, {"type": "stop", "thread_id": thread_id, "reason": reason})

    @override
    async def stop_requested(self, thread_id: str) -> str | None:
        return await self.inner.stop_requested(thread_id)

    async def watch_stops(self, thread_id: str) -> StopWatch:
        """``inner``'s watch (PostgreSQL: a notification from the request's own transaction), also told by Redis."""
        return self._stops.watch(thread_id, await self.inner.watch_stops(thread_id))

    @override
    async def put_run_inputs(
        self,
        thread_id: str,
        *,
        run_uid: str,
        attempt: int,
        input: dict[str, Any] | None,
        resume: dict[str, Any] | None,
    ) -> None:
        await self.inner.put_run_inputs(thread_id, run_uid=run_uid, attempt=attempt, input=input, resume=resume)

    @override
    async def aget_run_inputs(self, thread_id: str, *, run_uid: str, attempt: int) -> RunInputsRecord | None:
        return await self.inner.aget_run_inputs(thread_id, run_uid=run_uid, attempt=attempt)

    @override
    async def clear_stop(self, thread_id: str) -> None:
        await self.inner.clear_stop(thread_id)

    async def aget_turn(self, thread_id: str, request_key: str) -> Turn | None:
        """``inner``'s turn record: the truth an operator decides "already completed" on, never cached."""
        return await self.inner.aget_turn(thread_id, request_key)
