"""Node calling conventions: built-in nodes get the run context as a parameter, not from ambient state.

Guarantees: a ``ContextNode`` receives the engine's run context (its store,
config and step) explicitly; the tool node works from that parameter alone,
with no run context in the context variables, and writes to the store it was
handed.
"""

from __future__ import annotations

from typing import Any

from agentrun import END, START, InMemoryCheckpointer, StateGraph, assistant, tool, user
from agentrun.checkpoint import Checkpointer
from agentrun.config import RunConfig
from agentrun.context import RunContext, current_run, run_logger
from agentrun.nodes import ContextNode
from agentrun.toolnode import ToolNode

from .helpers import call


class Recorder:
    """A context node that notes what the engine handed it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, str, Checkpointer]] = []

    async def run_with_context(self, state: dict[str, Any], ctx: RunContext) -> dict[str, Any] | None:
        self.seen.append((ctx.thread_id, ctx.step, ctx.node, ctx.checkpointer))
        return {"messages": [assistant("noted")]}


async def test_a_context_node_receives_the_run_context_from_the_engine() -> None:
    checkpointer = InMemoryCheckpointer()
    recorder = Recorder()
    assert isinstance(recorder, ContextNode)
    graph = StateGraph()
    graph.add_node("first", lambda state: None)
    graph.add_node("recorder", recorder)
    graph.add_edge(START, "first")
    graph.add_edge("first", "recorder")
    graph.add_edge("recorder", END)
    values = await graph.compile(checkpointer).ainvoke("hi", {"thread_id": "ctx"})
    assert values["messages"][-1].content == "noted"
    assert recorder.seen == [("ctx", 1, "recorder", checkpointer)], "the node must get this run's context"


async def test_the_tool_node_runs_on_the_context_it_is_handed_alone() -> None:
    store = InMemoryCheckpointer()

    @tool
    def lookup(order_id: str) -> str:
        return f"order {order_id}"

    request = assistant(tool_calls=[call("call_1", "lookup", order_id="7")], id="msg_request")
    ctx = RunContext(
        config=RunConfig(thread_id="explicit"),
        checkpointer=store,
        run_id="run-1",
        node="tools",
        step=1,
        log=run_logger("test", "explicit", 1),
    )
    assert current_run.get() is None, "no ambient run context in this test"
    update = await ToolNode([lookup]).run_with_context({"messages": [user("go"), request]}, ctx)
    assert update is not None and [m.content for m in update["messages"]] == ["order 7"]
    assert [e.key for e in await store.ledger_list("explicit")] == ["msg_request:call_1"], (
        "the call must be recorded in the store handed to the tool node"
    )
    assert ctx.counts.executed == 1
