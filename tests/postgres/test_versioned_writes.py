"""Versioned writes, the ledger table, fencing order and thread deletion, checked in PostgreSQL itself.

The shared suite checks the contract through the interface; these tests
look at the rows, the catalog and the locks, where the PostgreSQL rules of
DESIGN.md section 2 live.
"""

from __future__ import annotations

import asyncio
import dataclasses

import asyncpg
import pytest

from agentrun import FencedError, StaleStateError, StorageError
from agentrun.checkpoint.pg_schema import MAX_THREAD_ID_LENGTH
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.messages import assistant, user
from tests.support.checkpointers import write

from .helpers import fetch, fetchval


async def test_a_step_writes_only_its_new_messages_and_leaves_older_rows_untouched(
    pg_dsn: str, checkpointer: PgCheckpointer
) -> None:
    history = [user(f"m{i}") for i in range(50)]
    await checkpointer.aput("t", write(*enumerate(history), count=50), expected_version=0)
    before = {r["idx"]: r["xmin"] for r in await fetch(pg_dsn, "SELECT idx, xmin::text FROM messages")}
    await checkpointer.aput("t", write((50, assistant("new")), count=51, step=1), expected_version=1)
    after = {r["idx"]: r["xmin"] for r in await fetch(pg_dsn, "SELECT idx, xmin::text FROM messages")}
    rewritten = [i for i in before if after[i] != before[i]]
    assert rewritten == [], f"a step rewrote {len(rewritten)} older message rows; the cost of a step must not grow"
    assert await fetchval(pg_dsn, "SELECT count(*) FROM messages WHERE version = 2") == 1


async def test_unique_thread_version_index_exists_and_rejects_a_second_row_for_a_version(
    pg_dsn: str, checkpointer: PgCheckpointer
) -> None:
    columns = await fetchval(
        pg_dsn,
        """SELECT array_agg(a.attname::text ORDER BY k.ord)
           FROM pg_constraint c CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, ord)
           JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
           WHERE c.conrelid = 'agentrun.states'::regclass AND c.contype = 'u'""",
    )
    assert columns == ["thread_id", "version"], "UNIQUE (thread_id, version) is missing on states"
    await checkpointer.aput("t", write(count=0), expected_version=0)
    with pytest.raises(asyncpg.UniqueViolationError):
        await fetch(
            pg_dsn,
            "INSERT INTO states (thread_id, version, step, status, state_values, meta, message_count) "
            "VALUES ('t', 1, 0, 'running', '{}', '{}', 0)",
        )


async def test_concurrent_writers_from_one_version_exactly_one_commits(pg_dsn: str) -> None:
    writers = [PgCheckpointer(pg_dsn) for _ in range(8)]
    try:
        await writers[0].aput("t", write((0, user("base")), count=1), expected_version=0)
        results = await asyncio.gather(
            *(
                cp.aput("t", write((1, user(f"w{i}")), count=2, values={"w": i}), expected_version=1)
                for i, cp in enumerate(writers)
            ),
            return_exceptions=True,
        )
        winners = [i for i, r in enumerate(results) if r == 2]
        assert len(winners) == 1, f"exactly one writer must commit version 2, got {results}"
        losers = [r for r in results if isinstance(r, StaleStateError)]
        assert len(losers) == 7 and all((e.expected, e.actual) == (1, 2) for e in losers), results
        state = await writers[0].aget("t")
        assert state is not None and state.values == {"w": winners[0]}
        assert [m.content for m in state.messages] == ["base", f"w{winners[0]}"], "a loser's message landed"
    finally:
        for cp in writers:
            await cp.aclose()


async def test_state_and_its_messages_commit_together_or_not_at_all(pg_dsn: str, checkpointer: PgCheckpointer) -> None:
    await checkpointer.aput("t", write((0, user("a")), count=1), expected_version=0)
    # A negative index violates the messages CHECK after the state row was inserted in the same transaction.
    with pytest.raises(StorageError):
        await checkpointer.aput("t", write((-1, user("bad")), count=2, step=1), expected_version=1)
    assert await fetchval(pg_dsn, "SELECT max(version) FROM states") == 1, "the state row of a failed write landed"
    assert await checkpointer.aput("t", write((1, user("b")), count=2, step=1), expected_version=1) == 2


