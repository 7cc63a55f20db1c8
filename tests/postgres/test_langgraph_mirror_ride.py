"""A LangGraph graph run as an AgentRun: its progress row rides in the next super-step's statement.

Guarantees protected (issue 34 item 1, "and the progress mirror when run as
an AgentRun"), on a real PostgreSQL:

- a turn of N super-steps whose nodes wait on nothing costs one commit per
  super-step, our progress row included (the mirror's row of step k goes in
  the statement of checkpoint k+1: they share a transaction id), plus the
  turn's opening and closing rows; before, every super-step cost two;
- a node that waits does not leave the progress stale: the row goes alone
  once the mirror's window passed, so ``kubectl get agentruns`` shows the
  node that is running while it runs;
- the ride's own failure (its version was taken) does not cost LangGraph its
  checkpoint: the checkpoint goes alone, and the mirror is told why.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, MessagesState, StateGraph

from agentrun.checkpoint.base import CheckpointWrite, Commit
from agentrun.checkpoint.cached import CachedStore
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.config import RunConfig
from agentrun.errors import StaleStateError
from agentrun.integrations.langgraph import AgentrunSaver, hold
from agentrun.integrations.langgraph import run as lg_run
from agentrun.integrations.langgraph.run import prepare, run_turn
from bench.langgraph_saver import step_graph

from .conftest import cached_store
from .helpers import fetch


@dataclass
class _NoPreemption:
    requested: bool = False
    cancel_now: bool = False


async def _turn(store: PgCheckpointer | CachedStore, graph: StateGraph[MessagesState], thread_id: str) -> None:
    status, _ = await run_turn(
        prepare(graph, "test:graph"),
        store=store,
        cfg=RunConfig.from_any({"thread_id": thread_id, "run_uid": "uid-1"}),
        payload={"messages": [{"role": "user", "content": "go"}]},
        existing=None,
        preemption=_NoPreemption(),
    )
    assert status == "completed"


@pytest.mark.parametrize("cache", [False, True], ids=["postgres", "postgres+redis"])
async def test_a_turn_costs_one_commit_per_super_step_progress_row_included(
    pg_dsn: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, cache: bool
) -> None:
    # Windows far above any scheduling delay: the count must not hinge on the machine's load.
    monkeypatch.setattr(lg_run, "MIRROR_WINDOW", 0.5)
    monkeypatch.setattr(hold, "WRITE_HOLD_WINDOW", 0.5)
    store: PgCheckpointer | CachedStore = cached_store(pg_dsn, redis_prefix) if cache else PgCheckpointer(pg_dsn)
    thread_id = f"ride-{uuid.uuid4().hex[:8]}"
    try:
        await store.setup()
        await _turn(store, step_graph(6), thread_id)
        if isinstance(store, CachedStore):
            # The cache followed every row, riding ones included: it advances only from the version it holds.
            head = await store.inner.ahead(thread_id)
            assert head is not None
            cached = await store.cache.get(thread_id, head.incarnation, head.version)
            assert cached is not None and cached.status == "completed", "the hot cache lost track of the rows"
    finally:
        await store.aclose()
    rows = await fetch(
        pg_dsn,
        """
        SELECT 'c' AS kind, xmin::text AS x FROM lg_checkpoints WHERE thread_id = $1
        UNION ALL SELECT 'w', xmin::text FROM lg_writes WHERE thread_id = $1
        UNION ALL SELECT 'b', xmin::text FROM lg_blobs WHERE thread_id = $1
        UNION ALL SELECT 's', xmin::text FROM states WHERE thread_id = $1
        """,
        thread_id,
    )
    checkpoints = {r["x"] for r in rows if r["kind"] == "c"}
    states = [r["x"] for r in rows if r["kind"] == "s"]
    commits = {r["x"] for r in rows}
    assert len(checkpoints) == 8  # the input's, the first (empty) step's, and six steps
    # Our rows: the turn's opening one, one per checkpoint after the first (each carried by the next), the end.
    assert len(states) == len(checkpoints) + 1
    riding = [x for x in states if x in checkpoints]
    assert len(riding) == len(checkpoints) - 1, (
        f"GUARANTEE BROKEN: {len(riding)} of {len(states)} progress rows went in a super-step's statement "
        f"({len(checkpoints) - 1} expected)"
    )
    assert len(commits) == len(checkpoints) + 2, (
        f"GUARANTEE BROKEN: {len(checkpoints)} super-steps took {len(commits)} commits "
        f"(one each, and the turn's first and last rows)"
    )


async def test_a_waiting_node_shows_as_running_while_it_waits(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lg_run, "MIRROR_WINDOW", 0.05)
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow(state: MessagesState) -> dict[str, Any]:
        started.set()
        await release.wait()
        return {"messages": [AIMessage(content="done")]}

    graph = StateGraph(MessagesState)
    graph.add_node("first", lambda state: {"messages": [AIMessage(content="one")]})
    graph.add_node("slow", slow)
    graph.add_edge(START, "first")
    graph.add_edge("first", "slow")
    graph.add_edge("slow", END)
    store = PgCheckpointer(pg_dsn)
    thread_id = f"slow-{uuid.uuid4().hex[:8]}"
    turn = asyncio.ensure_future(_turn(store, graph, thread_id))
    try:
        await asyncio.wait_for(started.wait(), 30)
        seen = None
        for _ in range(300):  # the row goes within the window once the node waits; bounded, not timed
            progress = await store.aget_progress(thread_id)
            seen = None if progress is None else progress.current_node
            if seen == "slow":
                break
            await asyncio.sleep(0.05)
        assert seen == "slow", f"GUARANTEE BROKEN: while 'slow' waited the progress showed {seen!r}"
        release.set()
        await asyncio.wait_for(turn, 30)
        progress = await store.aget_progress(thread_id)
        assert progress is not None and progress.status == "completed"
    finally:
        release.set()
        await asyncio.gather(turn, return_exceptions=True)
        await store.aclose()


@dataclass
class _Ride:
    thread_id: str
    write: CheckpointWrite
    expected_version: int
    attempt: int | None = None
    run_uid: str | None = None
    commit: Commit | None = None
    error: BaseException | None = None
    calls: int = 0

    def landed(self, commit: Commit | None, error: BaseException | None) -> None:
        self.calls += 1
        self.commit, self.error = commit, error


def _row(node: str) -> CheckpointWrite:
    return CheckpointWrite(
        values={}, current_node=node, step=1, status="running", meta={}, message_count=0, changed=frozenset()
    )


async def test_a_ride_that_cannot_land_leaves_the_checkpoint_to_go_alone(pg_dsn: str) -> None:
    store = PgCheckpointer(pg_dsn)
    saver = AgentrunSaver(store)
    thread_id = f"stale-{uuid.uuid4().hex[:8]}"
    try:
        await store.aput(thread_id, _row("a"), expected_version=0)
        stale = _Ride(thread_id, _row("b"), expected_version=0)  # version 1 is taken: the ride must fail
        saver.rider = lambda thread: stale if thread == thread_id else None
        config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        stored = await saver.aput(config, empty_checkpoint(), {"step": -1}, {})
        assert stale.calls == 1 and isinstance(stale.error, StaleStateError), "the mirror was not told"
        assert await saver.aget_tuple(stored) is not None, "GUARANTEE BROKEN: the checkpoint was lost with its ride"
        fresh = _Ride(thread_id, _row("c"), expected_version=1)
        saver.rider = lambda thread: fresh if thread == thread_id else None
        again = await saver.aput(stored, empty_checkpoint(), {"step": 0}, {})
        assert fresh.calls == 1 and fresh.commit is not None and fresh.commit.version == 2
        assert await saver.aget_tuple(again) is not None
        progress = await store.aget_progress(thread_id)
        assert progress is not None and (progress.version, progress.current_node) == (2, "c")
        rows = await fetch(
            pg_dsn,
            "SELECT (SELECT xmin::text FROM states WHERE thread_id = $1 AND version = 2) AS s,"
            " (SELECT xmin::text FROM lg_checkpoints WHERE thread_id = $1 AND checkpoint_id = $2) AS c",
            thread_id,
            again["configurable"]["checkpoint_id"],
        )
        assert rows[0]["s"] == rows[0]["c"], "the row and the checkpoint were not one commit"
    finally:
        await store.aclose()
