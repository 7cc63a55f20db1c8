"""``LedgerToolNode`` policies on a real SQLite store, in process (issue 23).

Guarantees protected: a side-effect call that started but never returned is
in doubt and gets its policy (``report``: not run, the model is told;
``interrupt``: LangGraph ``interrupt()`` until a human answers ``retry``, then it
runs with the SAME idempotency key); a superseded attempt's tool node stops
with ``FencedError`` even when ``handle_tool_errors=True`` would turn errors
into messages; a tool past its deadline is a ``NODE_TIMEOUT_002`` error
message, not a hung run; the sync API (``invoke``) replays from the ledger too;
a graph compiled with another checkpointer is refused.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from agentrun.checkpoint import SqliteCheckpointer
from agentrun.errors import FencedError
from agentrun.integrations.langgraph import AgentrunSaver, LedgerToolNode, current_idempotency_key

CALLS: list[tuple[str, str | None]] = []


@tool
async def charge_card(order_id: str) -> str:
    """Charge the card."""
    CALLS.append(("charge_card", current_idempotency_key()))
    return f"charged {order_id}"


@tool
def charge_card_sync(order_id: str) -> str:
    """Charge the card (a sync tool)."""
    CALLS.append(("charge_card_sync", current_idempotency_key()))
    return f"charged {order_id}"


@tool
async def slow(order_id: str) -> str:
    """Never returns in time."""
    await asyncio.sleep(30)
    return "late"


def model(state: MessagesState) -> dict[str, Any]:
    if isinstance(state["messages"][-1], HumanMessage):
        name = str(state["messages"][-1].content)
        return {
            "messages": [
                AIMessage(content="", id="ai-1", tool_calls=[{"id": "c1", "name": name, "args": {"order_id": "7"}}])
            ]
        }
    return {"messages": [AIMessage(content="done", id="ai-2")]}


def graph(node: LedgerToolNode) -> StateGraph[MessagesState]:
    g = StateGraph(MessagesState)
    g.add_node("model", model)
    g.add_node("tools", node)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", tools_condition)
    g.add_edge("tools", "model")
    return g


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    CALLS.clear()


async def _saver(tmp_path: Path, **kwargs: Any) -> AgentrunSaver:
    saver = AgentrunSaver(SqliteCheckpointer(tmp_path / "agentrun.db"), **kwargs)
    await saver.setup()
    return saver


def _tool_message(values: dict[str, Any]) -> ToolMessage:
    return next(m for m in values["messages"] if isinstance(m, ToolMessage))


async def test_an_in_doubt_call_with_policy_report_is_not_run_again(tmp_path: Path) -> None:
    saver = await _saver(tmp_path)
    try:
        # The previous attempt recorded its intent and died before the result was recorded.
        await saver.store.intent_put("t", "ai-1:c1", "charge_card", "ar-x")
        node = LedgerToolNode([charge_card], side_effects={"charge_card"}, in_doubt={"charge_card": "report"})
        values = (
            await graph(node)
            .compile(checkpointer=saver)
            .ainvoke({"messages": [HumanMessage("charge_card")]}, {"configurable": {"thread_id": "t"}})
        )
        message = _tool_message(values)
        assert CALLS == [], "GUARANTEE BROKEN: an in-doubt call with policy 'report' ran again"
        assert message.status == "error" and "In doubt" in str(message.content)
    finally:
        await saver.aclose()


async def test_an_in_doubt_call_interrupts_and_retry_runs_it_with_the_same_key(tmp_path: Path) -> None:
    saver = await _saver(tmp_path)
    try:
        await saver.store.intent_put("t", "ai-1:c1", "charge_card", "ar-x")
        node = LedgerToolNode([charge_card], side_effects={"charge_card"})
        app = graph(node).compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": "t"}}
        first = await app.ainvoke({"messages": [HumanMessage("charge_card")]}, config)
        assert CALLS == [], "the in-doubt call ran before a human decided"
        (pending,) = first["__interrupt__"]
        assert pending.value["kind"] == "tool_in_doubt" and pending.value["tool"] == "charge_card"
        values = await app.ainvoke(Command(resume="retry"), config)
        assert [name for name, _ in CALLS] == ["charge_card"]
        assert CALLS[0][1] == pending.value["idempotency_key"], "the retry did not reuse the idempotency key"
        assert _tool_message(values).content == "charged 7"
    finally:
        await saver.aclose()


async def test_a_superseded_attempt_stops_with_fenced_error_even_with_handle_tool_errors(tmp_path: Path) -> None:
    saver = await _saver(tmp_path, attempt=1)
    try:
        await saver.store.register_attempt("t", 2)
        node = LedgerToolNode([charge_card], side_effects={"charge_card"}, handle_tool_errors=True)
        with pytest.raises(FencedError):
            await (
                graph(node)
                .compile(checkpointer=saver)
                .ainvoke({"messages": [HumanMessage("charge_card")]}, {"configurable": {"thread_id": "t"}})
            )
        assert CALLS == [], "GUARANTEE BROKEN: a fenced attempt started a side effect"
    finally:
        await saver.aclose()


async def test_a_tool_past_its_deadline_is_a_timeout_message(tmp_path: Path) -> None:
    saver = await _saver(tmp_path)
    try:
        node = LedgerToolNode([slow], timeouts={"slow": 0.2})
        values = (
            await graph(node)
            .compile(checkpointer=saver)
            .ainvoke({"messages": [HumanMessage("slow")]}, {"configurable": {"thread_id": "t"}})
        )
        message = _tool_message(values)
        assert message.status == "error" and "NODE_TIMEOUT_002" in str(message.content)
    finally:
        await saver.aclose()


def test_the_sync_api_replays_recorded_calls(tmp_path: Path) -> None:
    saver = AgentrunSaver(SqliteCheckpointer(tmp_path / "agentrun.db"))
    node = LedgerToolNode([charge_card_sync], side_effects={"charge_card_sync"})
    app = graph(node).compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "t"}}
    # A sync graph: setup and the ledger run on agentrun's blocking loop.
    from agentrun import blocking

    blocking.run(saver.setup, caller="setup")
    values = app.invoke({"messages": [HumanMessage("charge_card_sync")]}, config)
    assert _tool_message(values).content == "charged 7" and len(CALLS) == 1
    assert CALLS[0][1] is not None and CALLS[0][1].startswith("ar-"), "the sync tool got no idempotency key"
    # Replay the tool node from the checkpoint before it (time travel): the ledger answers.
    before_tools = next(s for s in app.get_state_history(config) if s.next == ("tools",))
    app.invoke(None, before_tools.config)
    assert len(CALLS) == 1, "GUARANTEE BROKEN: the sync API ran a recorded call again"
    blocking.run(saver.aclose, caller="aclose")


async def test_a_graph_compiled_with_another_checkpointer_is_refused() -> None:
    node = LedgerToolNode([charge_card])
    with pytest.raises(TypeError, match="AgentrunSaver"):
        await (
            graph(node)
            .compile(checkpointer=InMemorySaver())
            .ainvoke({"messages": [HumanMessage("charge_card")]}, {"configurable": {"thread_id": "t"}})
        )