async def test_thread_ids_up_to_253_characters_are_accepted_and_longer_ones_rejected(
    pg_dsn: str, checkpointer: PgCheckpointer
) -> None:
    longest = "n" * MAX_THREAD_ID_LENGTH
    assert await checkpointer.aput(longest, write(count=0), expected_version=0) == 1
    with pytest.raises(ValueError, match="253"):
        await checkpointer.aput(longest + "x", write(count=0), expected_version=0)
    with pytest.raises(asyncpg.CheckViolationError):  # the database enforces it too
        await fetch(pg_dsn, "INSERT INTO threads (thread_id) VALUES ($1)", longest + "x")


async def test_thread_id_column_type_is_configurable(pg_dsn: str) -> None:
    cp = PgCheckpointer(pg_dsn, thread_id_type="varchar(64)")
    try:
        await cp.setup()
        types = await fetch(
            pg_dsn,
            "SELECT table_name::text, data_type::text, character_maximum_length FROM information_schema.columns "
            "WHERE table_schema = 'agentrun' AND column_name = 'thread_id'",
        )
        assert {(r["data_type"], r["character_maximum_length"]) for r in types} == {("character varying", 64)}
        # Every table but the migrations' own has a thread_id column.
        thread_tables = await fetchval(pg_dsn, "SELECT count(*) - 1 FROM pg_tables WHERE schemaname = 'agentrun'")
        assert len(types) == thread_tables, f"every thread_id column must use the configured type: {types}"
    finally:
        await cp.aclose()
    with pytest.raises(ValueError):
        PgCheckpointer(pg_dsn, thread_id_type="varchar(300)")
    with pytest.raises(ValueError):
        PgCheckpointer(pg_dsn, thread_id_type="text; DROP TABLE threads")


async def test_a_ledger_write_waiting_on_a_registration_sees_the_new_attempt_once_granted(
    pg_dsn: str, checkpointer: PgCheckpointer
) -> None:
    """Fencing order: a write of attempt 1 queued behind attempt 2's registration must not commit after it."""
    await checkpointer.register_attempt("t", 1)
    conn = await asyncpg.connect(pg_dsn, server_settings={"search_path": "agentrun"})
    try:
        registration = conn.transaction()
        await registration.start()
        await PgCheckpointer._register_attempt_txn(conn, "t", 2, None)  # holds the thread row lock, not committed
        ledger = asyncio.create_task(checkpointer.ledger_put("t", "m:c", "charge", {"v": 1}, attempt=1))
        state = asyncio.create_task(checkpointer.aput("t", write(count=0), expected_version=0, attempt=1))
        await asyncio.sleep(0.3)
        assert not ledger.done() and not state.done(), "writes must wait for the registration in flight"
        await registration.commit()
        for task in (ledger, state):
            with pytest.raises(FencedError):
                await task
    finally:
        await conn.close()
    assert await checkpointer.ledger_get("t", "m:c") is None
    assert await checkpointer.aget("t") is None


async def test_a_stale_attempt_cannot_register_again_after_a_newer_one(checkpointer: PgCheckpointer) -> None:
    await checkpointer.register_attempt("t", 3)
    with pytest.raises(FencedError, match="STORAGE_FENCED_001"):
        await checkpointer.register_attempt("t", 2)
    await checkpointer.register_attempt("t", 3)  # the same attempt restarting in place is allowed
    progress = await checkpointer.ledger_put("t", "k", "tool", {"x": 1}, attempt=3)
    assert progress is True


async def test_progress_reports_version_node_step_status_and_outcome(checkpointer: PgCheckpointer) -> None:
    assert await checkpointer.aget_progress("t") is None
    await checkpointer.register_attempt("t", 2)
    await checkpointer.aput("t", write((0, user("a")), count=1), expected_version=0, attempt=2)
    await checkpointer.aput(
        "t",
        write(
            count=1,
            step=4,
            node="tools",
            status="failed",
            meta={"error": {"code": "NODE_ERROR_001", "message": "boom"}, "tool_calls": {"executed": 2}},
        ),
        expected_version=1,
        attempt=2,
    )
    progress = await checkpointer.aget_progress("t")
    assert progress is not None
    assert (progress.version, progress.current_node, progress.step, progress.status) == (2, "tools", 4, "failed")
    assert progress.attempt == 2 and progress.durable
    assert progress.error == {"code": "NODE_ERROR_001", "message": "boom"}
    assert progress.tool_calls == {"executed": 2}


