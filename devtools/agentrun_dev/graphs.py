"""Graphs for the operator's scale tests and benchmark (importable as ``agentrun_dev.graphs:<name>``).

``ticker``: ``TICKS`` steps (default 5), each waiting ``TICK_SECONDS`` (default 1) in an async node (so a stop
cancels it at once) and then checkpointing: progress at a known pace, with no pod event in between.

``asker``: one node that asks a human at once (``interrupt``): a run of it waits for approval (phase
Interrupted) after its first step, the state the operator benchmark's scale phase holds thousands of runs in.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from agentrun import END, START, StateGraph, assistant, interrupt


async def _tick(state: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(float(os.environ.get("TICK_SECONDS", "1")))
    return {"messages": [assistant(f"tick {len(state['messages'])}")]}


def _more(state: dict[str, Any]) -> str:
    return "tick" if len(state["messages"]) <= int(os.environ.get("TICKS", "5")) else END


_ticker = StateGraph()
_ticker.add_node("tick", _tick)
_ticker.add_edge(START, "tick")
_ticker.add_conditional_edges("tick", _more, {"tick": "tick", END: END})
ticker = _ticker


def _ask(state: dict[str, Any]) -> dict[str, Any]:
    answer = interrupt({"question": "approve?"}, message="approve?")
    return {"messages": [assistant(f"answered {answer!r}")]}


_asker = StateGraph()
_asker.add_node("ask", _ask)
_asker.add_edge(START, "ask")
_asker.add_edge("ask", END)
asker = _asker
