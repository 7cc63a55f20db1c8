"""Pure nodes (``agentrun.ahead``): called inline without a run context; an update computed ahead that
raised is dropped and the node runs again the ordinary way, which reports the error."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from agentrun import END, START, NodeError, StateGraph, assistant, interrupt
from agentrun.ahead import pure
from agentrun.checkpoint import Checkpointer
from tests.support.checkpointers import Backend


async def test_a_pure_node_runs_on_the_loop_thread_and_a_plain_sync_node_does_not(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    threads: dict[str, int] = {}

    @pure
    def inline(state: dict[str, Any]) -> dict[str, Any]:
        threads["pure"] = threading.get_ident()
        return {"messages": [assistant("pure")]}

    def hopped(state: dict[str, Any]) -> dict[str, Any]:
        threads["plain"] = threading.get_ident()
        return {"messages": [assistant("plain")]}

    graph = StateGraph()
    graph.add_node("inline", inline).add_node("hopped", hopped)
    graph.add_edge(START, "inline").add_edge("inline", "hopped").add_edge("hopped", END)
    out = await graph.compile(checkpointer).ainvoke("go", {"thread_id": backend.thread()})
    assert [m.content for m in out["messages"]] == ["go", "pure", "plain"]
    assert threads["pure"] == threading.get_ident(), "a pure node is called inline, on the loop's thread"
    assert threads["plain"] != threading.get_ident(), "a sync node that is not declared pure keeps its thread"


async def test_a_pure_node_has_no_run_context_so_interrupt_fails_the_run(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    @pure
    def asks(state: dict[str, Any]) -> dict[str, Any]:
        interrupt("may I?")
        return {}

    graph = StateGraph()
    graph.add_node("asks", asks).add_edge(START, "asks").add_edge("asks", END)
    app = graph.compile(checkpointer)
    t = backend.thread()
    with pytest.raises(NodeError, match="no agentrun run is active"):
        await app.ainvoke("go", {"thread_id": t})
    state = await app.aget_state(t)
    assert state is not None and (state.status, state.current_node) == ("failed", "asks")


async def test_an_update_computed_ahead_that_raised_runs_again_and_fails_the_run_at_its_node(
    backend: Backend, checkpointer: Checkpointer
) -> None:
    calls: list[str] = []

    @pure
    def first(state: dict[str, Any]) -> dict[str, Any]:
        calls.append("first")
        return {"messages": [assistant("one")]}

    @pure
    def broken(state: dict[str, Any]) -> dict[str, Any]:
        calls.append("broken")
        raise ValueError("no")

    graph = StateGraph()
    graph.add_node("first", first).add_node("broken", broken)
    graph.add_edge(START, "first").add_edge("first", "broken").add_edge("broken", END)
    app = graph.compile(checkpointer)
    t = backend.thread()
    with pytest.raises(NodeError, match="node 'broken' raised ValueError: no"):
        await app.ainvoke("go", {"thread_id": t})
    state = await app.aget_state(t)
    assert state is not None and (state.status, state.current_node, state.step) == ("failed", "broken", 1)
    assert [m.content for m in state.values["messages"]] == ["go", "one"]
    # Memory writes return at once (nothing to overlap); SQLite and PostgreSQL compute it ahead, then again.
    assert calls.count("first") == 1
    assert calls.count("broken") == (1 if backend.name == "memory" else 2), calls
