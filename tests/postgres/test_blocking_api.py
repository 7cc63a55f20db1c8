"""The blocking API on PostgreSQL: any number of sync calls in one process, from several threads.

The bug this protects against: ``PgCheckpointer``'s asyncpg pool belongs to
the event loop that opened it, and a blocking API running each call on a
new loop worked once per process; the second ``invoke``/``stream``/
``get_state`` failed with "Event loop is closed". The blocking API now runs
every call on one loop (``agentrun.blocking``), where the pool lives.

The tests are synchronous on purpose: a blocking call refuses to run inside
a running event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from agentrun import END, START, StateGraph, ToolCall, ToolNode, assistant, tool, tools_condition
from agentrun.blocking import run
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.engine import CompiledGraph
from agentrun_dev.databases import create_database, drop_database


@pytest.fixture
def sync_pg_dsn() -> Iterator[str]:
    """A fresh database for a synchronous test (``pg_dsn`` is async); dropped afterwards."""
    dsn = asyncio.run(create_database())
    try:
        yield dsn
    finally:
        asyncio.run(drop_database(dsn))


@pytest.fixture
def app(sync_pg_dsn: str) -> Iterator[CompiledGraph]:
    """The lookup agent on a ``PgCheckpointer`` that only the blocking API uses; its pool closed on that loop."""
    checkpointer = PgCheckpointer(sync_pg_dsn)
    try:
        yield lookup_app(checkpointer)
    finally:
        run(checkpointer.aclose, caller="aclose")


@tool
def lookup(order_id: str) -> str:
    return f"order {order_id}"


def model(state: dict[str, Any]) -> dict[str, Any]:
    last = state["messages"][-1]
    if last.role == "user":
        return {
            "messages": [assistant(tool_calls=[ToolCall(id="call_1", name="lookup", arguments='{"order_id": "7"}')])]
        }
    return {"messages": [assistant(f"done: {last.content}")]}


def lookup_app(checkpointer: PgCheckpointer) -> CompiledGraph:
    graph = StateGraph()
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([lookup]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer)


def last_reply(values: dict[str, Any]) -> str:
    return str(values["messages"][-1].content)


def test_ten_mixed_blocking_calls_in_one_process(app: CompiledGraph) -> None:
    seen: list[Any] = []
    seen.append(last_reply(app.invoke("where is it?", {"thread_id": "a"})))  # 1
    seen.append(app.get_state("a").version)  # type: ignore[union-attr]  # 2
    seen.append([e.kind for e in app.stream("where is it?", {"thread_id": "b"})])  # 3
    seen.append(app.get_state({"thread_id": "b"}).status)  # type: ignore[union-attr]  # 4
    seen.append(len(app.invoke("and now?", {"thread_id": "a"})["messages"]))  # 5
    seen.append([e.version for e in app.stream("and now?", {"thread_id": "b"})])  # 6
    seen.append(app.get_state("missing"))  # 7
    seen.append(last_reply(app.invoke("a third time", {"thread_id": "b"})))  # 8
    seen.append(app.get_state("a").version)  # type: ignore[union-attr]  # 9
    seen.append(app.get_state("b").step)  # type: ignore[union-attr]  # 10
    assert seen == [
        "done: order 7",
        4,
        ["step", "step", "step", "end"],
        "completed",
        8,
        [6, 7, 8, 8],
        None,
        "done: order 7",
        8,
        3,
    ], "every blocking call after the first must work on the same PgCheckpointer"


def test_blocking_calls_from_two_threads_at_once(app: CompiledGraph) -> None:
    start = threading.Barrier(2, timeout=10)
    results: dict[str, Any] = {}

    def turns(thread_id: str) -> None:
        try:
            start.wait()
            first = last_reply(app.invoke("where is it?", {"thread_id": thread_id}))
            streamed = [e.kind for e in app.stream("and now?", {"thread_id": thread_id})]
            state = app.get_state(thread_id)
            results[thread_id] = (first, streamed, state.version if state else None)
        except BaseException as e:  # reported by the assertion below, with the thread that raised
            results[thread_id] = e

    threads = [threading.Thread(target=turns, args=(f"t{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    expected = ("done: order 7", ["step", "step", "step", "end"], 8)
    assert results == {"t0": expected, "t1": expected}, "blocking calls from two threads must both work"
