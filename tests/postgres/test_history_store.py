"""The run history read from a real PostgreSQL store (checkpoint.pg_history, agentrun_history.store).

A real graph with a ledgered side-effect tool runs on PgCheckpointer; the history server's store reads
it back in one snapshot and ``agentrun.history.build`` shows each tool call executed once, with its
intent's duration and idempotency key; its live views are woken by the store's own progress
notification (``ProgressHub`` on ``agentrun_progress``), not only by polling.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest

from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.history import build
from agentrun_history.store import HistoryStore, ProgressHub

pytestmark = pytest.mark.postgres


async def test_a_finished_run_reads_back_as_its_history(
    pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUPPORT_EFFECTS_DB", str(tmp_path / "effects.db"))
    from examples.support_agent import graph

    store = PgCheckpointer(pg_dsn)
    try:
        app = graph.compile(store)
        text = "charge my saved card for order 4821"
        config = {"thread_id": "default/h-1", "attempt": 1, "run_uid": "uid-1"}
        await app.ainvoke({"messages": [{"role": "user", "content": text}]}, config)
    finally:
        await store.aclose()
    reader = HistoryStore(pg_dsn)
    try:
        rows = await reader.rows("default/h-1", "uid-1")
        other = await reader.rows("default/h-1", "another-run")
    finally:
        await reader.aclose()
    history = build(rows, namespace="default", name="h-1", uid="uid-1", thread_id="default/h-1")
    assert history.status == "completed" and history.recorded
    assert [c.name for c in history.tool_calls] == ["lookup_order", "charge_card", "send_receipt"]
    assert {c.outcome for c in history.tool_calls} == {"executed"}
    assert all(c.attempt == 1 and c.replayed_in == [] for c in history.tool_calls)
    charge = history.tool_calls[1]
    assert charge.duration_from == "intent" and charge.duration_seconds is not None
    assert charge.idempotency_key and charge.idempotency_key.startswith("ar-")
    assert charge.result is not None and "succeeded" in charge.result.preview
    assert [a.attempt for a in history.attempts] == [1] and history.attempts[0].steps == len(history.steps)
    assert not other.states, "rows of another AgentRun on the thread are not its history"


async def test_the_progress_hub_is_woken_by_the_stores_notification(pg_dsn: str) -> None:
    runner_store = PgCheckpointer(pg_dsn)
    await runner_store.setup()  # the schema, as a runner makes it
    await runner_store.aclose()
    hub = ProgressHub(pg_dsn)
    hub.start()
    try:
        woken = hub.subscribe("default/h-2")
        for _ in range(100):
            if hub.listening:
                break
            await asyncio.sleep(0.05)
        assert hub.listening
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute("SELECT pg_notify('agentrun_progress', 'default/other')")
            await conn.execute("SELECT pg_notify('agentrun_progress', 'default/h-2')")
        finally:
            await conn.close()
        await asyncio.wait_for(woken.wait(), 5)
        hub.unsubscribe("default/h-2", woken)
    finally:
        await hub.aclose()
