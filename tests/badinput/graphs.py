"""Graphs the bad-input tests run in real runner processes (importable as ``tests.badinput.graphs``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agentrun import END, START, Message, StateGraph, ToolCall, ToolNode, assistant, tool, tools_condition
from agentrun.models import ScriptedModel

# Arguments a model has been seen to write, or could: each must be refused with a tool error message.
NASTY_ARGUMENTS = [
    "",  # nothing: {} (then the required field is missing)
    "   \n",
    "null",
    "[1, 2]",
    '"just a string"',
    '{"order_id": 4821}',  # wrong type
    '{"order_id": "4821", "quantity": "many"}',
    '{"order_id": "4821"',  # truncated
    '{"order_id": "4821"}}',  # trailing garbage
    "{'order_id': '4821'}",  # Python, not JSON
    '{"order_id": NaN}',
    '{"order_id": "4821", "quantity": Infinity}',
    '{"order_id": "4821", "quantity": -Infinity}',
    '{"order_id": "4821", "quantity": 1e999}',  # a float out of range: inf
    '{"order_id": "4821", "quantity": ' + "9" * 5000 + "}",  # beyond Python's int digits limit
    '{"order_id": "\\ud800"}',  # an unpaired surrogate: not Unicode, no store can keep it
    '{"order_id": "x\\udc00y"}',
    '{"\\udfff": 1, "order_id": "4821"}',
    '{"order_id": "4821", "tags": ' + "[" * 100_000 + "]" * 100_000 + "}",  # the parser's recursion
    '{"order_id": "4821", "tags": ' + '{"a":' * 500 + "1" + "}" * 500 + "}",
    '{"order_id": "4821", "state": {"charged": true}}',  # an injected parameter, from the model
    '{"order_id": "4821", "idempotency_key": "forged"}',
    '{"order_id": "4821", "surprise": 1}',
]


@tool
async def lookup_order(order_id: str, quantity: int = 1, tags: list[str] | None = None) -> str:
    return f"order {order_id} x{quantity}"


def _respond(messages: Sequence[Message]) -> Message:
    if messages[-1].role == "user":
        calls = [ToolCall(id=f"call_{i}", name="lookup_order", arguments=a) for i, a in enumerate(NASTY_ARGUMENTS)]
        return assistant(tool_calls=calls)
    return assistant(json.dumps([m.is_error for m in messages if m.role == "tool"]))


def _build() -> Any:
    graph = StateGraph()
    graph.add_node("model", ScriptedModel(_respond))
    graph.add_node("tools", ToolNode([lookup_order]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph


nasty_calls = _build()
