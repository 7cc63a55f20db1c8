"""Metrics (issue #2, item 8): each counter moves when its event happens.

Counters live on the process-wide default registry, so every test reads the
value before and after, and uses tool and node names no other test uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agentrun import (
    END,
    START,
    FencedError,
    InMemoryCheckpointer,
    NodeTimeoutError,
    RunStopped,
    StaleStateError,
    StateGraph,
    StorageError,
    assistant,
    tool,
)
from agentrun.checkpoint import CheckpointWrite
from agentrun.ledger import idempotency_key

from .helpers import app_for, call, seed_tool_step


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@contextmanager
def moves(name: str, by: float = 1, **labels: str) -> Iterator[None]:
    before = sample(name, **labels)
    yield
    after = sample(name, **labels)
    assert after - before == by, f"{name}{labels} moved by {after - before}, expected {by}"


async def test_ledger_hits_are_counted() -> None:
    @tool
    async def metrics_hit_tool() -> str:
        return "x"

    checkpointer = InMemoryCheckpointer()
    request = await seed_tool_step(checkpointer, "t", [call("call_1", "metrics_hit_tool")])
    await checkpointer.ledger_put("t", f"{request.id}:call_1", "metrics_hit_tool", {"__kind__": "raw", "value": "x"})
    with (
        moves("agentrun_ledger_hits_total", tool="metrics_hit_tool"),
        moves("agentrun_tool_calls_total", tool="metrics_hit_tool", outcome="replayed"),
        moves("agentrun_tool_calls_total", by=0, tool="metrics_hit_tool", outcome="executed"),
    ):
        await app_for([metrics_hit_tool], [], checkpointer).ainvoke(None, {"thread_id": "t"})


async def test_ledger_read_and_record_failures_are_counted() -> None:
    @tool
    async def metrics_ledger_tool() -> str:
        return "x"

    class Broken(InMemoryCheckpointer):
        async def ledger_get(self, thread_id: str, key: str) -> Any:
            raise StorageError("down")

        async def ledger_put(self, *args: Any, **kwargs: Any) -> bool:
            raise StorageError("down")

    with (
        moves("agentrun_ledger_read_failures_total", reason="read_error"),
        moves("agentrun_ledger_record_failures_total", tool="metrics_ledger_tool"),
        moves("agentrun_tool_calls_total", tool="metrics_ledger_tool", outcome="executed"),
    ):
        await app_for([metrics_ledger_tool], [call("c1", "metrics_ledger_tool")], Broken()).ainvoke(
            "go", {"thread_id": "t"}
        )
    checkpointer = InMemoryCheckpointer()
    request = await seed_tool_step(checkpointer, "t", [call("call_1", "metrics_ledger_tool")])
    await checkpointer.ledger_put("t", f"{request.id}:call_1", "metrics_ledger_tool", "garbage")
    with moves("agentrun_ledger_read_failures_total", reason="malformed"):
        await app_for([metrics_ledger_tool], [], checkpointer).ainvoke(None, {"thread_id": "t"})


@pytest.mark.looptime
async def test_tool_timeouts_are_counted() -> None:
    @tool
    async def metrics_slow_tool() -> str:
        await asyncio.sleep(100)
        return "x"

    with (
        moves("agentrun_tool_timeouts_total", tool="metrics_slow_tool"),
        moves("agentrun_tool_errors_total", tool="metrics_slow_tool", reason="timeout"),
    ):
        await app_for([metrics_slow_tool], [call("c1", "metrics_slow_tool")], InMemoryCheckpointer()).ainvoke(
            "go", {"thread_id": "t", "tool_timeout": 10}
        )


@pytest.mark.looptime
async def test_node_timeouts_are_counted() -> None:
    async def slow(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(100)
        return {}

    graph = StateGraph()
    graph.add_node("metrics_slow_node", slow)
    graph.add_edge(START, "metrics_slow_node")
    graph.add_edge("metrics_slow_node", END)
    with moves("agentrun_node_timeouts_total", node="metrics_slow_node"), pytest.raises(NodeTimeoutError):
        await graph.compile(InMemoryCheckpointer()).ainvoke("go", {"thread_id": "t", "node_timeout": 10})


async def test_tool_errors_are_counted_by_reason() -> None:
    @tool
    async def metrics_error_tool(n: int) -> str:
        raise ValueError("boom")

    calls = [
        call("c1", "metrics_error_tool", n=1),
        call("c2", "metrics_error_tool", n="not a number"),
        call("c3", "metrics_no_such_tool"),
    ]
    with (
        moves("agentrun_tool_errors_total", tool="metrics_error_tool", reason="exception"),
        moves("agentrun_tool_errors_total", tool="metrics_error_tool", reason="invalid_arguments"),
        moves("agentrun_tool_errors_total", tool="<unknown>", reason="unknown_tool"),
        moves("agentrun_tool_errors_total", by=0, tool="metrics_no_such_tool", reason="unknown_tool"),
    ):
        await app_for([metrics_error_tool], calls, InMemoryCheckpointer()).ainvoke("go", {"thread_id": "t"})


async def test_in_doubt_calls_are_counted() -> None:
    @tool(side_effects=True, in_doubt="report")
    async def metrics_doubt_tool() -> str:
        return "x"

    checkpointer = InMemoryCheckpointer()
    request = await seed_tool_step(checkpointer, "t", [call("call_1", "metrics_doubt_tool")])
    key = f"{request.id}:call_1"
    await checkpointer.intent_put("t", key, "metrics_doubt_tool", idempotency_key("t", key))
    with (
        moves("agentrun_tool_in_doubt_total", tool="metrics_doubt_tool", policy="report"),
        moves("agentrun_tool_errors_total", tool="metrics_doubt_tool", reason="in_doubt"),
    ):
        await app_for([metrics_doubt_tool], [], checkpointer).ainvoke(None, {"thread_id": "t"})


async def test_stops_are_counted() -> None:
    checkpointer = InMemoryCheckpointer()
    await checkpointer.request_stop("t")
    graph = StateGraph()
    graph.add_node("a", lambda state: {})
    graph.add_edge(START, "a")
    graph.add_edge("a", END)
    with moves("agentrun_stops_total"), pytest.raises(RunStopped):
        await graph.compile(checkpointer).ainvoke("go", {"thread_id": "t"})


async def test_stale_state_conflicts_are_counted_and_nothing_more_is_written() -> None:
    checkpointer = InMemoryCheckpointer()

    async def other_process_advances(state: dict[str, Any]) -> dict[str, Any]:
        current = await checkpointer.aget("t")
        assert current is not None
        await checkpointer.aput(
            "t",
            CheckpointWrite(
                values={},
                current_node="elsewhere",
                step=9,
                status="running",
                meta={},
                message_count=len(current.messages),
            ),
            expected_version=current.version,
        )
        return {"messages": [assistant("mine")]}

    graph = StateGraph()
    graph.add_node("a", other_process_advances)
    graph.add_node("b", lambda state: {})
    graph.add_edge(START, "a")
    graph.add_edge("a", "b")
    graph.add_edge("b", END)
    with moves("agentrun_stale_state_conflicts_total"), pytest.raises(StaleStateError) as raised:
        await graph.compile(checkpointer).ainvoke("go", {"thread_id": "t"})
    assert raised.value.code == "STORAGE_CONFLICT_001" and (raised.value.expected, raised.value.actual) == (1, 2)
    state = await checkpointer.aget("t")
    assert state is not None and state.version == 2 and state.current_node == "elsewhere", (
        "the run that lost the race wrote over the winner"
    )


async def test_fenced_writes_are_counted_and_nothing_is_written() -> None:
    checkpointer = InMemoryCheckpointer()
    await checkpointer.register_attempt("t", 2)
    graph = StateGraph()
    graph.add_node("a", lambda state: {})
    graph.add_edge(START, "a")
    graph.add_edge("a", END)
    with moves("agentrun_fenced_writes_total"), pytest.raises(FencedError):
        await graph.compile(checkpointer).ainvoke("go", {"thread_id": "t", "attempt": 1})
    assert await checkpointer.aget("t") is None
