"""A graph for the runner-process tests of large inputs: it pauses for a human and reports what it got.

``app`` answers the first user message with an interrupt; on resume it
replies with the size and SHA-256 of the resume value and of the input text,
so a test can prove both arrived whole without printing a mebibyte.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agentrun import END, START, StateGraph, assistant, interrupt


def digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return f"{len(text.encode())}:{hashlib.sha256(text.encode()).hexdigest()}"


def _ask(state: dict[str, Any]) -> dict[str, Any]:
    answer = interrupt({"question": "approve?"}, message="approve?")
    question = state["messages"][0].content
    return {"messages": [assistant(f"input {digest(question)} resume {digest(answer)}")]}


_graph = StateGraph()
_graph.add_node("ask", _ask)
_graph.add_edge(START, "ask")
_graph.add_edge("ask", END)
app = _graph
