"""Stop requests heard as notifications (migration 11, ``pg_listen``): fast stops without a query per interval.

What is protected: a stop lands while a node runs and between fast steps,
whoever writes the request (``request_stop``, raw SQL as an older operator
would), heard as a notification (one check of the store per stop, none
between notifications: counted, not timed; the 2 s contract is proven on
loop time in unit/test_stop.py and measured by ``make bench``); a notified
stop wakes a long node's supervisor before its next timed wake; a lost listener connection falls back to polling
and reconnects; ``listen_for_stops=False`` polls as before; a run shorter
than ``stop_poll_interval`` opens no listener connection; nothing is left
behind (no task, no connection) when the run ends.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, TypedDict

import pytest

from agentrun import END, START, RunStopped, StateGraph
from agentrun.checkpoint.base import StopWatch
from agentrun.checkpoint.postgres import PgCheckpointer

from .helpers import fetch, fetchval, until_redis_delivers, wait_until

LISTENER = "agentrun-stop-listener"


class CountingPg(PgCheckpointer):
    """Counts the runner's stop checks (each is a query on the pool)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.checks = 0

    async def stop_requested(self, thread_id: str) -> str | None:
        self.checks += 1
        return await super().stop_requested(thread_id)


class Counter(TypedDict, total=False):
    n: int


def looping_graph(delay: float, steps: int = 100_000) -> StateGraph:
    """One node looping on itself every ``delay`` seconds: many fast steps."""

    async def tick(state: Counter) -> dict[str, Any]:
        await asyncio.sleep(delay)
        return {"n": state.get("n", 0) + 1}

    g = StateGraph(Counter)
    g.add_node("tick", tick)
    g.add_edge(START, "tick")
    g.add_conditional_edges("tick", lambda s: END if s["n"] >= steps else "tick")
    return g


async def listeners(dsn: str) -> list[int]:
    # This test's database only: other streams' runners listen on theirs at the same time (CI, stop 40).
    rows = await fetch(
        dsn, "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()", LISTENER
    )
    return [r["pid"] for r in rows]


async def start(app: Any, thread: str, **config: Any) -> asyncio.Task[Any]:
    config = {"thread_id": thread, "recursion_limit": 1_000_000, **config}
    return asyncio.create_task(app.ainvoke({"n": 0}, config))


async def stopped_within(task: asyncio.Task[Any], seconds: float) -> float:
    """Seconds until ``task`` raised ``RunStopped``; fails if it did not within ``seconds``."""
    started = time.monotonic()
    with pytest.raises(RunStopped):
        await asyncio.wait_for(task, seconds)
    return time.monotonic() - started


async def settled(runner: CountingPg) -> None:
    """Until the run's listener has swept: no stop check for a whole second (a polling run checks every 0.5 s,
    so it never settles and its test fails as before)."""

    async def quiet_for_a_second() -> bool:
        seen = runner.checks
        await asyncio.sleep(1)
        return runner.checks == seen

    await wait_until(quiet_for_a_second, what="the run to stop checking once its listener swept")


async def test_a_listening_run_asks_the_store_only_when_a_stop_is_notified(pg_dsn: str) -> None:
    runner = CountingPg(pg_dsn)
    operator = PgCheckpointer(pg_dsn, listen_for_stops=False)
    try:
        task = await start(looping_graph(0.005).compile(runner), "t")

        async def listening() -> bool:
            return bool(await listeners(pg_dsn))

        await wait_until(listening, what="the runner to LISTEN for stop requests")
        # Not a fixed 0.3 s: on a loaded machine the first sweep came later, and a check before it was counted.
        await settled(runner)
        before = runner.checks
        await asyncio.sleep(3)
        quiet = runner.checks - before
        assert quiet == 0, f"a listening run asked the store {quiet} times in 3 s without a stop request"
        await operator.request_stop("t", "operator")
        await stopped_within(task, 10)
        asked = runner.checks - before - quiet
        assert asked == 1, f"the stop was found in {asked} checks of the store: not by its notification alone"
    finally:
        await runner.aclose()
        await operator.aclose()
    assert not await listeners(pg_dsn), "the listener connection outlived the store"


