"""Small graphs and tools shared by the unit tests."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from agentrun import END, START, Message, StateGraph, ToolCall, ToolNode, assistant, tools_condition, user
from agentrun.checkpoint import Checkpointer, CheckpointWrite
from agentrun.engine import CompiledGraph
from agentrun.models import ScriptedModel
from agentrun.tools import Tool


def call(call_id: str | None, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=json.dumps(arguments))


def calling_model(calls: Sequence[ToolCall], *, id_less: bool = False, final: str = "done") -> ScriptedModel:
    """Answers a user message with one assistant message asking for ``calls``, anything else with ``final``.

    ``id_less`` gives that message no id (so the ledger has no key for its calls).
    """

    def respond(messages: Sequence[Message]) -> Message:
        if messages[-1].role == "user":
            return assistant(tool_calls=list(calls), id=None) if id_less else assistant(tool_calls=list(calls))
        # Echo what the tools answered, so a test can see which results reached the model.
        results = []
        for message in reversed(messages):
            if message.role != "tool":
                break
            results.append(f"{message.tool_call_id}={message.content}")
        return assistant(f"{final}: " + " | ".join(reversed(results)))

    return ScriptedModel(respond)


def tool_graph(
    tools: Sequence[Tool | Callable[..., Any]],
    model: ScriptedModel | Callable[..., Any],
    *,
    schema: type | None = None,
) -> StateGraph:
    """model -> tools -> model ... -> END, the shape of every agent."""
    graph = StateGraph(schema)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode(list(tools)))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph


def app_for(
    tools: Sequence[Tool | Callable[..., Any]],
    calls: Sequence[ToolCall],
    checkpointer: Checkpointer,
    *,
    schema: type | None = None,
    id_less: bool = False,
) -> CompiledGraph:
    return tool_graph(tools, calling_model(calls, id_less=id_less), schema=schema).compile(checkpointer)


def tool_messages(values: dict[str, Any]) -> dict[str | None, Message]:
    """The tool result messages of the last turn, by tool call id."""
    return {m.tool_call_id: m for m in values["messages"] if m.role == "tool"}


async def seed_tool_step(
    checkpointer: Checkpointer, thread_id: str, calls: Sequence[ToolCall], *, message_id: str | None = "msg_request"
) -> Message:
    """A thread as a crash inside the tool node leaves it: the request is durable, ``current_node`` is tools."""
    request = assistant(tool_calls=list(calls), id=message_id)
    await checkpointer.aput(
        thread_id,
        CheckpointWrite(
            values={},
            current_node="tools",
            step=1,
            status="running",
            meta={"run_id": "run-1"},
            message_count=2,
            messages=[(0, user("go")), (1, request)],
        ),
        expected_version=0,
    )
    return request


def log_lines(caplog: pytest.LogCaptureFixture, level: int = logging.DEBUG) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


async def eventually(check: Callable[[], Awaitable[Any]], what: str, *, attempts: int = 5000) -> None:
    """Poll the store until ``check()`` is truthy (the store is the only channel a crashed process leaves)."""
    for _ in range(attempts):
        if await check():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never happened: {what}")
