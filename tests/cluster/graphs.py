"""Graphs the cluster tier runs in runner pods (importable as ``tests.cluster.graphs:<name>``).

Side effects are appended to the file named by ``CLUSTER_EFFECTS`` (one line
per tool execution), so a test can count executions across pods.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from agentrun import END, START, Message, StateGraph, ToolCall, ToolNode, assistant, interrupt, tool, tools_condition
from agentrun.models import OpenAIChatModel, ScriptedModel


def _record(name: str) -> None:
    with open(os.environ["CLUSTER_EFFECTS"], "a") as f:
        f.write(name + "\n")


@tool
def reserve(item: str) -> str:
    """Reserve an item."""
    _record("reserve")
    return f"reserved {item}"


@tool
def notify(who: str) -> str:
    """Notify someone."""
    _record("notify")
    return f"notified {who}"


@tool
def approve(amount: int) -> str:
    """Ask a human to approve a refund."""
    decision = interrupt({"amount": amount, "pad": "x" * 3000}, message=f"approve a refund of {amount}?")
    _record(f"approve:{json.dumps(decision)}")
    return f"decision {decision}"


def _approval_model(messages: Sequence[Message]) -> Message:
    if messages[-1].role == "user":
        return assistant(
            tool_calls=[
                ToolCall(id="call_1", name="reserve", arguments='{"item": "seat"}'),
                ToolCall(id="call_2", name="approve", arguments='{"amount": 120}'),
                ToolCall(id="call_3", name="notify", arguments='{"who": "ops"}'),
            ]
        )
    return assistant("done")


_approval = StateGraph()
_approval.add_node("model", ScriptedModel(_approval_model))
_approval.add_node("tools", ToolNode([reserve, approve, notify]))
_approval.add_edge(START, "model")
_approval.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
_approval.add_edge("tools", "model")
approval = _approval


def _crash(state: dict[str, Any]) -> NoReturn:
    _record("crash")
    time.sleep(0.2)
    os._exit(1)


_crasher = StateGraph()
_crasher.add_node("crash", _crash)
_crasher.add_edge(START, "crash")
_crasher.add_edge("crash", END)
crasher = _crasher


def _quit_quietly(state: dict[str, Any]) -> NoReturn:
    _record("quit")
    os._exit(0)  # exit code 0 with the turn still running in the store


_quitter = StateGraph()
_quitter.add_node("quit", _quit_quietly)
_quitter.add_edge(START, "quit")
_quitter.add_edge("quit", END)
quitter = _quitter


# A model node of the real OpenAI-compatible adapter, against the endpoint the test serves (CLUSTER_MODEL_URL):
# its token usage must reach the operator's metrics through the checkpoint, although the pod ends unscraped.
_metered = StateGraph()
_metered.add_node(
    "model",
    OpenAIChatModel(
        base_url=os.environ.get("CLUSTER_MODEL_URL", "http://127.0.0.1:9/v1"),
        model="cluster-model",
        api_key_env=None,
        retry_backoff=0.05,
    ),
)
_metered.add_edge(START, "model")
_metered.add_edge("model", END)
metered_model = _metered


@tool
def sign_off(who: str) -> str:
    """Ask ``who`` to sign off (one interrupt per call)."""
    decision = interrupt({"who": who}, message=f"{who}: sign off?")
    _record(f"sign_off:{who}:{json.dumps(decision)}")
    return f"{who} said {decision}"


def _two_sign_offs_model(messages: Sequence[Message]) -> Message:
    if messages[-1].role == "user":
        return assistant(
            tool_calls=[
                ToolCall(id="call_a", name="sign_off", arguments='{"who": "finance"}'),
                ToolCall(id="call_b", name="sign_off", arguments='{"who": "legal"}'),
            ]
        )
    return assistant("signed off")


# Two parallel calls that interrupt at once: a run waiting on two interrupt ids.
_two = StateGraph()
_two.add_node("model", ScriptedModel(_two_sign_offs_model))
_two.add_node("tools", ToolNode([sign_off]))
_two.add_edge(START, "model")
_two.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
_two.add_edge("tools", "model")
two_sign_offs = _two
