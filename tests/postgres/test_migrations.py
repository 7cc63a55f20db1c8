"""Schema migrations: from empty, from every earlier version, two processes at once, and a failing step."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import asyncpg
import pytest

from agentrun import StorageError
from agentrun.checkpoint.pg_schema import MIGRATIONS, Migration, MigrationError, apply_migrations, lock_key
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.messages import user
from tests.support.checkpointers import write

from .helpers import drive, fetch, fetchval, spawn, wait_until

TABLES = {
    "agentrun_migrations",
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
    "lg_checkpoints",  # migration 13: AgentrunSaver (agentrun.integrations.langgraph)
    "lg_blobs",
    "lg_writes",
}


async def connect(dsn: str) -> asyncpg.Connection:
    return await asyncpg.connect(dsn, server_settings={"search_path": "agentrun"})


async def tables(dsn: str) -> set[str]:
    rows = await fetch(dsn, "SELECT tablename::text FROM pg_tables WHERE schemaname = 'agentrun'")
    return {r["tablename"] for r in rows}


async def test_an_empty_database_gets_the_whole_schema_at_the_latest_version(pg_dsn: str) -> None:
    cp = PgCheckpointer(pg_dsn)
    try:
        await cp.setup()
    finally:
        await cp.aclose()
    assert await tables(pg_dsn) == TABLES
    versions = [r["version"] for r in await fetch(pg_dsn, "SELECT version FROM agentrun_migrations ORDER BY 1")]
    assert versions == list(range(1, len(MIGRATIONS) + 1))


def legacy_rows(version: int) -> list[str]:
    """Rows a live system at schema ``version`` would hold (raw SQL of that version)."""
    rows: list[str] = []
    if version >= 1:
        old_message = user("from the old schema")
        message = json.dumps(old_message.to_json())
        rows += [
            "INSERT INTO threads (thread_id) VALUES ('old')",
            "INSERT INTO states (thread_id, version, current_node, step, status, state_values, meta, message_count) "
            "VALUES ('old', 1, 'tools', 1, 'running', '{\"n\": 1}', '{}', 1)",
            "INSERT INTO messages (thread_id, idx, message_id, body, version) "
            f"VALUES ('old', 0, '{old_message.id}', '{message}', 1)",
        ]
    if version >= 2:
        rows.append(
            "INSERT INTO tool_executions (thread_id, tool_call_id, tool_name, result) "
            "VALUES ('old', 'm:call_1', 'charge', '{\"__kind__\": \"raw\", \"value\": 7}')"
        )
    if version >= 3:
        rows.append(
            "INSERT INTO tool_intents (thread_id, tool_call_id, tool_name, idempotency_key) "
            "VALUES ('old', 'm:call_2', 'charge', 'idem')"
        )
    return rows


@pytest.mark.parametrize("start", range(len(MIGRATIONS)), ids=lambda v: f"from-v{v}")
async def test_a_database_at_an_earlier_schema_version_upgrades_and_keeps_its_data(pg_dsn: str, start: int) -> None:
    conn = await connect(pg_dsn)
    try:
        assert await apply_migrations(conn, MIGRATIONS[:start], schema="agentrun") == list(range(1, start + 1))
        for statement in legacy_rows(start):
            await conn.execute(statement)
    finally:
        await conn.close()

    cp = PgCheckpointer(pg_dsn)
    try:
        await cp.setup()
        assert await fetchval(pg_dsn, "SELECT max(version) FROM agentrun_migrations") == len(MIGRATIONS)
        assert await tables(pg_dsn) == TABLES
        if start >= 1:
            old = await cp.aget("old")
            assert old is not None and old.version == 1 and old.values == {"n": 1}
            assert [m.content for m in old.messages] == ["from the old schema"]
            assert await cp.aput("old", write(count=1, step=2), expected_version=1, attempt=1) == 2
        if start >= 2:
            entry = await cp.ledger_get("old", "m:call_1")
            assert entry is not None and entry.result == {"__kind__": "raw", "value": 7}
        if start >= 3:
            assert await cp.intent_get("old", "m:call_2") is not None
        # Everything the latest schema offers works on the upgraded database.
        await cp.register_attempt("new", 2)
        await cp.aput("new", write((0, user("x")), count=1), expected_version=0, attempt=2)
        assert await cp.ledger_put("new", "k", "tool", {"v": 1}, attempt=2)
        await cp.request_stop("new", "r")
        assert await cp.stop_requested("new") == "r"
    finally:
        await cp.aclose()


async def test_two_processes_migrating_at_once_produce_one_schema_without_error(
    pg_dsn: str, subprocess_env: dict[str, str]
) -> None:
    holder = await connect(pg_dsn)
    try:
        # Hold the migration lock so both processes pass the fast path and queue on the lock together.
        await holder.execute("SELECT pg_advisory_lock($1)", lock_key("agentrun"))
        cmd = [sys.executable, "-m", "tests.postgres.workers", "migrate", pg_dsn]
        processes = [await spawn(subprocess_env, cmd) for _ in range(2)]

        async def both_waiting() -> bool:
            waiting = await holder.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            return bool(waiting == 2)

        await wait_until(both_waiting, what="both migrators to wait on the advisory lock")
        await holder.execute("SELECT pg_advisory_unlock($1)", lock_key("agentrun"))
    finally:
        await holder.close()
    outputs = [await asyncio.wait_for(p.communicate(), 30) for p in processes]
    applied = []
    for process, (stdout, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, f"a concurrent migrator failed:\n{stderr.decode()}"
        applied.append(json.loads(stdout.decode().strip().splitlines()[-1])["applied"])
    # Each step takes the lock in its own transaction, so the two may take turns: every step once.
    assert sorted(applied[0] + applied[1]) == list(range(1, len(MIGRATIONS) + 1)), (
        f"every migration must be applied by exactly one of the two processes: {applied}"
    )
    assert await tables(pg_dsn) == TABLES
    assert await fetchval(pg_dsn, "SELECT count(*) FROM agentrun_migrations") == len(MIGRATIONS)


async def test_two_processes_starting_together_without_help_both_succeed(
    pg_dsn: str, subprocess_env: dict[str, str]
) -> None:
    cmd = [sys.executable, "-m", "tests.postgres.workers", "migrate", pg_dsn]
    runs = await asyncio.gather(drive(subprocess_env, cmd), drive(subprocess_env, cmd))
    for run in runs:
        assert run.returncode == 0, str(run)
    assert await fetchval(pg_dsn, "SELECT count(*) FROM agentrun_migrations") == len(MIGRATIONS)


async def test_a_failed_migration_leaves_the_version_and_the_schema_unchanged(pg_dsn: str) -> None:
    cp = PgCheckpointer(pg_dsn)
    await cp.setup()
    await cp.aput("t", write((0, user("a")), count=1), expected_version=0)
    await cp.aclose()
    broken = Migration("half done", "CREATE TABLE half_done (x int); ALTER TABLE states ADD COLUMN y int; SELECT 1/0")
    conn = await connect(pg_dsn)
    try:
        with pytest.raises(MigrationError, match=f"stays at version {len(MIGRATIONS)}"):
            await apply_migrations(conn, [*MIGRATIONS, broken], schema="agentrun")
        assert await conn.fetchval("SELECT max(version) FROM agentrun_migrations") == len(MIGRATIONS)
        assert await conn.fetchval("SELECT to_regclass('half_done')") is None, "a failed step left a table behind"
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM information_schema.columns WHERE table_name = 'states' AND column_name = 'y'"
            )
            == 0
        ), "a failed step left a column behind"
        held = await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        assert held == 0, "a failed migration must release the migration lock"
    finally:
        await conn.close()
    cp = PgCheckpointer(pg_dsn)
    try:
        await cp.setup()
        assert (await cp.aget("t")).version == 1  # type: ignore[union-attr]
    finally:
        await cp.aclose()


async def test_a_current_schema_is_set_up_without_waiting_for_the_migration_lock(pg_dsn: str) -> None:
    first = PgCheckpointer(pg_dsn)
    await first.setup()
    await first.aclose()
    holder = await connect(pg_dsn)
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", lock_key("agentrun"))
        # The lock stays held throughout: a setup that waited for it would wait its whole lock_timeout (120 s),
        # so returning at all is the proof; no clock needed.
        second = PgCheckpointer(pg_dsn, lock_timeout=120)
        try:
            await asyncio.wait_for(second.setup(), 30)
        except TimeoutError:
            raise AssertionError("setup on a current schema waited for the migration lock") from None
        finally:
            await second.aclose()
    finally:
        await holder.close()


async def test_setup_waits_for_a_hung_migrator_at_most_lock_timeout_then_fails_cleanly(pg_dsn: str) -> None:
    holder = await connect(pg_dsn)
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", lock_key("agentrun"))  # a migrator that hangs
        waiting = PgCheckpointer(pg_dsn, lock_timeout=1.0)
        started = time.monotonic()
        try:
            with pytest.raises(StorageError, match="lock timeout"):
                await asyncio.wait_for(waiting.setup(), 60)
        finally:
            await waiting.aclose()
        # Bounded by its 1 s lock_timeout, not the migrator (which never lets go): a generous bound between.
        assert time.monotonic() - started < 15
    finally:
        await holder.close()
    assert await tables(pg_dsn) == set(), "a migrator that gave up must leave nothing behind"
