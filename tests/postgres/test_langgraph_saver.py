"""``AgentrunSaver`` on PostgreSQL: LangGraph's conformance suite, fencing, outages (issue 23).

Guarantees protected: LangGraph's maintainers' suite accepts the saver on our
PostgreSQL store (every base and extended capability); a saver of a
superseded attempt cannot write a checkpoint or pending writes (``FencedError``,
nothing lands); an unreachable store ends in ``StoreUnavailableError`` after
the store's retry bound (the runner's exit 8), not a hang or a crash.
"""

from __future__ import annotations

import time
import uuid

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.errors import FencedError, StoreUnavailableError
from agentrun.integrations.langgraph import AgentrunSaver
from tests.support.langgraph_conformance import BASE, EXTENDED, failures, run_conformance


async def test_langgraph_conformance_suite_passes_on_the_postgres_store(pg_dsn: str) -> None:
    report = await run_conformance(
        "agentrun-postgres", lambda: PgCheckpointer(pg_dsn, schema=f"lg_{uuid.uuid4().hex[:10]}")
    )
    assert not failures(report, BASE), f"GUARANTEE BROKEN: LangGraph base capabilities fail: {failures(report, BASE)}"
    assert not failures(report, EXTENDED), f"LangGraph extended capabilities fail: {failures(report, EXTENDED)}"


async def test_a_superseded_attempt_cannot_write_langgraph_checkpoints_or_writes(pg_dsn: str) -> None:
    store = PgCheckpointer(pg_dsn)
    old = AgentrunSaver(store, attempt=1, run_uid="uid-a")
    new = AgentrunSaver(store, attempt=2, run_uid="uid-a")
    await old.setup()
    try:
        config = {"configurable": {"thread_id": "ns/t1", "checkpoint_ns": ""}}
        await store.register_attempt("ns/t1", 1, run_uid="uid-a")
        first = await old.aput(config, empty_checkpoint(), {"step": 0}, {})
        await store.register_attempt("ns/t1", 2, run_uid="uid-a")
        with pytest.raises(FencedError):
            await old.aput(first, empty_checkpoint(), {"step": 1}, {})
        with pytest.raises(FencedError):
            await old.aput_writes(first, [("messages", "late")], "task-1")
        latest = await new.aget_tuple(config)
        assert latest is not None and latest.config == first, "GUARANTEE BROKEN: a fenced checkpoint landed"
        assert latest.pending_writes == [], "GUARANTEE BROKEN: a fenced attempt's pending write landed"
        await new.aput(first, empty_checkpoint(), {"step": 1}, {})  # the owner writes on
    finally:
        await old.aclose()


async def test_an_unreachable_store_ends_in_store_unavailable_after_the_retry_bound() -> None:
    saver = AgentrunSaver(PgCheckpointer("postgresql://postgres@127.0.0.1:9/postgres", retry_timeout=1.0))
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError):
        await saver.aget_tuple({"configurable": {"thread_id": "t"}})
    # Its 1 s retry bound, not the default 60 s: a generous bound between.
    assert time.monotonic() - started < 30, "the outage bound was not applied"
    await saver.aclose()
