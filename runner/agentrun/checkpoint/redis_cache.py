"""The optional Redis hot cache of ``PgCheckpointer``, and the channel its progress and stops are published on.

PostgreSQL stays the source of truth; Redis only makes reads cheaper and
news faster. Per thread (keys share the hash tag ``{<thread id>}`` so a
Redis Cluster keeps them on one node):

- ``<prefix>:{<thread>}:state``  hash: incarnation, version, state JSON
- ``<prefix>:{<thread>}:msgs``   list: the thread's message bodies
- ``<prefix>:{<thread>}:progress`` hash: the newest progress event
- channel ``<prefix>:events:<thread>``: progress and stop events as JSON
- channel ``<prefix>:stop:<thread>``: stop events only (what runs subscribe to, ``redis_stops``)

Rules that keep the cache from ever serving older state than PostgreSQL
committed:

- An entry is written only after its PostgreSQL transaction committed, by a
  Lua compare-and-set that never replaces a newer entry and advances an
  entry only from the exact version the write started from (otherwise the
  entry is dropped: it would miss steps).
- A reader first asks PostgreSQL for the thread's latest version and
  incarnation (one index lookup), then accepts the entry only if both match
  exactly; everything else is a miss, answered from PostgreSQL and written
  back with the same compare-and-set.
- A conflict (``StaleStateError``) clears the entry.

HAZARDS
- Redis unreachable: each operation fails fast (``timeout``), a warning is
  logged once per outage, ``agentrun_cache_errors_total`` counts it, and the
  cache is skipped for ``retry_after`` seconds. Nothing fails: every read
  goes to PostgreSQL. Events published meanwhile are lost; listeners must
  re-read PostgreSQL (``aget_progress``) when they reconnect.
- Progress of non-durable steps (``durable_checkpoint_every_step: false``)
  exists only here. It is not fenced (checking would cost the PostgreSQL
  round trip those steps avoid), so a zombie attempt may publish a step
  until the successor's first durable write supersedes it.
- Pub/sub delivers at most once to whoever listens at that moment; it wakes
  listeners up, it is not a queue.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from ..messages import Message
from ..metrics import CACHE_AVAILABLE, CACHE_ERRORS, CACHE_READS
from .base import Checkpoint, CheckpointWrite
from .listen import Backoff, Deaf, Emit, Listening, Progressed, ProgressEvent, events, listen_with_backoff

log = logging.getLogger("agentrun.checkpoint.redis")

T = TypeVar("T")
# Seconds between tries of a progress subscription that failed (Redis down): PostgreSQL stays the record.
PROGRESS_RETRY = 30.0

# Progress compare-and-set, shared by both write scripts. Order: (version, step); a durable write
# wins a tie and replaces an entry of another incarnation (a deleted thread's leftovers).
_PROGRESS_LUA = """
local function put_progress(key, channel, inc, version, step, durable, event, ttl)
  local cur = redis.call('HMGET', key, 'incarnation', 'version', 'step')
  local replace = false
  if not cur[2] then
    replace = true
  elseif inc ~= '' and cur[1] and cur[1] ~= '' and cur[1] ~= inc then
    replace = (durable == '1')
  else
    local cv, cs = tonumber(cur[2]), tonumber(cur[3])
    replace = version > cv or (version == cv and (step > cs or (step == cs and durable == '1')))
  end
  if replace then
    if inc == '' and cur[1] then inc = cur[1] end
    redis.call('HSET', key, 'incarnation', inc, 'version', version, 'step', step, 'durable', durable,
               'event', event)
    redis.call('PEXPIRE', key, ttl)
    redis.call('PUBLISH', channel, event)
    return 1
  end
  return 0
end
"""

# KEYS: state, msgs, progress. ARGV: incarnation, base version, new version, state JSON, message count,
# ttl ms, channel, event JSON, step, then (index, body) pairs of the messages this write changed.
# Returns 1 applied, 0 a newer entry is cached (left alone), -1 entry dropped (it missed steps).
_APPLY_WRITE_LUA = (
    _PROGRESS_LUA
    + """
local inc, base, version = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local count, ttl = tonumber(ARGV[5]), tonumber(ARGV[6])
local result = 1
local cur = redis.call('HMGET', KEYS[1], 'incarnation', 'version')
local cv = nil
if cur[2] then cv = tonumber(cur[2]) end
if cur[1] and cur[1] ~= inc then
  redis.call('DEL', KEYS[1], KEYS[2])
  cv = nil
