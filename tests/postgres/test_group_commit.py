"""Group commit of parallel tool results (``checkpoint.group``) on a real PostgreSQL.

What it protects: the results of one assistant message's parallel calls that finish
together are recorded by ONE transaction (rows inserted by one transaction share
their ``xmin``, so the ledger itself tells how many commits recorded it); a slow call
keeps its own commit and never holds its finished siblings back; a finished call is
unrecorded for at most the window; a fenced batch records nothing and fails every
call of it; a failed batch is the ledger's write failure for each of its calls; and
the batch function recognises a retried writer's own rows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from agentrun import FencedError, tool
from agentrun.checkpoint import Checkpointer
from agentrun.checkpoint.base import LedgerRow
from agentrun.checkpoint.group import LEDGER_GROUP_WINDOW, LedgerGroup
from agentrun.checkpoint.postgres import PgCheckpointer
from tests.unit.helpers import app_for, call, tool_messages

from .conftest import cached_store
from .helpers import fetch, fetchval

THREAD = "default/group"


def envelope(value: Any) -> dict[str, Any]:
    return {"__kind__": "raw", "value": value}


async def commits(dsn: str, thread_id: str) -> dict[str, set[str]]:
    """The ledger's rows of the thread grouped by the transaction that inserted them: {xmin: {tool names}}."""
    rows = await fetch(dsn, "SELECT xmin::text AS x, tool_name FROM tool_executions WHERE thread_id = $1", thread_id)
    grouped: dict[str, set[str]] = {}
    for r in rows:
        grouped.setdefault(r["x"], set()).add(r["tool_name"])
    return grouped


@pytest.fixture(params=["postgres", "postgres+redis"])
async def store(request: pytest.FixtureRequest, pg_dsn: str, redis_prefix: str) -> AsyncIterator[Checkpointer]:
    """PostgreSQL alone, and behind the Redis hot cache (which must pass the batch through)."""
    cp: Checkpointer = PgCheckpointer(pg_dsn) if request.param == "postgres" else cached_store(pg_dsn, redis_prefix)
    await cp.setup()
    try:
        yield cp
    finally:
        await cp.aclose()


async def test_parallel_results_that_finish_together_share_one_commit(store: Checkpointer, pg_dsn: str) -> None:
    assert store.ledger_group_window == LEDGER_GROUP_WINDOW == 0.002, "the documented default window is 2 ms"

    @tool
    async def lookup(key: str) -> str:
        return f"value of {key}"

    @tool
    async def score(key: str) -> int:
        return len(key)

    @tool
    async def rank(key: str) -> int:
        return 1

    calls = [call("c1", "lookup", key="k"), call("c2", "score", key="k"), call("c3", "rank", key="k")]
    values = await app_for([lookup, score, rank], calls, store).ainvoke("go", {"thread_id": THREAD})
    assert set(tool_messages(values)) == {"c1", "c2", "c3"}
    grouped = await commits(pg_dsn, THREAD)
    assert list(grouped.values()) == [{"lookup", "score", "rank"}], (
        f"GROUP COMMIT BROKEN: three results that finished together took {len(grouped)} commits: {grouped}"
    )


async def test_a_slow_sibling_gets_its_own_commit_and_never_holds_the_finished_ones_back(
    store: Checkpointer, pg_dsn: str
) -> None:
    """While the slow call still runs, its finished siblings are already committed (seen from another connection)."""
    seen: dict[str, float] = {}
    returned: dict[str, float] = {}

    @tool
    async def fast_a() -> str:
        returned["fast_a"] = time.monotonic()
        return "a"

    @tool
    async def fast_b() -> str:
        returned["fast_b"] = time.monotonic()
        return "b"

    @tool
    async def slow() -> str:
        conn = await asyncpg.connect(pg_dsn, server_settings={"search_path": "agentrun"})
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                names = await conn.fetch("SELECT tool_name FROM tool_executions WHERE thread_id = $1", THREAD)
                if {r["tool_name"] for r in names} >= {"fast_a", "fast_b"}:
                    seen["fast"] = time.monotonic()
                    break
                await asyncio.sleep(0.005)
        finally:
            await conn.close()
        return "slow"

    calls = [call("c1", "fast_a"), call("c2", "fast_b"), call("c3", "slow")]
    await app_for([fast_a, fast_b, slow], calls, store).ainvoke("go", {"thread_id": THREAD})
    assert "fast" in seen, "GUARANTEE BROKEN: the finished calls were not recorded while their slow sibling ran"
    # Held back for their slow sibling, they would stay unrecorded for its 10 s; how long the batch waits
    # (the window) is asserted on loop time (unit tier, LedgerGroup): a generous bound between.
    waited = seen["fast"] - max(returned.values())
    assert waited < LEDGER_GROUP_WINDOW + 5, f"finished calls stayed unrecorded {waited:.3f}s"
    by_commit = sorted((await commits(pg_dsn, THREAD)).values(), key=len)
    assert by_commit == [{"slow"}, {"fast_a", "fast_b"}], f"the slow call alone, the fast two together: {by_commit}"


