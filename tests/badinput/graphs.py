"""Graphs the bad-input tests run in real runner processes (importable as ``tests.badinput.graphs``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agentrun import END, START, Message, StateGraph, ToolCall, ToolNode, assistant, interrupt, tool, tools_condition
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


# --- a 10 MB tool result, and a tool failing with a 10 MB message ----------------------------------------------------

BIG = 10 << 20


@tool
async def export_report() -> str:
    return "r" * BIG


@tool
async def flaky_export() -> str:
    raise RuntimeError("export failed: " + "e" * BIG)


def _respond_big(messages: Sequence[Message]) -> Message:
    if messages[-1].role == "user":
        return assistant(
            tool_calls=[
                ToolCall(id="call_1", name="export_report", arguments="{}"),
                ToolCall(id="call_2", name="flaky_export", arguments="{}"),
            ]
        )
    # The worst case for status: the final answer repeats the whole 10 MB result.
    report = next(m for m in messages if m.role == "tool" and m.name == "export_report")
    return assistant(report.content)


def _agent(model: ScriptedModel, tools: list[Any]) -> Any:
    graph = StateGraph()
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph


big_result = _agent(ScriptedModel(_respond_big), [export_report, flaky_export])


# --- what a runner process could use to reach the Kubernetes API -----------------------------------------------------

TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@tool
def probe_kubernetes_api() -> dict[str, Any]:
    """What a Kubernetes client library would find in this process: in-cluster config or a kubeconfig."""
    import os
    import time
    from pathlib import Path

    time.sleep(float(os.environ.get("PROBE_HOLD_SECONDS", "0")))  # time for the test to look at the process
    home = Path(os.environ.get("HOME", "/nonexistent"))
    return {
        "env": sorted(k for k in os.environ if k.startswith("KUBERNETES_") or k in ("KUBECONFIG", "KUBE_TOKEN")),
        "token_files": sorted(p for p in (f"{TOKEN_DIR}/token", f"{TOKEN_DIR}/ca.crt") if Path(p).exists()),
        "kubeconfig": (home / ".kube" / "config").exists(),
    }


def _respond_probe(messages: Sequence[Message]) -> Message:
    if messages[-1].role == "user":
        return assistant(tool_calls=[ToolCall(id="call_1", name="probe_kubernetes_api", arguments="{}")])
    return assistant(messages[-1].content)


kubernetes_probe = _agent(ScriptedModel(_respond_probe), [probe_kubernetes_api])


# --- a 10 MB interrupt ------------------------------------------------------------------------------------------------


def _ask_big(state: dict[str, Any]) -> dict[str, Any]:
    answer = interrupt({"document": "d" * BIG, "question": "sign?"}, message="sign this: " + "m" * BIG)
    return {"messages": [assistant(f"answered {str(answer)[:40]}")]}


def _build_big_interrupt() -> Any:
    graph = StateGraph()
    graph.add_node("ask", _ask_big)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", END)
    return graph


big_interrupt = _build_big_interrupt()


# --- a node failing with a 10 MB message ------------------------------------------------------------------------------


def _fail_big(state: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError("the report could not be built: " + "f" * BIG)


def _build_big_failure() -> Any:
    graph = StateGraph()
    graph.add_node("build", _fail_big)
    graph.add_edge(START, "build")
    graph.add_edge("build", END)
    return graph


big_failure = _build_big_failure()
