"""The graph the node tier's fault scenarios run in runner containers (``node_faults:app`` in the image).

This file is copied into an image built FROM the runtime image (``tests/node/fault_support.py``):
it imports only what that image holds (agentrun, asyncpg), never tests or dev code.

The user message is JSON: ``{"label": ..., "calls": [[tool, {arguments}], ...]}``; the scripted model
answers it with those calls, run in parallel in one tools node, then ends. Every tool execution is
counted OUTSIDE the container: a row in ``node_effects`` of the run's own PostgreSQL (the runner's
store DSN, from the store Secret; ``NODE_EFFECTS_DSN`` overrides it) with the label, the tool, the
runner's attempt and the idempotency key, written before the tool does anything else. The test
creates the tables (``fault_support.EFFECTS_SCHEMA``).

Tools:
- ``charge_card``: a side effect (the card); only its row.
- ``wait_for_gate``: waits until the test inserts the label into ``node_gates`` (polled), then sleeps
  ``then_seconds``: the test decides when the tool returns.
- ``hang``: blocks in a thread for an hour (a tool that never returns).
- ``hog``: while it has run at most ``times`` times for its label, fills ``mib`` MiB and holds them (the
  container's memory limit OOM-kills it); afterwards it returns at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import asyncpg

from agentrun import END, START, Message, StateGraph, ToolCall, ToolNode, assistant, tool, tools_condition
from agentrun.contract import Env
from agentrun.models import ScriptedModel

DSN_ENV = "NODE_EFFECTS_DSN"
GATE_POLL_SECONDS = 0.2


async def _connect() -> asyncpg.Connection:
    return await asyncpg.connect(os.environ.get(DSN_ENV) or os.environ[Env.POSTGRES_DSN], timeout=30)


async def _record(label: str, name: str, key: str | None = None) -> int:
    """One row per execution; returns how many executions of ``name`` the label has had, this one included."""
    connection = await _connect()
    try:
        await connection.execute(
            "INSERT INTO node_effects (label, tool, attempt, idempotency_key) VALUES ($1, $2, $3, $4)",
            label,
            name,
            int(os.environ.get(Env.ATTEMPT, "0")),
            key,
        )
        count: int = await connection.fetchval(
            "SELECT count(*) FROM node_effects WHERE label = $1 AND tool = $2", label, name
        )
        return count
    finally:
        await connection.close()


@tool(side_effects=True, in_doubt="retry")
async def charge_card(label: str, order_id: str, idempotency_key: str | None = None) -> dict[str, Any]:
    """Charge the saved card for the order."""
    await _record(label, "charge_card", idempotency_key)
    return {"status": "succeeded", "order_id": order_id}


@tool
async def wait_for_gate(label: str, then_seconds: float = 0) -> str:
    """Wait until the test opens this label's gate, then ``then_seconds`` more."""
    await _record(label, "wait_for_gate")
    connection = await _connect()
    try:
        query = "SELECT EXISTS (SELECT 1 FROM node_gates WHERE label = $1)"
        while not await connection.fetchval(query, label):  # noqa: ASYNC110 -- the gate is a row another process writes
            await asyncio.sleep(GATE_POLL_SECONDS)
    finally:
        await connection.close()
    await asyncio.sleep(then_seconds)
    return "the gate opened"


@tool
def hang(label: str) -> str:
    """Block for an hour in a thread: a tool that never returns."""
    asyncio.run(_record(label, "hang"))
    time.sleep(3600)
    return "woke up"


@tool
def hog(label: str, mib: int, times: int) -> str:
    """Hold ``mib`` MiB while this label's hog has run at most ``times`` times."""
    ran = asyncio.run(_record(label, "hog"))
    if ran > times:
        return f"run {ran}: no allocation"
    chunks = [b"x" * (1 << 20) for _ in range(mib)]  # written, so every page counts against the limit
    time.sleep(60)  # the OOM killer ends it long before
    return f"run {ran}: held {len(chunks)} MiB"


def _model(messages: Sequence[Message]) -> Message:
    last = messages[-1]
    if last.role == "user":
        request = json.loads(last.content)
        calls = [
            ToolCall(id=f"call_{i}", name=name, arguments=json.dumps({"label": request["label"], **arguments}))
            for i, (name, arguments) in enumerate(request["calls"], start=1)
        ]
        return assistant(tool_calls=calls)
    results = [f"{m.name}: {m.content}" for m in messages if m.role == "tool"]
    return assistant("done: " + " | ".join(results))


_graph = StateGraph()
_graph.add_node("model", ScriptedModel(_model))
_graph.add_node("tools", ToolNode([charge_card, wait_for_gate, hang, hog]))
_graph.add_edge(START, "model")
_graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
_graph.add_edge("tools", "model")
app = _graph.compile()