async def test_a_sibling_finishing_within_the_window_joins_the_batch_and_the_wait_is_bounded_by_it(
    pg_dsn: str,
) -> None:
    """A 300 ms window (``agentrun_ledger_window_ms``): b, 50 ms after a, shares a's commit; a waits <= the window."""
    window = 0.3
    store = PgCheckpointer(pg_dsn + "?agentrun_ledger_window_ms=300")
    assert store.ledger_group_window == window
    await store.setup()
    returned: dict[str, float] = {}
    recorded_at: dict[str, float] = {}

    @tool
    async def a() -> str:
        returned["a"] = time.monotonic()
        return "a"

    @tool
    async def b() -> str:
        await asyncio.sleep(0.05)
        return "b"

    @tool
    async def slow() -> str:
        conn = await asyncpg.connect(pg_dsn, server_settings={"search_path": "agentrun"})
        try:
            while "a" not in recorded_at:
                if await conn.fetchval("SELECT count(*) FROM tool_executions WHERE thread_id = $1", THREAD):
                    recorded_at["a"] = time.monotonic()
                await asyncio.sleep(0.005)
        finally:
            await conn.close()
        return "slow"

    try:
        calls = [call("c1", "a"), call("c2", "b"), call("c3", "slow")]
        await asyncio.wait_for(app_for([a, b, slow], calls, store).ainvoke("go", {"thread_id": THREAD}), 20)
    finally:
        await store.aclose()
    # Waiting for slow (which waits for a's record) would never end; the window itself is asserted on loop
    # time (unit tier): a generous bound between.
    unrecorded = recorded_at["a"] - returned["a"]
    assert unrecorded < window + 5, f"GUARANTEE BROKEN: a finished call stayed unrecorded {unrecorded:.3f}s"
    by_commit = sorted((await commits(pg_dsn, THREAD)).values(), key=len)
    assert by_commit == [{"slow"}, {"a", "b"}], f"b finished within the window and must share a's commit: {by_commit}"


async def test_a_fenced_batch_raises_fenced_error_in_every_call_of_it_and_records_nothing(pg_dsn: str) -> None:
    store = PgCheckpointer(pg_dsn)
    await store.setup()
    try:
        await store.register_attempt(THREAD, 2, run_uid="run-a")
        group = LedgerGroup(store, THREAD, siblings=3, window=5.0, attempt=1, run_uid="run-a")
        outcomes = await asyncio.wait_for(
            asyncio.gather(
                *(group.put(LedgerRow(f"m:{n}", n, envelope(n))) for n in ("a", "b", "c")), return_exceptions=True
            ),
            5,  # every sibling is waiting: the batch must not wait out its 5 s window
        )
    finally:
        await store.aclose()
    assert [type(o) for o in outcomes] == [FencedError] * 3, f"every call of a fenced batch must be fenced: {outcomes}"
    assert await fetchval(pg_dsn, "SELECT count(*) FROM tool_executions") == 0, "a fenced batch recorded rows"


