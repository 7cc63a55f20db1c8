"""The blocking API (``invoke``, ``stream``, ``get_state``) runs on one event loop for the whole process.

Guarantees: any number of blocking calls in one process work, from several
threads at once; inside a running event loop they refuse with a clear error
instead of blocking it. (PostgreSQL, whose pool binds to a loop, has its own
test in tests/postgres/test_blocking_api.py.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentrun import (
    END,
    START,
    InMemoryCheckpointer,
    SqliteCheckpointer,
    StateGraph,
    ToolCall,
    ToolNode,
    assistant,
    tool,
    tools_condition,
)
from agentrun.blocking import run
from agentrun.checkpoint import Checkpointer
from agentrun.engine import CompiledGraph


@tool
def lookup(order_id: str) -> str:
    return f"order {order_id}"


def model(state: dict[str, Any]) -> dict[str, Any]:
    """A sync model node: asks for one lookup, then answers with its result."""
    last = state["messages"][-1]
    if last.role == "user":
        return {
            "messages": [assistant(tool_calls=[ToolCall(id="call_1", name="lookup", arguments='{"order_id": "7"}')])]
        }
    return {"messages": [assistant(f"done: {last.content}")]}


def lookup_app(checkpointer: Checkpointer) -> CompiledGraph:
    graph = StateGraph()
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([lookup]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer)


STORES: dict[str, Callable[[Path], Checkpointer]] = {
    "memory": lambda _: InMemoryCheckpointer(),
    "sqlite": lambda tmp: SqliteCheckpointer(tmp / "store.db"),
}


@pytest.mark.parametrize("store", sorted(STORES))
def test_blocking_calls_from_two_threads_at_once(store: str, tmp_path: Path) -> None:
    checkpointer = STORES[store](tmp_path)
    app = lookup_app(checkpointer)
    start = threading.Barrier(2, timeout=10)
    results: dict[str, Any] = {}

    def turns(thread_id: str) -> None:
        try:
            start.wait()
            first = app.invoke("where is it?", {"thread_id": thread_id})
            streamed = [e.kind for e in app.stream("and now?", {"thread_id": thread_id})]
            state = app.get_state(thread_id)
            results[thread_id] = (first["messages"][-1].content, streamed, state.version if state else None)
        except BaseException as e:  # reported by the assertion below, with the thread that raised
            results[thread_id] = e

    threads = [threading.Thread(target=turns, args=(f"t{i}",)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        run(checkpointer.aclose, caller="aclose")
    expected = ("done: order 7", ["step", "step", "step", "end"], 8)
    assert results == {"t0": expected, "t1": expected}, "blocking calls from two threads must both work"


def test_a_stream_left_early_does_not_break_the_next_blocking_call() -> None:
    app = lookup_app(InMemoryCheckpointer())
    events = app.stream("where is it?", {"thread_id": "left"})
    assert next(events).kind == "step"
    events.close()  # the run stays resumable where it was left
    state = app.get_state("left")
    assert state is not None and state.status == "running" and state.current_node == "tools"
    assert app.invoke(None, {"thread_id": "left"})["messages"][-1].content == "done: order 7"


async def test_blocking_calls_refuse_inside_a_running_event_loop() -> None:
    """A blocking call would block the caller's loop: it raises before doing anything."""
    app = lookup_app(InMemoryCheckpointer())
    with pytest.raises(RuntimeError, match=r"invoke\(\) blocks, so it cannot be called inside a running event loop"):
        app.invoke("hi", {"thread_id": "t"})
    with pytest.raises(RuntimeError, match=r"use `await aget_state\(\.\.\.\)` there"):
        app.get_state("t")
    with pytest.raises(RuntimeError, match=r"stream\(\) blocks"):
        next(app.stream("hi", {"thread_id": "t"}))
    assert await app.aget_state("t") is None, "a refused call must not have started a run"
