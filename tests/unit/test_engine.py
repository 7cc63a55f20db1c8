"""The engine loop (DESIGN §2): recursion limit, graph and update errors, thread life cycle, one engine for all."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from agentrun import (
    END,
    START,
    Command,
    GraphDefinitionError,
    GraphRecursionError,
    InMemoryCheckpointer,
    NodeError,
    SqliteCheckpointer,
    StateGraph,
    ThreadNotFoundError,
    ThreadStateError,
    assistant,
    interrupt,
    tool,
)
from agentrun.checkpoint import Checkpointer
from agentrun.config import ConfigError
from agentrun.errors import InvalidUpdateError
from tests.support.checkpointers import Backend

from .helpers import app_for, call, eventually


def loop_graph() -> StateGraph:
    """A node that always routes back to itself."""

    async def spin(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [assistant("again")]}

    graph = StateGraph()
    graph.add_node("spin", spin)
    graph.add_edge(START, "spin")
    graph.add_conditional_edges("spin", lambda state: "spin", ["spin"])
    return graph


async def test_recursion_limit_raises_and_persists_the_run_as_failed(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    t = backend.thread()
    app = loop_graph().compile(checkpointer)
    with pytest.raises(GraphRecursionError) as raised:
        await app.ainvoke("go", {"thread_id": t, "recursion_limit": 5})
    assert raised.value.code == "GRAPH_RECURSION_001" and "recursion limit of 5 steps" in str(raised.value)
    state = await app.aget_state(t)
    assert state is not None and state.status == "failed" and state.step == 5
    assert state.meta["error"]["code"] == "GRAPH_RECURSION_001"
    assert len(state.values["messages"]) == 6, "the steps before the limit must be kept"


def node(state: dict[str, Any]) -> dict[str, Any]:
    return {}


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda g: g.add_node("a", node), "no entry point"),
        (lambda g: (g.add_node("a", node), g.add_edge(START, "a")), "node 'a' has no way out"),
        (lambda g: (g.add_node("a", node), g.add_edge(START, "a"), g.add_edge("a", "b")), "unknown node 'b'"),
        (lambda g: g.add_edge(START, "ghost"), "unknown node 'ghost'"),
        (
            lambda g: (g.add_node("a", node), g.add_edge(START, "a"), g.add_edge("x", "a"), g.add_edge("a", END)),
            "edge from unknown node 'x'",
        ),
        (
            lambda g: (
                g.add_node("a", node),
                g.add_edge(START, "a"),
                g.add_conditional_edges("a", len, {1: "nowhere"}),
            ),
            "conditional edge 'a' -> unknown node 'nowhere'",
        ),
    ],
    ids=["no-entry", "no-way-out", "edge-to-unknown", "entry-to-unknown", "edge-from-unknown", "branch-to-unknown"],
)
def test_invalid_graph_is_rejected_at_compile(build: Callable[[StateGraph], Any], message: str) -> None:
    graph = StateGraph()
    build(graph)
    with pytest.raises(GraphDefinitionError) as raised:
        graph.compile()
    assert message in str(raised.value) and raised.value.code == "GRAPH_DEFINITION_001"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda g: (g.add_node("a", node), g.add_node("a", node)), "node 'a' is already defined"),
        (lambda g: g.add_node(END, node), "'__end__' is reserved"),
        (lambda g: g.add_node("a"), "node 'a' needs a function"),
        (lambda g: (g.add_node("a", node), g.add_edge("a", END), g.add_edge("a", "a")), "already has a way out"),
        (lambda g: g.add_edge(END, "a"), "invalid edge"),
        (lambda g: g.add_edge("a", START), "invalid edge"),
    ],
    ids=["duplicate", "reserved", "no-function", "two-ways-out", "edge-from-end", "edge-to-start"],
)
def test_invalid_graph_is_rejected_while_building(build: Callable[[StateGraph], Any], message: str) -> None:
    with pytest.raises(GraphDefinitionError) as raised:
        build(StateGraph())
    assert message in str(raised.value)


async def test_conditional_edge_to_an_unknown_node_fails_the_run_clearly(
    checkpointer: Checkpointer, backend: Backend
) -> None:
    graph = StateGraph()
    graph.add_node("a", node)
    graph.add_edge(START, "a")
    graph.add_conditional_edges("a", lambda state: "nowhere")
    app = graph.compile(checkpointer)
    t = backend.thread()
    with pytest.raises(GraphDefinitionError) as raised:
        await app.ainvoke("go", {"thread_id": t})
    assert "conditional edge from 'a' chose unknown node 'nowhere'" in str(raised.value)
    state = await app.aget_state(t)
    assert state is not None and state.status == "failed"


@pytest.mark.parametrize(
    ("update", "message"),
    [({"mesages": []}, "update key 'mesages' is not a channel"), (["not", "a", "dict"], "got list")],
)
async def test_node_returning_an_invalid_update_is_an_invalid_update_error(
    checkpointer: Checkpointer, backend: Backend, update: Any, message: str
) -> None:
    graph = StateGraph()
    graph.add_node("bad", lambda state: update)
    graph.add_edge(START, "bad")
    graph.add_edge("bad", END)
    app = graph.compile(checkpointer)
    t = backend.thread()
    with pytest.raises(InvalidUpdateError) as raised:
        await app.ainvoke("go", {"thread_id": t})
    assert message in str(raised.value) and raised.value.code == "GRAPH_UPDATE_001"
    state = await app.aget_state(t)
    assert state is not None and state.status == "failed" and state.current_node == "bad"


# -- thread life cycle ----------------------------------------------------------------------------


def pausing_graph() -> StateGraph:
    async def ask(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [assistant(str(interrupt("ok?")))]}

    graph = StateGraph()
    graph.add_node("ask", ask)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", END)
    return graph


async def test_new_input_on_an_interrupted_thread_is_refused(checkpointer: Checkpointer, backend: Backend) -> None:
    t = backend.thread()
    app = pausing_graph().compile(checkpointer)
    await app.ainvoke("go", {"thread_id": t})
    with pytest.raises(ThreadStateError) as raised:
        await app.ainvoke("something else", {"thread_id": t})
    assert "has an unfinished run (interrupted at node 'ask'" in str(raised.value)
    assert "Command(resume=...)" in str(raised.value)
    with pytest.raises(ThreadStateError) as raised:
        await app.ainvoke(None, {"thread_id": t})
    assert "is paused on interrupt(s)" in str(raised.value) and "Command(resume=...)" in str(raised.value)
    state = await app.aget_state(t)
    assert state is not None and state.status == "interrupted" and len(state.values["messages"]) == 1


async def test_new_input_on_a_running_thread_is_refused(checkpointer: Checkpointer, backend: Backend) -> None:
    t = backend.thread()
    release = asyncio.Event()

    async def slow(state: dict[str, Any]) -> dict[str, Any]:
        await release.wait()
        return {"messages": [assistant("done")]}

    graph = StateGraph()
    graph.add_node("slow", slow)
    graph.add_edge(START, "slow")
    graph.add_edge("slow", END)
    app = graph.compile(checkpointer)
    run = asyncio.create_task(app.ainvoke("first", {"thread_id": t}))
    await eventually(lambda: checkpointer.aget(t), "the run's first checkpoint")
    with pytest.raises(ThreadStateError) as raised:
        await app.ainvoke("second", {"thread_id": t})
    assert "has an unfinished run (running at node 'slow', step 0)" in str(raised.value)
    release.set()
    values = await run
    assert [m.content for m in values["messages"]] == ["first", "done"], "the refused input leaked into the run"


async def test_resume_without_an_unfinished_run_is_refused(checkpointer: Checkpointer, backend: Backend) -> None:
    t = backend.thread()
    graph = StateGraph()
    graph.add_node("a", lambda state: {"messages": [assistant("hi")]})
    graph.add_edge(START, "a")
    graph.add_edge("a", END)
    app = graph.compile(checkpointer)
    with pytest.raises(ThreadNotFoundError) as missing:
        await app.ainvoke(None, {"thread_id": t})
    assert "does not exist; start it with some input" in str(missing.value)
    await app.ainvoke("hello", {"thread_id": t})
    with pytest.raises(ThreadStateError) as raised:
        await app.ainvoke(None, {"thread_id": t})
    assert "no unfinished run to resume (status: completed); send new input" in str(raised.value)
    with pytest.raises(ThreadStateError) as not_waiting:
        await app.ainvoke(Command(resume="x"), {"thread_id": t})
    assert "is not waiting on an interrupt (status: completed)" in str(not_waiting.value)
    values = await app.ainvoke("next turn", {"thread_id": t})
    assert [m.content for m in values["messages"]] == ["hello", "hi", "next turn", "hi"]


async def test_failed_run_resumes_from_its_node_with_input_none(checkpointer: Checkpointer, backend: Backend) -> None:
    t = backend.thread()
    attempts: list[int] = []

    async def flaky(state: dict[str, Any]) -> dict[str, Any]:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("model endpoint down")
        return {"messages": [assistant("recovered")]}

    graph = StateGraph()
    graph.add_node("first", lambda state: {"messages": [assistant("first")]})
    graph.add_node("flaky", flaky)
    graph.add_edge(START, "first")
    graph.add_edge("first", "flaky")
    graph.add_edge("flaky", END)
    app = graph.compile(checkpointer)
    with pytest.raises(NodeError) as raised:
        await app.ainvoke("go", {"thread_id": t})
    assert "node 'flaky' raised ConnectionError: model endpoint down" in str(raised.value)
    assert isinstance(raised.value.__cause__, ConnectionError)
    state = await app.aget_state(t)
    assert state is not None and state.status == "failed" and state.current_node == "flaky"
    values = await app.ainvoke(None, {"thread_id": t})
    assert [m.content for m in values["messages"]] == ["go", "first", "recovered"]


def test_thread_id_is_required() -> None:
    graph = StateGraph()
    graph.add_node("a", node)
    graph.add_edge(START, "a")
    graph.add_edge("a", END)
    app = graph.compile(InMemoryCheckpointer())
    with pytest.raises(ConfigError, match="a run needs a thread id"):
        asyncio.run(app.ainvoke("go", {}))


# -- one engine for every entry point -------------------------------------------------------------


@tool
def sync_lookup(order_id: str) -> str:
    return f"order {order_id}"


def event_summary(events: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (e.kind, e.node, e.step, e.version, e.status, [(m.role, m.content, m.tool_call_id) for m in e.new_messages])
        for e in events
    ]


def test_sync_invoke_and_stream_share_the_engine(tmp_path: Any) -> None:
    """Blocking wrappers run the same engine: same checkpoints, same ledger, same events."""
    checkpointer = SqliteCheckpointer(tmp_path / "store.db")
    try:
        app = app_for([sync_lookup], [call("call_1", "sync_lookup", order_id="4821")], checkpointer)
        values = app.invoke("where is it?", {"thread_id": "invoke"})
        assert values["messages"][-1].content == "done: call_1=order 4821"
        state = app.get_state("invoke")
        assert state is not None and state.status == "completed" and state.version == 4
        assert len(asyncio.run(checkpointer.ledger_list("invoke"))) == 1, "invoke bypassed the ledger"

        streamed = list(app.stream("where is it?", {"thread_id": "stream"}))

        async def collect() -> list[Any]:
            return [e async for e in app.astream("where is it?", {"thread_id": "astream"})]

        async_events = asyncio.run(collect())
        assert event_summary(streamed) == event_summary(async_events)
        assert [e.kind for e in streamed] == ["step", "step", "step", "end"]
        assert len(asyncio.run(checkpointer.ledger_list("stream"))) == 1, "stream bypassed the ledger"
        second_turn = app.invoke("and now?", {"thread_id": "invoke"})
        assert len(second_turn["messages"]) == 8, "a second blocking call on the same app must work"
    finally:
        asyncio.run(checkpointer.aclose())


async def test_a_new_turn_after_a_stop_mid_tools_answers_the_dangling_calls() -> None:
    """Chat APIs reject an assistant tool call without a tool result: the next turn closes them first."""
    from agentrun import END, START, InMemoryCheckpointer, RunStopped, StateGraph, ToolCall, ToolNode, assistant, tool

    release, started = asyncio.Event(), asyncio.Event()

    @tool
    async def hang() -> str:
        started.set()
        await release.wait()
        return "never"

    def model(state: dict[str, Any]) -> dict[str, Any]:
        last = state["messages"][-1]
        if last.role == "user" and last.content == "first":
            return {"messages": [assistant(tool_calls=[ToolCall(id="call_1", name="hang")])]}
        return {"messages": [assistant("ok")]}

    graph = StateGraph()
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([hang]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", lambda s: "tools" if s["messages"][-1].tool_calls else END)
    graph.add_edge("tools", "model")
    checkpointer = InMemoryCheckpointer()
    app = graph.compile(checkpointer)
    run = asyncio.create_task(app.ainvoke("first", {"thread_id": "t", "stop_poll_interval": 0.05}))
    await started.wait()
    await app.arequest_stop("t")
    with pytest.raises(RunStopped):
        await run
    values = await app.ainvoke("second", {"thread_id": "t"})
    roles = [(m.role, m.tool_call_id, m.is_error) for m in values["messages"]]
    assert roles[:4] == [
        ("user", None, False),
        ("assistant", None, False),
        ("tool", "call_1", True),
        ("user", None, False),
    ], roles