async def test_a_run_fenced_during_its_parallel_calls_stops_with_nothing_recorded(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    store, successor = PgCheckpointer(pg_dsn), PgCheckpointer(pg_dsn)
    await store.setup()
    await successor.setup()
    await store.register_attempt(THREAD, 1, run_uid="run-a")
    taken_over = asyncio.Event()

    @tool
    async def one() -> str:
        await taken_over.wait()
        return "1"

    @tool
    async def two() -> str:
        await successor.register_attempt(THREAD, 2, run_uid="run-a")  # a newer pod takes over while both run
        taken_over.set()
        return "2"

    try:
        app = app_for([one, two], [call("c1", "one"), call("c2", "two")], store)
        with pytest.raises(FencedError):
            await app.ainvoke("go", {"thread_id": THREAD, "attempt": 1, "run_uid": "run-a"})
    finally:
        await store.aclose()
        await successor.aclose()
    assert await fetchval(pg_dsn, "SELECT count(*) FROM tool_executions") == 0, "a fenced attempt recorded results"
    assert not [r for r in caplog.records if "could not be recorded" in r.getMessage()], (
        "a fenced record is no write failure: it must end the attempt, not be logged as unrecorded"
    )


async def test_a_failed_batch_is_a_write_failure_of_each_call_and_the_run_continues(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server refuses the batch (a trigger raises): each call logs COMPLETED-not-recorded, counted unrecorded."""
    store = PgCheckpointer(pg_dsn)
    await store.setup()
    conn = await asyncpg.connect(pg_dsn, server_settings={"search_path": "agentrun"})
    try:
        await conn.execute(
            """
            CREATE FUNCTION refuse_b() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.tool_name = 'b' THEN RAISE EXCEPTION 'disk full (test)'; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_b BEFORE INSERT ON tool_executions FOR EACH ROW EXECUTE FUNCTION refuse_b();
            """
        )
    finally:
        await conn.close()

    @tool
    async def a() -> str:
        return "a"

    @tool
    async def b() -> str:
        return "b"

    @tool
    async def c() -> str:
        return "c"

    try:
        calls = [call("c1", "a"), call("c2", "b"), call("c3", "c")]
        values = await app_for([a, b, c], calls, store).ainvoke("go", {"thread_id": THREAD})
        checkpoint = await store.aget(THREAD)
    finally:
        await store.aclose()
    assert {k: m.content for k, m in tool_messages(values).items()} == {"c1": "a", "c2": "b", "c3": "c"}, (
        "the results must reach the model although they could not be recorded"
    )
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    for name in ("a", "b", "c"):
        assert any(f"({name}) COMPLETED but could not be recorded" in e and "disk full" in e for e in errors), (
            f"call {name} of the failed batch was not reported as completed-but-unrecorded: {errors}"
        )
    assert checkpoint is not None and checkpoint.status == "completed", "a failed ledger write must not fail the run"
    assert checkpoint.meta["tool_calls"]["unrecorded"] == 3
    assert await fetchval(pg_dsn, "SELECT count(*) FROM tool_executions") == 0, "a failed batch is all or nothing"


async def test_the_batch_function_tells_a_retried_writers_own_rows_from_anyone_elses(pg_dsn: str) -> None:
    """What lets a retry of an unacknowledged batch commit know its rows landed (as ``_OWN_LEDGER`` does for one)."""
    store = PgCheckpointer(pg_dsn)
    await store.setup()
    try:
        rows = [LedgerRow("m:a", "a", envelope(1)), LedgerRow("m:b", "b", envelope(2))]
        assert await store.ledger_put_many(THREAD, rows, attempt=1, run_uid="r") == [True, True]
    finally:
        await store.aclose()
    sql = "SELECT o_outcome, o_rows FROM agentrun_put_tool_results($1, $2, $3, $4, $5, $6, $7)"
    texts = ['{"__kind__":"raw","value":1}', '{"__kind__":"raw","value":2}']
    args = (THREAD, ["m:a", "m:b"], ["a", "b"], texts, texts)
    own = await fetch(pg_dsn, sql, *args, 1, "r")
    assert (own[0]["o_outcome"], own[0]["o_rows"]) == ("ok", ["own", "own"])
    other = await fetch(pg_dsn, sql, *args, 2, "r")
    assert other[0]["o_rows"] == ["exists", "exists"], "another attempt's identical rows are not its own"
    changed = await fetch(pg_dsn, sql, THREAD, ["m:a"], ["a"], ['{"x":1}'], ['{"x":1}'], 1, "r")
    assert changed[0]["o_rows"] == ["exists"], "other text is not the writer's own row"


async def test_parallel_side_effect_calls_claim_their_intents_in_one_statement_and_share_one_result_commit(
    store: Checkpointer, pg_dsn: str
) -> None:
    @tool(side_effects=True, in_doubt="retry")
    async def charge(n: int, idempotency_key: str | None = None) -> str:
        return f"charged {n}"

    @tool(side_effects=True, in_doubt="retry")
    async def notify(n: int, idempotency_key: str | None = None) -> str:
        return f"notified {n}"

    calls = [call("c1", "charge", n=1), call("c2", "charge", n=2), call("c3", "notify", n=3)]
    await app_for([charge, notify], calls, store).ainvoke("go", {"thread_id": THREAD})
    intents = await fetch(pg_dsn, "SELECT xmin::text AS x FROM tool_intents WHERE thread_id = $1", THREAD)
    assert len(intents) == 3 and len({r["x"] for r in intents}) == 1, (
        f"the intents of three calls that started together must be one statement: {[r['x'] for r in intents]}"
    )
    assert len(await commits(pg_dsn, THREAD)) == 1, "their results, which finished together, must share one commit"


async def test_coalesced_intent_claims_answer_per_call_and_a_fenced_statement_fences_each(pg_dsn: str) -> None:
    store = PgCheckpointer(pg_dsn)
    await store.setup()
    try:
        assert await store.intent_claim(THREAD, "m:b", "charge", "ar-b", attempt=1, run_uid="r") is None
        claims = await asyncio.gather(
            *(store.intent_claim(THREAD, f"m:{k}", "charge", f"ar-{k}", attempt=1, run_uid="r") for k in "abc")
        )
        assert claims[0] is None and claims[2] is None, "new starts must be recorded"
        assert claims[1] is not None and (claims[1].key, claims[1].idempotency_key) == ("m:b", "ar-b"), (
            "a call that started before must get its earlier intent back (it is in doubt)"
        )
        await store.register_attempt(THREAD, 2, run_uid="r")
        fenced = await asyncio.gather(
            *(store.intent_claim(THREAD, f"m:{k}", "charge", None, attempt=1, run_uid="r") for k in "xyz"),
            return_exceptions=True,
        )
    finally:
        await store.aclose()
    assert [type(f) for f in fenced] == [FencedError] * 3, f"each claim of a fenced statement must be fenced: {fenced}"
    keys = {r["tool_call_id"] for r in await fetch(pg_dsn, "SELECT tool_call_id FROM tool_intents")}
    assert keys == {"m:a", "m:b", "m:c"}, f"a fenced claim recorded an intent: {keys}"