async def test_deleting_a_thread_deletes_its_ledger_and_everything_else_by_cascade(
    pg_dsn: str, checkpointer: PgCheckpointer
) -> None:
    for thread in ("gone", "kept"):
        await checkpointer.register_attempt(thread, 1, run_uid=f"uid-{thread}")
        first = dataclasses.replace(write((0, user("a")), count=1, meta={"request_key": "r1"}), record_turn=True)
        await checkpointer.aput(thread, first, expected_version=0, attempt=1)
        await checkpointer.intent_put(thread, "m:c", "charge", "idem", attempt=1)
        await checkpointer.ledger_put(thread, "m:c", "charge", {"v": 1}, attempt=1)
        await checkpointer.request_stop(thread, "why")
        await checkpointer.put_run_inputs(thread, run_uid=f"uid-{thread}", attempt=1, input={"x": 1}, resume=None)
    await checkpointer.delete_thread("gone")
    tables = [
        "threads",
        "states",
        "messages",
        "tool_executions",
        "tool_intents",
        "stop_requests",
        "attempts",
        "thread_runs",
        "run_inputs",
        "turns",
    ]
    for table in tables:
        left = await fetch(pg_dsn, f"SELECT thread_id, count(*) AS n FROM {table} GROUP BY thread_id")
        assert {r["thread_id"]: r["n"] for r in left} == {"kept": 1}, f"{table} after deleting a thread: {left}"
    rules = await fetch(
        pg_dsn,
        "SELECT conrelid::regclass::text AS t, confdeltype::text FROM pg_constraint "
        "WHERE contype = 'f' AND confrelid = 'agentrun.threads'::regclass",
    )
    # LangGraph's tables (agentrun.integrations.langgraph) hang off threads too, by the same rule.
    assert sorted(r["t"] for r in rules) == sorted([*tables[1:], "lg_checkpoints", "lg_blobs", "lg_writes"]), rules
    assert {r["confdeltype"] for r in rules} == {"c"}, "every reference to threads must be ON DELETE CASCADE"


async def test_state_messages_and_ledger_results_read_back_exactly_as_written(
    pg_dsn: str, checkpointer: PgCheckpointer
) -> None:
    """A replay must hand the model the very text it saw: no key reordering, U+0000 kept (JSONB does neither)."""
    odd = {"zeta": 1, "alpha": {"y": 2, "b": [3, {"k2": None, "k1": "é\u0000"}]}, "mid": 1.5}
    await checkpointer.aput(
        "t", write((0, user("nul \u0000 inside")), count=1, values=odd, meta={"z": 1, "a": odd}), expected_version=0
    )
    assert await checkpointer.ledger_put("t", "m:c", "tool", {"__kind__": "raw", "value": odd})
    cp = await checkpointer.aget("t")
    assert cp is not None
    assert list(cp.values) == ["zeta", "alpha", "mid"] and cp.values == odd
    assert list(cp.values["alpha"]["b"][1]) == ["k2", "k1"], "nested key order changed"
    assert list(cp.meta) == ["z", "a"] and cp.meta["a"] == odd
    assert cp.messages[0].content == "nul \u0000 inside"
    entry = await checkpointer.ledger_get("t", "m:c")
    assert entry is not None and entry.result["value"] == odd, "a result holding U+0000 must be recorded whole"
    # The queryable JSONB copy is kept where JSONB can hold it (not with U+0000); the exact text always.
    assert await fetchval(pg_dsn, "SELECT result IS NULL AND result_text IS NOT NULL FROM tool_executions")
    ordered = {"zeta": 1, "alpha": {"y": 2, "b": 3}, "status": "ok"}
    assert await checkpointer.ledger_put("t", "m:d", "tool", {"__kind__": "raw", "value": ordered})
    entry = await checkpointer.ledger_get("t", "m:d")
    assert entry is not None and list(entry.result["value"]) == ["zeta", "alpha", "status"], (
        "the ledger reordered the recorded result's keys; a replay would show the model different text"
    )
    assert list(entry.result["value"]["alpha"]) == ["y", "b"]
    assert (
        await fetchval(pg_dsn, "SELECT result->'value'->>'status' FROM tool_executions WHERE tool_call_id = 'm:d'")
        == "ok"
    )


async def test_a_write_from_a_version_the_store_never_reached_is_stale_too(checkpointer: PgCheckpointer) -> None:
    await checkpointer.aput("t", write(count=0), expected_version=0)
    with pytest.raises(StaleStateError) as raised:
        await checkpointer.aput("t", write(count=0), expected_version=5)
    assert (raised.value.expected, raised.value.actual) == (5, 1), "a write must never leave a gap in versions"
    assert (await checkpointer.aget("t")).version == 1  # type: ignore[union-attr]
