"""A LangGraph super-step on ``AgentrunSaver`` is one statement and one commit; a tool iteration's ledger is coalesced.

Guarantees protected (issue 34 item 1), counted on a real PostgreSQL:

- every super-step of a LangGraph graph (``durability="sync"``) costs ONE
  statement and ONE commit on our store: the tasks' pending writes ride in
  the statement of the checkpoint after them (rows inserted by one
  transaction share their ``xmin``, so the tables themselves tell how many
  commits wrote them), and ``aput_writes`` has returned only once they were
  stored;
- a task's writes are never lost to the hold when no checkpoint follows:
  held past the window they are stored on their own, and special writes
  (an interrupt) are stored before ``aput_writes`` returns;
- ``LedgerToolNode``'s parallel calls cost one statement before they start
  (every call's ledger lookup and the side-effect calls' intent claims; no
  intent read per call) and one commit for the results that finish together
  (``checkpoint.group``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import interrupt

from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.integrations.langgraph import AgentrunSaver, LedgerToolNode
from bench.langgraph_saver import step_graph

from .helpers import fetch


class Statements:
    """Every statement the store's connections run (asyncpg's query logger): one round trip each."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    async def init(self, conn: Any) -> None:
        conn.add_query_logger(lambda record: self.queries.append(record.query))

    def count(self, fragment: str) -> int:
        return sum(fragment in q for q in self.queries)


@pytest.fixture
async def counted(pg_dsn: str) -> AsyncIterator[tuple[PgCheckpointer, Statements]]:
    statements = Statements()
    # A window far above any scheduling delay: the group commit asserted below must not hinge on the load.
    store = PgCheckpointer(pg_dsn, ledger_group_window=0.5, pool_options={"init": statements.init})
    await store.setup()
    try:
        yield store, statements
    finally:
        await store.aclose()


async def _run(app: Any, statements: Statements) -> tuple[int, str]:
    """Statements of one run on a fresh thread, and the thread."""
    before = len(statements.queries)
    thread_id = f"t-{uuid.uuid4().hex[:8]}"
    await app.ainvoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": thread_id}}, durability="sync")
    return len(statements.queries) - before, thread_id


async def _commits(dsn: str, thread_id: str) -> tuple[int, int]:
    """(checkpoints, distinct transactions that wrote the thread's checkpoints, blobs and pending writes)."""
    rows = await fetch(
        dsn,
        """
        SELECT 'c' AS kind, xmin::text AS x FROM lg_checkpoints WHERE thread_id = $1
        UNION ALL SELECT 'w', xmin::text FROM lg_writes WHERE thread_id = $1
        UNION ALL SELECT 'b', xmin::text FROM lg_blobs WHERE thread_id = $1
        """,
        thread_id,
    )
    return sum(r["kind"] == "c" for r in rows), len({r["x"] for r in rows})


async def test_a_super_step_is_one_statement_and_one_commit(
    counted: tuple[PgCheckpointer, Statements], pg_dsn: str
) -> None:
    store, statements = counted
    saver = AgentrunSaver(store, hold_writes=0.5)  # far above any scheduling delay: the count must not hinge on load
    short, long = step_graph(3).compile(checkpointer=saver), step_graph(9).compile(checkpointer=saver)
    await _run(short, statements)  # warm: the pool and its prepared statements
    del statements.queries[:]
    for app in (short, long):
        count, thread_id = await _run(app, statements)
        checkpoints, _ = await _commits(pg_dsn, thread_id)
        # The opening read of the thread's latest checkpoint (BEGIN, SELECT, COMMIT), then one per super-step.
        assert count == checkpoints + 3, (
            f"GUARANTEE BROKEN: {checkpoints} checkpoints took {count - 3} statements (one each expected)"
        )
    assert statements.count("agentrun_lg_put_writes") == 0, "a task's writes went in a statement of their own"
    config: Any = {"configurable": {"thread_id": "counted"}}
    await long.ainvoke({"messages": [HumanMessage("go")]}, config, durability="sync")
    checkpoints, commits = await _commits(pg_dsn, "counted")
    assert checkpoints == 11  # the input's, the first (empty) step's, and 9 steps
    assert commits == checkpoints, f"GUARANTEE BROKEN: {checkpoints} checkpoints took {commits} commits"
    writes = await fetch(pg_dsn, "SELECT count(*) AS n FROM lg_writes WHERE thread_id = 'counted'")
    assert writes[0]["n"] >= 9, "the tasks' pending writes were not stored with their checkpoints"