end
if cv ~= nil and cv >= version then
  result = 0
elseif (cv == nil and base ~= 0) or (cv ~= nil and cv ~= base) then
  redis.call('DEL', KEYS[1], KEYS[2])
  result = -1
else
  if cv == nil then redis.call('DEL', KEYS[2]) end
  local len = redis.call('LLEN', KEYS[2])
  for i = 10, #ARGV, 2 do
    local idx = tonumber(ARGV[i])
    if idx < len then
      redis.call('LSET', KEYS[2], idx, ARGV[i + 1])
    elseif idx == len then
      redis.call('RPUSH', KEYS[2], ARGV[i + 1])
      len = len + 1
    else
      result = -1
      break
    end
  end
  if result == 1 and len > count then redis.call('LTRIM', KEYS[2], 0, count - 1) end
  if result == 1 then
    redis.call('HSET', KEYS[1], 'incarnation', inc, 'version', version, 'state', ARGV[4])
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], ttl)
  else
    redis.call('DEL', KEYS[1], KEYS[2])
  end
end
put_progress(KEYS[3], ARGV[7], inc, version, tonumber(ARGV[9]), '1', ARGV[8], ttl)
return result
"""
)

# KEYS: state, msgs. ARGV: incarnation, version, state JSON, ttl ms, then every message body.
# A reader's fill: replaces the entry unless it already holds this version or a newer one.
_FILL_LUA = """
local cur = redis.call('HMGET', KEYS[1], 'incarnation', 'version')
if cur[1] == ARGV[1] and cur[2] and tonumber(cur[2]) >= tonumber(ARGV[2]) then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
for i = 5, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
redis.call('HSET', KEYS[1], 'incarnation', ARGV[1], 'version', ARGV[2], 'state', ARGV[3])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[4]))
return 1
"""

# KEYS: progress. ARGV: channel, incarnation, version, step, event JSON, ttl ms. Non-durable progress.
_PROGRESS_ONLY_LUA = (
    _PROGRESS_LUA
    + """
return put_progress(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), '0', ARGV[5],
                    tonumber(ARGV[6]))
