"""The Redis hot cache: never older than PostgreSQL, cleared on conflict, optional when Redis dies.

Readers are separate checkpointers (separate pools and Redis clients), as
separate processes would be.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis

from agentrun import END, START, StaleStateError, StateGraph
from agentrun.checkpoint.cached import CachedStore
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.messages import assistant, user
from agentrun.metrics import CACHE_ERRORS, CACHE_READS
from agentrun_dev.servers import PrivateRedis
from tests.support.checkpointers import write

from .conftest import cached_store, redis_url
from .helpers import REQUEST, drive, driver_args, fetch, invocations, spawn, until_redis_delivers, wait_for_line


def counter(metric: Any, **labels: str) -> float:
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels == labels:
                return float(sample.value)
    return 0.0


async def keys(prefix: str) -> list[str]:
    client = aioredis.Redis.from_url(redis_url(), decode_responses=True)
    try:
        return sorted([k async for k in client.scan_iter(match=f"{prefix}:*")])
    finally:
        await client.aclose()


async def test_a_cache_hit_returns_exactly_what_postgres_holds(pg_dsn: str, cached: CachedStore) -> None:
    a, b = user("a"), assistant("b")
    await cached.aput("t", write((0, a), count=1, values={"n": 1}, meta={"run_id": "r"}), expected_version=0)
    await cached.aput(
        "t", write((0, a.model_copy(update={"content": "a2"})), (1, b), count=2, step=1), expected_version=1
    )
    hits = counter(CACHE_READS, result="hit")
    from_cache = await cached.aget("t")
    assert counter(CACHE_READS, result="hit") == hits + 1, "the read did not come from the cache"
    assert cached.cache is not None
    for kind in ("state", "msgs", "progress"):
        ttl = await cached.cache.client.pttl(cached.cache.key("t", kind))
        assert 0 < ttl <= 3600_000, f"the {kind} entry must expire (PTTL {ttl})"
    plain = PgCheckpointer(pg_dsn)
    try:
        assert from_cache == await plain.aget("t"), "the cache entry differs from PostgreSQL"
    finally:
        await plain.aclose()


async def test_after_a_newer_write_the_older_cached_state_is_never_served(pg_dsn: str, cached: CachedStore) -> None:
    await cached.aput("t", write((0, user("v1")), count=1), expected_version=0)
    assert (await cached.aget("t")).version == 1  # type: ignore[union-attr]  # cached at version 1
    # Another process writes version 2 without reaching Redis (no cache configured: as if Redis was down for it).
    blind = PgCheckpointer(pg_dsn)
    try:
        await blind.aput("t", write((1, user("v2")), count=2, step=1), expected_version=1)
    finally:
        await blind.aclose()
    stale = counter(CACHE_READS, result="stale")
    cp = await cached.aget("t")
    assert cp is not None and cp.version == 2 and [m.content for m in cp.messages] == ["v1", "v2"], (
        "GUARANTEE BROKEN: the cache served a state older than PostgreSQL's latest version"
    )
    assert counter(CACHE_READS, result="stale") == stale + 1
    assert (await cached.aget("t")).version == 2  # type: ignore[union-attr]  # refilled, now a hit


async def test_a_late_cache_update_never_replaces_a_newer_entry(cached: CachedStore) -> None:
    cache = cached.cache
    assert cache is not None
    await cached.aput("t", write((0, user("v1")), count=1), expected_version=0)
    v1 = await cached.aget("t")
    await cached.aput("t", write((1, user("v2")), count=2, step=1), expected_version=1)
    assert v1 is not None
    head = await cached.aget("t")
    assert head is not None and head.version == 2
    incarnation = cached._incarnations["t"]
    # A slow writer's update of version 1 and a slow reader's fill of version 1 arrive after version 2.
    assert (
        await cache.apply_write(
            "t",
            incarnation,
            base_version=0,
            version=1,
            write=write((0, user("v1")), count=1),
            created_at=0.0,
            bodies=[(0, '{"role":"user","content":"late"}')],
            event={"type": "progress", "version": 1, "step": 0},
        )
        == 0
    )
    await cache.fill("t", incarnation, v1, [m.model_dump_json() for m in v1.messages])
    assert await cache.get("t", incarnation, 2) == head, "an older update replaced the newer cache entry"
    assert await cache.get("t", incarnation, 1) is None


async def test_concurrent_readers_never_see_a_version_older_than_the_last_commit_before_their_read(
    pg_dsn: str, redis_prefix: str
) -> None:
    writer = cached_store(pg_dsn, redis_prefix)
    readers = [cached_store(pg_dsn, redis_prefix) for _ in range(4)]
    committed = 0
    violations: list[tuple[int, int]] = []
    done = asyncio.Event()

    async def write_all() -> None:
        nonlocal committed
        try:
            for version in range(40):
                committed = await writer.aput(
                    "t",
                    write((version, user(f"m{version}")), count=version + 1, step=version),
                    expected_version=version,
                )
        finally:
            done.set()

    async def read(cp: CachedStore) -> int:
        reads = 0
        while not done.is_set():
            floor = committed
            got = await cp.aget("t")
            version = got.version if got else 0
            if version < floor:
                violations.append((floor, version))
            if got is not None:
                assert [m.content for m in got.messages] == [f"m{i}" for i in range(version)]
            reads += 1
        return reads

    hits = counter(CACHE_READS, result="hit")
    await writer.setup()
    writing = asyncio.create_task(write_all())
    try:
        counts = await asyncio.gather(*(read(cp) for cp in readers))
        await writing
    finally:
        done.set()
        writing.cancel()
        await asyncio.gather(writing, return_exceptions=True)
        for cp in [writer, *readers]:
            await cp.aclose()
    assert sum(counts) > 40, "the readers barely ran; the test proved nothing"
    assert counter(CACHE_READS, result="hit") > hits, "no read came from the cache; the test proved nothing"
    assert not violations, f"GUARANTEE BROKEN: reads returned versions older than already committed: {violations}"


async def test_a_conflict_clears_the_cache_entry(pg_dsn: str, cached: CachedStore, redis_prefix: str) -> None:
    await cached.aput("t", write((0, user("a")), count=1), expected_version=0)
    assert f"{redis_prefix}:{{t}}:state" in await keys(redis_prefix)
    loser = cached_store(pg_dsn, redis_prefix)
    try:
        try:
            await loser.aput("t", write((0, user("b")), count=1), expected_version=0)
            raise AssertionError("a write from a stale version must raise StaleStateError")
        except StaleStateError:
            pass
    finally:
        await loser.aclose()
    left = await keys(redis_prefix)
    assert f"{redis_prefix}:{{t}}:state" not in left and f"{redis_prefix}:{{t}}:msgs" not in left, left


async def test_the_cache_of_a_deleted_thread_is_never_served_for_a_new_thread_of_the_same_id(
    pg_dsn: str, cached: CachedStore
) -> None:
    for version in range(3):
        await cached.aput("t", write((version, user(f"old{version}")), count=version + 1), expected_version=version)
    # Deleted by a process without Redis: the old entry (version 3) stays in the cache.
    blind = PgCheckpointer(pg_dsn)
    try:
        await blind.delete_thread("t")
        for version in range(3):
            await blind.aput("t", write((version, user(f"new{version}")), count=version + 1), expected_version=version)
    finally:
        await blind.aclose()
    cp = await cached.aget("t")
    assert cp is not None and [m.content for m in cp.messages] == ["new0", "new1", "new2"], (
        "the cache served the deleted thread's state for the new thread"
    )


async def test_stop_requests_and_progress_are_published_to_listeners_at_once(
    pg_dsn: str, cached: CachedStore, redis_prefix: str
) -> None:
    listener = cached_store(pg_dsn, redis_prefix)
    events: list[dict[str, Any]] = []

    async def listen() -> None:
        async for event in listener.events("t"):
            events.append(event)
            if len(events) == 3:
                return

    task = asyncio.create_task(listen())
    try:
        await until_redis_delivers(redis_url(), listener.cache.channel("t"))
        await cached.aput("t", write((0, user("a")), count=1, node="tools", step=1), expected_version=0)
        await cached.cache_put("t", write(count=1, node="model", step=2), version=1)  # non-durable step
        await cached.request_stop("t", "user asked")
        await asyncio.wait_for(task, 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await listener.aclose()
    kinds = [(e["type"], e.get("version"), e.get("step"), e.get("durable")) for e in events]
    assert kinds == [("progress", 1, 1, True), ("progress", 1, 2, False), ("stop", None, None, None)], kinds
    # Published, not polled from PostgreSQL: the non-durable step (step 2) exists only in Redis, and it was heard.
    assert await cached.stop_requested("t") == "user asked", "PostgreSQL stays the source of truth for stops"
    progress = await cached.aget_progress("t")
    assert progress is not None and (progress.version, progress.step, progress.durable) == (1, 2, False)


async def test_redis_going_away_costs_a_warning_and_a_metric_and_everything_continues_on_postgres(
    pg_dsn: str, private_redis: PrivateRedis, caplog: Any
) -> None:
    cp = CachedStore(PgCheckpointer(pg_dsn), redis_url=private_redis.url, redis_prefix="p")
    try:
        await cp.aput("t", write((0, user("a")), count=1), expected_version=0)
        assert (await cp.aget("t")).version == 1  # type: ignore[union-attr]
        private_redis.kill()
        errors = sum(counter(CACHE_ERRORS, op=op) for op in ("apply_write", "get", "fill", "put_progress"))
        await cp.aput("t", write((1, user("b")), count=2, step=1), expected_version=1)
        got = await cp.aget("t")
        await cp.cache_put("t", write(count=2, step=2), version=2)
        await cp.aput("t", write((2, user("c")), count=3, step=2), expected_version=2)
        assert got is not None and got.version == 2 and [m.content for m in got.messages] == ["a", "b"]
        assert (await cp.aget("t")).version == 3  # type: ignore[union-attr]
        after = sum(counter(CACHE_ERRORS, op=op) for op in ("apply_write", "get", "fill", "put_progress"))
        assert after > errors, "a Redis failure must be counted in agentrun_cache_errors_total"
        warnings = [r for r in caplog.records if "continuing on PostgreSQL alone" in r.getMessage()]
        assert len(warnings) == 1, "one warning per outage, not one per call"
    finally:
        await cp.aclose()


async def test_redis_killed_mid_run_the_run_completes_on_postgres(
    pg_dsn: str, private_redis: PrivateRedis, subprocess_env: dict[str, str]
) -> None:
    env = dict(subprocess_env, SUPPORT_TOOL_DELAY="1.0")
    reference = await drive(
        dict(subprocess_env, SUPPORT_EFFECTS_DB=subprocess_env["SUPPORT_EFFECTS_DB"] + ".ref"),
        driver_args(pg_dsn, "reference", text=REQUEST),
    )
    assert reference.returncode == 0, str(reference)

    process = await spawn(env, driver_args(pg_dsn, "t", text=REQUEST, redis=private_redis.url, redis_prefix="p"))
    await wait_for_line(process, "STEP model")  # the tools are running now
    private_redis.kill()
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, f"the run failed after Redis died:\n{stderr.decode()}"
    assert "continuing on PostgreSQL alone" in stderr.decode()
    final = [line for line in stdout.decode().splitlines() if line.startswith("FINAL ")]
    assert final and final[-1] == [line for line in reference.stdout.splitlines() if line.startswith("FINAL ")][-1]
    for tool in ("charge_card", "send_receipt"):
        assert invocations(env["SUPPORT_EFFECTS_DB"], tool) == 1


async def test_steps_kept_out_of_postgres_are_published_as_non_durable_progress(
    pg_dsn: str, cached: CachedStore, redis_prefix: str
) -> None:
    """``durable_checkpoint_every_step: false``: PostgreSQL gets the start and the end, Redis hears every step."""

    def reply(text: str) -> Any:
        return lambda state: {"messages": [assistant(text)]}

    graph = StateGraph()
    for name in ("a", "b", "c"):
        graph.add_node(name, reply(name))
    graph.add_edge(START, "a")
    graph.add_edge("a", "b")
    graph.add_edge("b", "c")
    graph.add_edge("c", END)
    listener = cached_store(pg_dsn, redis_prefix)
    heard: list[tuple[int, int, bool]] = []

    async def listen() -> None:
        async for event in listener.events("t"):
            heard.append((event["version"], event["step"], event["durable"]))
            if event["status"] == "completed":
                return

    task = asyncio.create_task(listen())
    try:
        await until_redis_delivers(redis_url(), listener.cache.channel("t"))
        values = await graph.compile(cached).ainvoke("go", {"thread_id": "t", "durable_checkpoint_every_step": False})
        await asyncio.wait_for(task, 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await listener.aclose()
    assert [m.content for m in values["messages"]] == ["go", "a", "b", "c"]
    versions = [r["version"] for r in await fetch(pg_dsn, "SELECT version FROM states ORDER BY version")]
    assert versions == [1, 2], f"non-durable steps must not be written to PostgreSQL: {versions}"
    assert heard == [(1, 0, True), (1, 1, False), (1, 2, False), (2, 3, True)], heard
    cp = await cached.aget("t")
    assert cp is not None and [m.content for m in cp.messages] == ["go", "a", "b", "c"]