async def test_a_stop_written_by_raw_sql_notifies_a_run_inside_a_long_node(pg_dsn: str) -> None:
    """The trigger notifies for any writer (an older operator, psql), and the node is cancelled."""
    runner = CountingPg(pg_dsn)
    try:
        app = looping_graph(3600, steps=1).compile(runner)
        task = await start(app, "t")

        async def listening() -> bool:
            return bool(await listeners(pg_dsn))

        await wait_until(listening, what="the runner to LISTEN for stop requests")
        await asyncio.sleep(0.3)
        await fetch(pg_dsn, "INSERT INTO threads (thread_id) VALUES ('t') ON CONFLICT DO NOTHING")
        checks = runner.checks
        await fetch(pg_dsn, "INSERT INTO stop_requests (thread_id, reason) VALUES ('t', 'psql')")
        await stopped_within(task, 10)
        assert runner.checks == checks + 1, "a raw SQL stop was not notified: the run found it by polling"
        state = await runner.aget("t")
        assert state is not None and state.status == "stopped" and state.meta["stop_reason"] == "psql"
        assert await runner.stop_requested("t") is None, "the stop request was not acknowledged"
    finally:
        await runner.aclose()


class WakeRecordingPg(CountingPg):
    """Counts, per thread, the times its run asks its watch whether a check is due: once before the first node,
    then at each wake of a long node's supervisor."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wakes: dict[str, int] = {}

    async def watch_stops(self, thread_id: str) -> StopWatch:
        watch = await super().watch_stops(thread_id)
        due = watch.due

        def recorded(now: float, interval: float) -> bool:
            self.wakes[thread_id] = self.wakes.get(thread_id, 0) + 1
            return due(now, interval)

        watch.due = recorded  # type: ignore[method-assign]
        return watch


async def test_a_notified_stop_wakes_the_supervisor_of_a_long_node_at_once(pg_dsn: str) -> None:
    """Not at its next timed wake (every stop_poll_interval, at most 1 s): each stop is sent just after a timed
    wake, so a supervisor that only wakes on its timer takes almost a whole interval; heard, it takes a notify."""
    interval = 1.0
    runner = WakeRecordingPg(pg_dsn)
    operator = PgCheckpointer(pg_dsn, listen_for_stops=False)
    took = []
    try:
        app = looping_graph(3600, steps=1).compile(runner)
        for i in range(3):
            task = await start(app, f"t{i}", stop_poll_interval=interval)

            async def listening() -> bool:
                return bool(await listeners(pg_dsn))

            await wait_until(listening, what="the runner to LISTEN for stop requests")
            seen = max(runner.wakes.get(f"t{i}", 0), 1)  # the first is the check before the node

            async def woke() -> bool:
                return runner.wakes.get(f"t{i}", 0) > seen  # noqa: B023 -- awaited in this iteration

            await wait_until(woke, within=10, what="a timed wake of the node's supervisor, listening")
            took.append(await _stop_now(operator, f"t{i}", task))
    finally:
        await runner.aclose()
        await operator.aclose()
    took.sort()
    assert took[1] < interval / 2, f"stops inside a node took {[round(t, 3) for t in took]}s: the supervisor polled"


async def _stop_now(operator: PgCheckpointer, thread: str, task: asyncio.Task[Any]) -> float:
    sent = time.monotonic()
    await operator.request_stop(thread)
    with pytest.raises(RunStopped):
        await asyncio.wait_for(task, 10)
    return time.monotonic() - sent


async def test_a_lost_listener_falls_back_to_polling_and_listens_again(pg_dsn: str) -> None:
    runner = CountingPg(pg_dsn)
    try:
        task = await start(looping_graph(0.005).compile(runner), "t")

        async def listening() -> bool:
            return bool(await listeners(pg_dsn))

        await wait_until(listening, what="the runner to LISTEN for stop requests")
        [pid] = await listeners(pg_dsn)
        assert await fetchval(pg_dsn, "SELECT pg_terminate_backend($1)", pid)
        # Requested while the listener is down: no notification reaches this run.
        await fetch(pg_dsn, "INSERT INTO stop_requests (thread_id, reason) VALUES ('t', 'while down')")
        await stopped_within(task, 10)
    finally:
        await runner.aclose()

    runner = CountingPg(pg_dsn)
    try:
        task = await start(looping_graph(0.005).compile(runner), "u")
        await wait_until(listening, what="the first listener")
        [first] = await listeners(pg_dsn)
        await fetchval(pg_dsn, "SELECT pg_terminate_backend($1)", first)

        async def relistening() -> bool:
            pids = await listeners(pg_dsn)
            return bool(pids) and pids != [first]

        await wait_until(relistening, within=10, what="the listener to reconnect")
        await settled(runner)  # not a fixed 0.3 s (CI, stop 40: the sweep after the reconnect came later)
        before = runner.checks
        await asyncio.sleep(2)
        assert runner.checks - before == 0, "the run kept polling after the listener reconnected"
        await runner.request_stop("u", "after reconnect")
        # Heard, not timed (the 2 s contract: unit/test_stop.py, make bench): a listening run never polls, so a
        # notification the new listener missed would leave it running past any bound.
        await stopped_within(task, 10)
    finally:
        await runner.aclose()


async def test_without_listening_a_run_polls_and_still_stops(pg_dsn: str) -> None:
    runner = CountingPg(pg_dsn, listen_for_stops=False)
    try:
        task = await start(looping_graph(0.005).compile(runner), "t", stop_poll_interval=0.25)

        async def polled() -> bool:  # counted, not timed: a loaded machine runs fewer steps per second
            return runner.checks >= 4

        await wait_until(polled, within=30, what="a run without a listener to check the store 4 times")
        assert not await listeners(pg_dsn), "listen_for_stops=False opened a listener connection"
        await runner.request_stop("t")
        await stopped_within(task, 10)  # polling is its only way to hear it; the 2 s contract is timed elsewhere
    finally:
        await runner.aclose()


async def test_a_short_run_opens_no_listener_and_leaves_nothing_running(pg_dsn: str) -> None:
    runner = CountingPg(pg_dsn)
    try:
        values = await looping_graph(0.001, steps=20).compile(runner).ainvoke({"n": 0}, {"thread_id": "t"})
        assert values["n"] == 20
        assert runner.checks == 1, "a short run checks once, before its first node"
        assert not await listeners(pg_dsn)
        # A long one listens while it runs, and its connection closes when it ends.
        app = looping_graph(0.005, steps=300).compile(runner)
        task = await start(app, "long")

        async def listening() -> bool:
            return bool(await listeners(pg_dsn))

        await wait_until(listening, what="the long run to LISTEN")
        await asyncio.wait_for(task, 30)
        assert not [t for t in asyncio.all_tasks() if t.get_name() == "agentrun:stop-listener" and not t.done()]

        async def closed() -> bool:
            return not await listeners(pg_dsn)

        await wait_until(closed, within=5, what="the listener connection to close with the last run")
    finally:
        await runner.aclose()


class Blackhole:
    """A TCP server that accepts and never answers: a PostgreSQL that hangs before the handshake."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.port = 0
        self.accepted: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> Blackhole:
        self.server = await asyncio.start_server(lambda r, w: self.accepted.append(w), "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        for writer in self.accepted:
            writer.close()
        self.server.close()
        await self.server.wait_closed()


async def test_a_listener_that_cannot_connect_neither_delays_the_stop_nor_the_end_of_the_run(pg_dsn: str) -> None:
    async with Blackhole() as hole:

        class Hanging(CountingPg):
            async def _connect_listener(self) -> Any:
                import asyncpg

                return await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{hole.port}/x", timeout=30)

        runner = Hanging(pg_dsn)
        try:
            task = await start(looping_graph(0.005).compile(runner), "t")

            async def polled() -> bool:  # counted, not timed: a loaded machine runs fewer steps per second
                return runner.checks >= 2

            await wait_until(polled, within=30, what="a run whose listener is not connected to poll")
            await runner.request_stop("t", "while the listener hangs")
            await stopped_within(task, 10)
            started = time.monotonic()
            values = (
                await looping_graph(0.005, steps=150)
                .compile(runner)
                .ainvoke({"n": 0}, {"thread_id": "u", "recursion_limit": 1000})
            )
            assert values["n"] == 150
            ended = time.monotonic() - started
            # 150 steps of ~6 ms, plus at most the listener's 1 s grace: never the 30 s connect timeout (a
            # generous bound between the two).
            assert ended < 15, f"the run's end waited {ended:.1f}s for a hanging listener"
        finally:
            await runner.aclose()


class Deaf(StopWatch):
    """A store's watch that neither hears nor polls after the first check: only Redis can make it due."""

    def poll_interval(self, interval: float) -> float:
        return math.inf


class DeafPg(CountingPg):
    async def watch_stops(self, thread_id: str) -> StopWatch:
        return Deaf()


async def test_a_stop_published_on_redis_reaches_a_run_whose_store_cannot_tell_it(
    pg_dsn: str, redis_prefix: str
) -> None:
    """The optional fast path: with an inner store that never tells nor polls, Redis alone ends the run."""
    from agentrun.checkpoint.cached import CachedStore

    from .conftest import redis_url

    inner = DeafPg(pg_dsn, listen_for_stops=False)
    runner = CachedStore(inner, redis_url=redis_url(), redis_prefix=redis_prefix)
    operator = CachedStore(
        PgCheckpointer(pg_dsn, listen_for_stops=False), redis_url=redis_url(), redis_prefix=redis_prefix
    )
    try:
        task = await start(looping_graph(0.005).compile(runner), "t", stop_poll_interval=0.2)
        # Subscribed once the run outlasts stop_poll_interval; a thread nobody runs proves it without a check.
        await until_redis_delivers(redis_url(), runner.cache.stop_channel("nobody"), pattern=True)
        checks = inner.checks
        await operator.request_stop("t", "redis")
        await stopped_within(task, 5)
        assert inner.checks == checks + 1, "a Redis message is one check of the store"
    finally:
        await runner.aclose()
        await operator.aclose()


async def test_closing_the_redis_stop_subscription_is_bounded_when_a_cancellation_is_swallowed(
    redis_prefix: str,
) -> None:
    """A runner hung at exit (a chaos trial, its run completed) with the Redis stop loop alive for minutes.

    Python 3.11's ``asyncio.timeout`` can turn a cancellation that lands as ``get_message``'s own 1 s timeout
    expires into a ``TimeoutError``, which the loop takes for a Redis failure; the race is forced here.
    """
    from agentrun.checkpoint.redis_cache import RedisHotCache
    from agentrun.checkpoint.redis_stops import RedisStops

    from .conftest import redis_url

    cache = RedisHotCache(redis_url(), prefix=redis_prefix)
    subscribe = cache.client.pubsub

    def swallowing(**kwargs: Any) -> Any:
        pubsub = subscribe(**kwargs)
        read = pubsub.get_message

        async def get_message(**kw: Any) -> Any:
            try:
                return await read(**kw)
            except asyncio.CancelledError:
                raise TimeoutError("the cancellation came out as the read's own timeout") from None

        pubsub.get_message = get_message  # type: ignore[method-assign]
        return pubsub

    cache.client.pubsub = swallowing  # type: ignore[method-assign]
    stops = RedisStops(cache)
    try:
        stops.watch("t", Deaf())
        stops.start()
        await asyncio.sleep(0.5)  # subscribed, waiting in get_message
        loops = [t for t in asyncio.all_tasks() if t.get_name() == "agentrun:redis-stops"]
        assert len(loops) == 1
        started = time.monotonic()
        await stops.aclose()
        # Bounded at 2 s by design; the failure is a loop reconnecting for minutes: a generous bound between.
        assert time.monotonic() - started < 10, "closing the store waited on the stop loop"
        await asyncio.wait(loops, timeout=5)
        assert loops[0].done(), "the stop loop went on after its store closed (reconnecting to Redis forever)"
    finally:
        await cache.aclose()