"""
)

_ERRORS = (RedisError, OSError, TimeoutError)


def _state_json(write: CheckpointWrite, created_at: float) -> str:
    return json.dumps(
        {
            "values": write.values,
            "current_node": write.current_node,
            "step": write.step,
            "status": write.status,
            "meta": write.meta,
            "message_count": write.message_count,
            "created_at": created_at,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )


class RedisHotCache:
    """``RedisHotCache("redis://host:6379/0", prefix="agentrun")``; every method degrades to a no-op/miss."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "agentrun",
        ttl: float = 3600.0,
        timeout: float = 0.5,
        retry_after: float = 5.0,
        max_messages: int = 5000,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.ttl_ms = max(1, int(ttl * 1000))
        self.retry_after = retry_after
        self.max_messages = max_messages
        # No client-side retries: a down Redis must cost one fast failure, not a backoff per call.
        self.client: aioredis.Redis = aioredis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self._apply = self.client.register_script(_APPLY_WRITE_LUA)
        self._fill = self.client.register_script(_FILL_LUA)
        self._progress = self.client.register_script(_PROGRESS_ONLY_LUA)
        self._down_until = 0.0
        self._down = False

    # -- keys ----------------------------------------------------------------------

    def key(self, thread_id: str, kind: str) -> str:
        """The Redis key of ``thread_id``'s ``kind`` entry (hash-tagged by thread: one cluster slot per thread)."""
        return f"{self.prefix}:{{{thread_id}}}:{kind}"

    def channel(self, thread_id: str) -> str:
        """The channel a thread's progress and stop events are published on (``events()``, ``watch_progress``)."""
        return f"{self.prefix}:events:{thread_id}"

    def stop_channel(self, thread_id: str) -> str:
        """Stops only (``redis_stops``): a run subscribed to it never receives its own progress."""
        return f"{self.prefix}:stop:{thread_id}"

    # -- availability ----------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """False while a recent failure keeps the cache switched off (``retry_after``)."""
        return time.monotonic() >= self._down_until

    async def _guard(self, op: str, call: Callable[[], Awaitable[T]], default: T) -> T:
        if not self.usable:
            return default
        try:
            result = await call()
        except _ERRORS as e:
            CACHE_ERRORS.labels(op).inc()
            CACHE_AVAILABLE.set(0)
            self._down_until = time.monotonic() + self.retry_after
            if not self._down:
                self._down = True
                log.warning(
                    "Redis at %s failed during %s (%s: %s); continuing on PostgreSQL alone, next try in %.0fs",
                    self._safe_url(),
                    op,
                    type(e).__name__,
                    e,
                    self.retry_after,
                )
            return default
        if self._down:
            self._down = False
            log.info("Redis at %s answers again; the hot cache is back on", self._safe_url())
        CACHE_AVAILABLE.set(1)
        return result

    def _safe_url(self) -> str:
        _, sep, tail = self.url.rpartition("@")
        return f"redis://***@{tail}" if sep else self.url

    # -- state -------------------------------------------------------------------------

    async def get(self, thread_id: str, incarnation: str, version: int) -> Checkpoint | None:
        """The cached checkpoint if it is exactly ``version`` of this incarnation; else ``None`` (a miss)."""

        async def read() -> list[Any]:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.hmget(self.key(thread_id, "state"), ["incarnation", "version", "state"])
                pipe.lrange(self.key(thread_id, "msgs"), 0, -1)
                return list(await pipe.execute())

        replies = await self._guard("get", read, None)
        if replies is None:
            return None
        (inc, cached_version, state_text), bodies = replies
        if state_text is None:
            CACHE_READS.labels("miss").inc()
            return None
        if inc != incarnation or cached_version is None or int(cached_version) != version:
            CACHE_READS.labels("stale").inc()
            return None
        try:
            state = json.loads(state_text)
            if len(bodies) != state["message_count"]:
                raise ValueError(f"{len(bodies)} cached messages, state says {state['message_count']}")
            checkpoint = Checkpoint(
                thread_id=thread_id,
                version=version,
                values=state["values"],
                messages=Message.many_from_json_texts(bodies),
                current_node=state["current_node"],
                step=state["step"],
                status=state["status"],
                meta=state["meta"],
                created_at=state["created_at"],
            )
        except (ValueError, KeyError, TypeError) as e:
            log.warning("dropping a malformed cache entry of thread %r: %s", thread_id, e)
            CACHE_READS.labels("malformed").inc()
            await self.invalidate(thread_id)
            return None
        CACHE_READS.labels("hit").inc()
        return checkpoint

    async def apply_write(
        self,
        thread_id: str,
        incarnation: str,
        *,
        base_version: int,
        version: int,
        write: CheckpointWrite,
        created_at: float,
        bodies: list[tuple[int, str]],
        event: dict[str, Any],
    ) -> int | None:
        """Advance the entry from ``base_version`` to the committed ``version`` and publish its progress."""
        args: list[Any] = [
            incarnation,
            base_version,
            version,
            _state_json(write, created_at),
            write.message_count,
            self.ttl_ms,
            self.channel(thread_id),
            json.dumps(event),
            write.step,
        ]
        for index, body in bodies:
            args += [index, body]
        keys = [self.key(thread_id, "state"), self.key(thread_id, "msgs"), self.key(thread_id, "progress")]

        async def call() -> int:
            return int(await self._apply(keys=keys, args=args))

        return await self._guard("apply_write", call, None)

    async def fill(self, thread_id: str, incarnation: str, checkpoint: Checkpoint, bodies: list[str]) -> None:
        """Store a checkpoint read from PostgreSQL, unless the cache already holds it or a newer one."""
        if len(bodies) > self.max_messages:
            return  # not worth the memory; such threads are read from PostgreSQL
        state = CheckpointWrite(
            values=checkpoint.values,
            current_node=checkpoint.current_node,
            step=checkpoint.step,
            status=checkpoint.status,
            meta=checkpoint.meta,
            message_count=len(bodies),
        )
        args: list[Any] = [incarnation, checkpoint.version, _state_json(state, checkpoint.created_at), self.ttl_ms]
        args += bodies
        keys = [self.key(thread_id, "state"), self.key(thread_id, "msgs")]

        async def call() -> None:
            await self._fill(keys=keys, args=args)

        await self._guard("fill", call, None)

    async def invalidate(self, thread_id: str) -> None:
        """Drop the cached state of ``thread_id`` (after a conflict)."""

        async def call() -> None:
            await self.client.delete(self.key(thread_id, "state"), self.key(thread_id, "msgs"))

        await self._guard("invalidate", call, None)

    async def forget(self, thread_id: str) -> None:
        """Drop everything cached for a deleted thread."""

        async def call() -> None:
            await self.client.delete(*(self.key(thread_id, k) for k in ("state", "msgs", "progress")))

        await self._guard("forget", call, None)

    # -- progress and events ---------------------------------------------------------------

    async def put_progress(self, thread_id: str, event: dict[str, Any]) -> None:
        """Record and publish the progress of a step that is not durable yet."""
        args = [
            self.channel(thread_id),
            event.get("incarnation") or "",
            event["version"],
            event["step"],
            json.dumps(event),
            self.ttl_ms,
        ]

        async def call() -> None:
            await self._progress(keys=[self.key(thread_id, "progress")], args=args)

        await self._guard("put_progress", call, None)

    async def get_progress(self, thread_id: str) -> dict[str, Any] | None:
        """The thread's last published progress event, or ``None`` (none, Redis down, not JSON)."""

        async def call() -> str | None:
            value = await self.client.hget(self.key(thread_id, "progress"), "event")
            return None if value is None else str(value)

        raw = await self._guard("get_progress", call, None)
        if raw is None:
            return None
        try:
            event = json.loads(raw)
        except ValueError:
            return None
        return event if isinstance(event, dict) else None

    async def publish(self, thread_id: str, event: dict[str, Any]) -> None:
        """Publish ``event`` on the thread's events channel; Redis down costs nothing but the event."""

        async def call() -> None:
            await self.client.publish(self.channel(thread_id), json.dumps(event))

        await self._guard("publish", call, None)

    async def publish_stop(self, thread_id: str, event: dict[str, Any]) -> None:
        """``event`` on the thread's events channel and on its stop channel, in one round trip."""

        async def call() -> None:
            payload = json.dumps(event)
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.publish(self.channel(thread_id), payload)
                pipe.publish(self.stop_channel(thread_id), payload)
                await pipe.execute()

        await self._guard("publish", call, None)

    async def events(self, thread_id: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """Progress and stop events of one thread, or of every thread with ``None``, as they are published.

        Raises ``redis.exceptions.RedisError`` (or ``OSError``) when Redis is
        unreachable: a listener should then poll PostgreSQL instead.
        """
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            if thread_id is None:
                await pubsub.psubscribe(f"{self.prefix}:events:*")
            else:
                await pubsub.subscribe(self.channel(thread_id))
            while True:
                event = _event(await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0))
                if event is not None:
                    yield event
        finally:
            await pubsub.aclose()

    def watch_progress(self) -> AsyncGenerator[ProgressEvent, None]:
        """Every thread's published steps (progress events only), one pattern subscription held with backoff.

        Pub/sub is at most once: a ``Deaf`` (Redis down) is retried every ``PROGRESS_RETRY`` seconds.
        """

        async def hear(emit: Emit) -> None:
            async def session(up: Callable[[], None]) -> None:
                pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                try:
                    await pubsub.psubscribe(f"{self.prefix}:events:*")
                    up()
                    emit(Listening("redis"))
                    while True:
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                        event = _event(message)
                        thread = event.get("thread_id") if event is not None else None
                        if event is not None and event.get("type") == "progress" and isinstance(thread, str) and thread:
                            emit(Progressed(thread, "redis"))
                finally:
                    await pubsub.aclose()

            await listen_with_backoff(
                session,
                backoff=Backoff(first=PROGRESS_RETRY, most=PROGRESS_RETRY),
                deaf=lambda error, retry_in, was_up: emit(Deaf("redis", error, retry_in, was_up)),
            )

        return events(hear)

    async def aclose(self) -> None:
        """Close the Redis connections."""
        await self.client.aclose()


def _event(message: dict[str, Any] | None) -> dict[str, Any] | None:
    """The JSON object a published message carries, or ``None`` (no message, a subscription notice, not JSON)."""
    if message is None or message.get("type") not in ("message", "pmessage"):
        return None
    try:
        event = json.loads(message["data"])
    except ValueError:
        return None
    return event if isinstance(event, dict) else None
