"""Deadlines (DESIGN §2): tool_timeout (NODE_TIMEOUT_002) and node_timeout (NODE_TIMEOUT_001).

The engine measures deadlines with the loop's clock (``loop.time()``,
``asyncio.wait``, ``asyncio.timeout``), so these tests fast-forward it with
looptime: hours of tool time pass in milliseconds, and the assertions on
when a deadline fired are exact.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from agentrun import END, START, InMemoryCheckpointer, NodeTimeoutError, RunConfig, StateGraph, assistant, tool
from agentrun.config import DEFAULT_NODE_TIMEOUT, DEFAULT_TOOL_TIMEOUT

from .helpers import app_for, call, log_lines, tool_messages

pytestmark = pytest.mark.looptime


@tool
async def hang() -> str:
    await asyncio.sleep(3600)
    return "finished"


@tool
async def quick() -> str:
    return "quick"


async def test_tool_timeout_is_a_tool_error_with_node_timeout_002_and_the_run_continues(looptime: Any) -> None:
    checkpointer = InMemoryCheckpointer()
    app = app_for([hang, quick], [call("call_1", "hang"), call("call_2", "quick")], checkpointer)
    values = await app.ainvoke("go", {"thread_id": "t", "tool_timeout": 60})
    assert 60 <= looptime < 61, f"the tool deadline fired at {looptime}s instead of 60s"
    results = tool_messages(values)
    assert results["call_1"].is_error and "NODE_TIMEOUT_002" in results["call_1"].content
    assert "hang did not finish within 60s" in results["call_1"].content
    assert results["call_2"].content == "quick", "a sibling's result was lost to the other call's timeout"
    state = await checkpointer.aget("t")
    assert state is not None and state.status == "completed", "a tool timeout must not fail the run"
    assert "call_1=Error: [NODE_TIMEOUT_002]" in values["messages"][-1].content


async def test_per_tool_timeout_overrides_the_run_default(looptime: Any) -> None:
    @tool(timeout=5)
    async def slow() -> str:
        await asyncio.sleep(10)
        return "slow"

    @tool(timeout=0)
    async def patient() -> str:
        await asyncio.sleep(500)
        return "patient"

    app = app_for([slow, patient], [call("c1", "slow"), call("c2", "patient")], InMemoryCheckpointer())
    values = await app.ainvoke("go", {"thread_id": "t", "tool_timeout": 100})
    results = tool_messages(values)
    assert results["c1"].is_error and "within 5s" in results["c1"].content
    assert results["c2"].content == "patient", "timeout=0 on a tool must disable its deadline"
    assert 500 <= looptime < 501


async def test_tool_raising_its_own_timeout_error_is_not_reported_as_a_deadline(looptime: Any) -> None:
    @tool
    async def flaky_api() -> str:
        await asyncio.sleep(1)
        raise TimeoutError("upstream API timed out")

    values = await app_for([flaky_api], [call("call_1", "flaky_api")], InMemoryCheckpointer()).ainvoke(
        "go", {"thread_id": "t", "tool_timeout": 60}
    )
    result = tool_messages(values)["call_1"]
    assert result.is_error and "upstream API timed out" in result.content
    assert "NODE_TIMEOUT_002" not in result.content, "the tool's own TimeoutError was blamed on tool_timeout"


def sleeping_graph(seconds: dict[str, float]) -> StateGraph:
    async def work(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(seconds["work"])
        return {"messages": [assistant("worked")]}

    graph = StateGraph()
    graph.add_node("work", work)
    graph.add_edge(START, "work")
    graph.add_edge("work", END)
    return graph


async def test_node_timeout_raises_node_timeout_001_persists_failed_and_is_resumable(looptime: Any) -> None:
    seconds = {"work": 3600.0}
    checkpointer = InMemoryCheckpointer()
    app = sleeping_graph(seconds).compile(checkpointer)
    with pytest.raises(NodeTimeoutError) as raised:
        await app.ainvoke("go", {"thread_id": "t", "node_timeout": 120})
    assert raised.value.code == "NODE_TIMEOUT_001" and raised.value.timeout == 120
    assert 120 <= looptime < 121, f"the node deadline fired at {looptime}s instead of 120s"
    state = await app.aget_state("t")
    assert state is not None and state.status == "failed" and state.current_node == "work"
    assert state.meta["error"]["code"] == "NODE_TIMEOUT_001"
    seconds["work"] = 1
    values = await app.ainvoke(None, {"thread_id": "t", "node_timeout": 120})
    assert values["messages"][-1].content == "worked"
    state = await app.aget_state("t")
    assert state is not None and state.status == "completed"


@pytest.mark.parametrize("disabled", [None, 0, -1, "0"])
async def test_none_or_non_positive_deadlines_disable_them(looptime: Any, disabled: Any) -> None:
    @tool
    async def long_tool() -> str:
        await asyncio.sleep(DEFAULT_TOOL_TIMEOUT + 1)
        return "long done"

    app = app_for([long_tool], [call("call_1", "long_tool")], InMemoryCheckpointer())
    # Polling for stops once a second (the slowest allowed) keeps the fast-forward cheap.
    values = await app.ainvoke("go", {"thread_id": "t", "tool_timeout": disabled, "stop_poll_interval": 1})
    assert tool_messages(values)["call_1"].content == "long done", f"tool_timeout={disabled!r} did not disable it"

    seconds = {"work": DEFAULT_NODE_TIMEOUT + 1}
    values = (
        await sleeping_graph(seconds)
        .compile(InMemoryCheckpointer())
        .ainvoke("go", {"thread_id": "t", "node_timeout": disabled, "stop_poll_interval": 1})
    )
    assert values["messages"][-1].content == "worked", f"node_timeout={disabled!r} did not disable it"


@pytest.mark.parametrize("invalid", ["abc", [1], {"s": 1}, True, "nan"])
def test_invalid_deadline_warns_and_uses_the_default(invalid: Any, caplog: pytest.LogCaptureFixture) -> None:
    config = RunConfig.from_any({"thread_id": "t", "tool_timeout": invalid, "node_timeout": invalid})
    assert config.tool_timeout == DEFAULT_TOOL_TIMEOUT and config.node_timeout == DEFAULT_NODE_TIMEOUT
    warnings = log_lines(caplog, logging.WARNING)
    assert any(f"tool_timeout={invalid!r} is not a number; using the default" in line for line in warnings), warnings
    assert any(f"node_timeout={invalid!r} is not a number; using the default" in line for line in warnings), warnings


def test_deadline_values_that_parse() -> None:
    config = RunConfig.from_any({"configurable": {"thread_id": "t", "tool_timeout": "30", "node_timeout": 45}})
    assert (config.thread_id, config.tool_timeout, config.node_timeout) == ("t", 30.0, 45.0)
    defaults = RunConfig.from_any({"thread_id": "t"})
    assert (defaults.tool_timeout, defaults.node_timeout) == (DEFAULT_TOOL_TIMEOUT, DEFAULT_NODE_TIMEOUT)
    assert DEFAULT_NODE_TIMEOUT > 600, "the node deadline must sit above the model request timeout"


async def test_invalid_tool_timeout_keeps_the_default_deadline_in_force(looptime: Any) -> None:
    app = app_for([hang], [call("call_1", "hang")], InMemoryCheckpointer())
    values = await app.ainvoke("go", {"thread_id": "t", "tool_timeout": "abc"})
    assert "NODE_TIMEOUT_002" in tool_messages(values)["call_1"].content, "a typo turned the deadline off"
    assert DEFAULT_TOOL_TIMEOUT <= looptime < DEFAULT_TOOL_TIMEOUT + 1
