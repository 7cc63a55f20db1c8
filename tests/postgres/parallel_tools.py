"""A graph for the group-commit crash tests: one assistant message asks for three parallel charges.

``python -m agentrun.runner`` loads it (``AGENTRUN_GRAPH=tests.postgres.parallel_tools:app``).
``charge_a`` and ``charge_b`` return at once; ``charge_slow`` takes ``GROUP_SLOW_SECONDS``
(default 0: all three finish together). All three have side effects and the in-doubt
policy ``retry``: a call whose start was recorded but whose result was not runs again
with the same idempotency key, so a lost record shows up as a second charge.

Every charge appends one line to the file ``GROUP_EFFECTS`` names, fsynced before the
tool returns (what a SIGKILLed process did is on disk): ``start <tool> <time>`` when
the body starts and ``charged <tool> <idempotency key> <time>`` when it charged.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from agentrun import END, START, StateGraph, ToolNode, tool
from agentrun.messages import ToolCall, assistant

TOOLS = ("charge_a", "charge_b", "charge_slow")


def _append(line: str) -> None:
    fd = os.open(os.environ["GROUP_EFFECTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line} {time.time():.6f}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def effects(path: str) -> list[list[str]]:
    """The lines a run appended, split into words (the last one is the time)."""
    try:
        with open(path) as f:
            return [line.split() for line in f if line.strip()]
    except FileNotFoundError:
        return []


def charges(path: str, name: str) -> int:
    """How often ``name`` charged."""
    return sum(1 for words in effects(path) if words[:2] == ["charged", name])


async def _charge(name: str, seconds: float, idempotency_key: str | None) -> dict[str, Any]:
    _append(f"start {name}")
    if seconds > 0:
        await asyncio.sleep(seconds)
    _append(f"charged {name} {idempotency_key}")
    return {"charged": name}


@tool(side_effects=True, in_doubt="retry")
async def charge_a(idempotency_key: str | None = None) -> dict[str, Any]:
    """Charge A at once."""
    return await _charge("charge_a", 0, idempotency_key)


@tool(side_effects=True, in_doubt="retry")
async def charge_b(idempotency_key: str | None = None) -> dict[str, Any]:
    """Charge B at once."""
    return await _charge("charge_b", 0, idempotency_key)


@tool(side_effects=True, in_doubt="retry")
async def charge_slow(idempotency_key: str | None = None) -> dict[str, Any]:
    """Charge after ``GROUP_SLOW_SECONDS``."""
    return await _charge("charge_slow", float(os.environ.get("GROUP_SLOW_SECONDS", "0")), idempotency_key)


def model(state: dict[str, Any]) -> dict[str, Any]:
    """Ask for the three charges in one message, then finish."""
    if any(m.role == "tool" for m in state["messages"]):
        return {"messages": [assistant("done")]}
    calls = [ToolCall(id=f"call_{name}", name=name, arguments=json.dumps({})) for name in TOOLS]
    return {"messages": [assistant("", tool_calls=calls)]}


graph = StateGraph()
graph.add_node("model", model)
graph.add_node("tools", ToolNode([charge_a, charge_b, charge_slow]))
graph.add_edge(START, "model")
graph.add_conditional_edges("model", lambda s: "tools" if s["messages"][-1].tool_calls else END)
graph.add_edge("tools", "model")
app = graph.compile()