async def test_writes_no_checkpoint_takes_are_stored_alone_once_the_window_passed(pg_dsn: str) -> None:
    store = PgCheckpointer(pg_dsn)
    saver = AgentrunSaver(store, hold_writes=0.05)
    try:
        config: Any = {"configurable": {"thread_id": "alone", "checkpoint_ns": ""}}
        first = await saver.aput(config, empty_checkpoint(), {"step": 0}, {})
        started = time.monotonic()
        await saver.aput_writes(first, [("messages", "held")], "task-1", "~__pregel_pull, step")
        assert time.monotonic() - started >= 0.04, "regular writes were not held for the checkpoint after them"
        stored = await saver.aget_tuple(first)
        assert stored is not None and stored.pending_writes == [("task-1", "messages", "held")], (
            "GUARANTEE BROKEN: aput_writes returned before its held writes were stored"
        )
        started = time.monotonic()
        await saver.aput_writes(first, [("__interrupt__", "ask")], "task-2", "~__pregel_pull, step")
        assert time.monotonic() - started < 0.04, "an interrupt's write waited in the hold"
        stored = await saver.aget_tuple(first)
        assert stored is not None and ("task-2", "__interrupt__", "ask") in (stored.pending_writes or [])
    finally:
        await store.aclose()


async def test_an_interrupt_is_stored_before_the_graph_returns_it(pg_dsn: str) -> None:
    def ask(state: MessagesState) -> dict[str, Any]:
        answer = interrupt("approve?")
        return {"messages": [AIMessage(content=f"answer {answer}")]}

    graph = StateGraph(MessagesState)
    graph.add_node("ask", ask)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", END)
    store = PgCheckpointer(pg_dsn)
    try:
        app = graph.compile(checkpointer=AgentrunSaver(store, hold_writes=5.0))  # a hold far longer than the test
        config: Any = {"configurable": {"thread_id": "asks"}}
        out = await app.ainvoke({"messages": [HumanMessage("go")]}, config, durability="sync")
        assert out["__interrupt__"], "the graph did not pause"
        rows = await fetch(pg_dsn, "SELECT channel FROM lg_writes WHERE thread_id = 'asks'")
        assert "__interrupt__" in {r["channel"] for r in rows}, (
            "GUARANTEE BROKEN: the interrupt was shown before its write was stored"
        )
    finally:
        await store.aclose()


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool
async def charge(key: str) -> str:
    """Charge (a side effect)."""
    return f"charged {key}"


@tool
async def notify(key: str) -> str:
    """Notify (a side effect)."""
    return f"notified {key}"


def _tools_graph(iterations: int) -> StateGraph[MessagesState]:
    def model(state: MessagesState) -> dict[str, Any]:
        done = sum(1 for m in state["messages"] if m.type == "ai")
        if done >= iterations:
            return {"messages": [AIMessage("done")]}
        calls = [{"id": f"c{done}_{n}", "name": n, "args": {"key": f"k{done}"}} for n in ("lookup", "charge", "notify")]
        return {"messages": [AIMessage("", tool_calls=calls)]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", LedgerToolNode([lookup, charge, notify], side_effects={"charge", "notify"}))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph


async def test_a_tool_iteration_looks_up_claims_and_records_once_per_message(
    counted: tuple[PgCheckpointer, Statements], pg_dsn: str
) -> None:
    store, statements = counted
    saver = AgentrunSaver(store, hold_writes=0.5)
    one, three = _tools_graph(1).compile(checkpointer=saver), _tools_graph(3).compile(checkpointer=saver)
    await _run(one, statements)  # warm
    mark = len(statements.queries)
    _, thread = await _run(three, statements)
    measured = statements.queries[mark:]

    def count(fragment: str) -> int:
        return sum(fragment in q for q in measured)

    per_message = {
        "lookups with claims": count("WITH found AS"),
        "intent claims": count("agentrun_claim_intents"),
        "result commits": count("agentrun_put_tool_results"),
    }
    assert per_message == dict.fromkeys(per_message, 3), (
        f"three messages of three parallel calls each took {per_message}: one statement of each per message expected"
    )
    alone = count("tool_call_id = ANY") + count("tool_call_id = $2") - per_message["lookups with claims"]
    assert alone == 0, f"{alone} ledger lookups outside the message's one statement"
    assert count("FROM tool_intents WHERE") == 0, "an intent was read call by call"
    assert count("agentrun_put_tool_row") == 0, "a result was recorded alone"
    checkpoints, _ = await _commits(pg_dsn, thread)
    assert count("agentrun_lg_put") == checkpoints and count("agentrun_lg_put_writes") == 0, (
        "a super-step of the tool loop took more than its checkpoint's statement"
    )
    rows = await fetch(pg_dsn, "SELECT xmin::text AS x, tool_call_id FROM tool_executions WHERE thread_id = $1", thread)
    by_message: dict[str, set[str]] = {}
    for r in rows:
        by_message.setdefault(r["tool_call_id"].split("_")[0].split(":")[-1], set()).add(r["x"])
    assert len(rows) == 9 and all(len(x) == 1 for x in by_message.values()), (
        f"GROUP COMMIT BROKEN: a message's three results took several commits: {by_message}"
    )
    intents = await fetch(pg_dsn, "SELECT xmin::text AS x, tool_call_id FROM tool_intents WHERE thread_id = $1", thread)
    assert len(intents) == 6 and len({r["x"] for r in intents}) == 3, (
        "the side-effect calls' intents were not claimed together"
    )
