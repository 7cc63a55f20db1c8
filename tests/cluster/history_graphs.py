"""Graphs for the history view's browser test (``tests.cluster.history_graphs:<name>``): hostile, huge output;
a state without messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

from agentrun import END, START, Message, StateGraph, ToolCall, ToolNode, assistant, tool, tools_condition
from agentrun.models import ScriptedModel

HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">&amp; "quoted" \u202e'
HUGE_BYTES = 300_000


@tool
def fetch_page(url: str) -> str:
    """Fetch a web page: its text is whatever the site wrote, markup included."""
    return HOSTILE + "\n" + ("0123456789abcdef" * (HUGE_BYTES // 16))


def _model(messages: Sequence[Message]) -> Message:
    if messages[-1].role == "user":
        return assistant(tool_calls=[ToolCall(id="call_1", name="fetch_page", arguments='{"url": "<b>evil</b>"}')])
    return assistant("summary: " + HOSTILE)


_hostile = StateGraph()
_hostile.add_node("model", ScriptedModel(_model))
_hostile.add_node("tools", ToolNode([fetch_page]))
_hostile.add_edge(START, "model")
_hostile.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
_hostile.add_edge("tools", "model")
hostile = _hostile.compile()


class Greeting(TypedDict, total=False):
    name: str
    greeting: str


def _greet(state: dict[str, Any]) -> dict[str, Any]:
    return {"greeting": f"Hello, {state['name']}"}


# A graph whose state is not messages (issue 32: its output appeared nowhere): its result is its final values.
_greeting = StateGraph(Greeting)
_greeting.add_node("greet", _greet)
_greeting.add_edge(START, "greet")
_greeting.add_edge("greet", END)
greeting = _greeting.compile()
