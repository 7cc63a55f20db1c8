"""``LedgerToolNode`` on PostgreSQL: the message's lookups and intent claims in one statement keep every ledger rule.

Guarantee protected (issue 34 item 1): on PostgreSQL a tool node looks up
every call of the message and claims the side-effect calls' intents in ONE
statement before the calls start (``LedgerToolNode._prefetch``). The rules
the separate lookup and claim kept hold through it: a recorded call replays
and never starts; an earlier start without a result is in doubt (policy
``report``: not run; ``interrupt``: a human decides, ``retry`` runs it with
the same idempotency key); a call that paused in ``interrupt()`` resumes,
not in doubt; a superseded attempt starts nothing (``FencedError``); a
call's interrupt leaves the node only once its siblings still running
returned and recorded their results (else the turn ended with a completed
charge unrecorded, in doubt on resume).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command, interrupt

from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.errors import FencedError
from agentrun.integrations.langgraph import AgentrunSaver, LedgerToolNode, current_idempotency_key

from .helpers import fetch

CALLS: list[tuple[str, str | None]] = []


@tool
async def charge_card(order_id: str) -> str:
    """Charge the card."""
    CALLS.append(("charge_card", current_idempotency_key()))
    return f"charged {order_id}"


@tool
async def lookup(order_id: str) -> str:
    """Look the order up."""
    CALLS.append(("lookup", current_idempotency_key()))
    return f"order {order_id}"


@tool
async def slow_charge(order_id: str) -> str:
    """Charge the card, slowly (a side effect that is still running when its sibling interrupts)."""
    await asyncio.sleep(0.5)
    CALLS.append(("slow_charge", current_idempotency_key()))
    return f"charged {order_id}"


@tool
async def approve(order_id: str) -> str:
    """Ask a human, then act (a side effect)."""
    answer = interrupt({"order": order_id})
    CALLS.append(("approve", current_idempotency_key()))
    return f"approved {order_id}: {answer}"


def model(state: MessagesState) -> dict[str, Any]:
    if isinstance(state["messages"][-1], HumanMessage):
        names = str(state["messages"][-1].content).split(",")
        calls = [{"id": f"c{i}", "name": n, "args": {"order_id": "7"}} for i, n in enumerate(names, 1)]
        return {"messages": [AIMessage(content="", id="ai-1", tool_calls=calls)]}
    return {"messages": [AIMessage(content="done", id="ai-2")]}


def graph(node: LedgerToolNode) -> Any:
    g = StateGraph(MessagesState)
    g.add_node("model", model)
    g.add_node("tools", node)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", tools_condition)
    g.add_edge("tools", "model")
    return g


class Statements:
    def __init__(self) -> None:
        self.queries: list[str] = []

    async def init(self, conn: Any) -> None:
        conn.add_query_logger(lambda record: self.queries.append(record.query))


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[tuple[PgCheckpointer, Statements]]:
    CALLS.clear()
    statements = Statements()
    pg = PgCheckpointer(pg_dsn, pool_options={"init": statements.init})
    await pg.setup()
    try:
        yield pg, statements
    finally:
        await pg.aclose()


def _tool_messages(values: dict[str, Any]) -> dict[str, ToolMessage]:
    return {m.name or "": m for m in values["messages"] if isinstance(m, ToolMessage)}


async def test_an_in_doubt_call_with_policy_report_is_not_run_and_its_sibling_runs(
    store: tuple[PgCheckpointer, Statements],
) -> None:
    pg, statements = store
    await pg.intent_put("t", "ai-1:c1", "charge_card", "ar-x")  # a previous attempt started it and died
    node = LedgerToolNode([charge_card, lookup], side_effects={"charge_card"}, in_doubt={"charge_card": "report"})
    app = graph(node).compile(checkpointer=AgentrunSaver(pg))
    values = await app.ainvoke({"messages": [HumanMessage("charge_card,lookup")]}, {"configurable": {"thread_id": "t"}})
    assert sum("WITH found AS" in q for q in statements.queries) == 1, "the message's lookups were not prefetched"
    assert [name for name, _ in CALLS] == ["lookup"], "GUARANTEE BROKEN: an in-doubt call with policy 'report' ran"
    messages = _tool_messages(values)
    assert messages["charge_card"].status == "error" and "In doubt" in str(messages["charge_card"].content)
    assert messages["lookup"].content == "order 7"


async def test_an_in_doubt_call_interrupts_and_retry_runs_it_with_the_same_key(
    store: tuple[PgCheckpointer, Statements],
) -> None:
    pg, _ = store
    await pg.intent_put("t", "ai-1:c1", "charge_card", "ar-x")
    app = graph(LedgerToolNode([charge_card], side_effects={"charge_card"})).compile(checkpointer=AgentrunSaver(pg))
    config: Any = {"configurable": {"thread_id": "t"}}
    first = await app.ainvoke({"messages": [HumanMessage("charge_card")]}, config)
    assert CALLS == [], "the in-doubt call ran before a human decided"
    (pending,) = first["__interrupt__"]
    assert pending.value["kind"] == "tool_in_doubt"
    values = await app.ainvoke(Command(resume="retry"), config)
    assert [("charge_card", pending.value["idempotency_key"])] == CALLS, "the retry did not run once with the same key"
    assert _tool_messages(values)["charge_card"].content == "charged 7"


async def test_a_recorded_call_replays_and_a_paused_one_resumes_without_being_in_doubt(
    store: tuple[PgCheckpointer, Statements],
) -> None:
    pg, _ = store
    node = LedgerToolNode([charge_card, approve], side_effects={"charge_card", "approve"})
    app = graph(node).compile(checkpointer=AgentrunSaver(pg))
    config: Any = {"configurable": {"thread_id": "t"}}
    first = await app.ainvoke({"messages": [HumanMessage("charge_card,approve")]}, config)
    assert [name for name, _ in CALLS] == ["charge_card"] and first["__interrupt__"]
    values = await app.ainvoke(Command(resume="yes"), config)
    assert [name for name, _ in CALLS] == ["charge_card", "approve"], (
        f"GUARANTEE BROKEN: the recorded call ran again or the paused one was taken for in doubt: {CALLS}"
    )
    assert _tool_messages(values)["approve"].content == "approved 7: yes"


async def test_a_superseded_attempt_starts_nothing(store: tuple[PgCheckpointer, Statements]) -> None:
    pg, _ = store
    await pg.register_attempt("t", 2)
    node = LedgerToolNode([charge_card, lookup], side_effects={"charge_card"}, handle_tool_errors=True)
    app = graph(node).compile(checkpointer=AgentrunSaver(pg, attempt=1))
    with pytest.raises(FencedError):
        await app.ainvoke({"messages": [HumanMessage("charge_card,lookup")]}, {"configurable": {"thread_id": "t"}})
    assert CALLS == [], f"GUARANTEE BROKEN: a fenced attempt started its tools: {CALLS}"
    intents = await pg.intent_get("t", "ai-1:c1")
    assert intents is None, "a fenced attempt recorded an intent"


async def test_an_interrupt_leaves_the_node_only_once_a_running_sibling_recorded_its_result(
    store: tuple[PgCheckpointer, Statements], pg_dsn: str
) -> None:
    pg, _ = store
    node = LedgerToolNode([slow_charge, approve], side_effects={"slow_charge", "approve"})
    app = graph(node).compile(checkpointer=AgentrunSaver(pg))
    config: Any = {"configurable": {"thread_id": "t"}}
    first = await app.ainvoke({"messages": [HumanMessage("slow_charge,approve")]}, config)
    assert first["__interrupt__"], "approve did not pause"
    recorded = await fetch(
        pg_dsn, "SELECT tool_name FROM tool_executions WHERE thread_id = 't' AND tool_call_id = 'ai-1:c1'"
    )
    assert [r["tool_name"] for r in recorded] == ["slow_charge"], (
        "GUARANTEE BROKEN: the turn paused while a charge that had started was still running, unrecorded"
    )
    values = await app.ainvoke(Command(resume="yes"), config)
    assert [name for name, _ in CALLS] == ["slow_charge", "approve"], f"the charge ran again or was in doubt: {CALLS}"
    assert _tool_messages(values)["slow_charge"].content == "charged 7"
