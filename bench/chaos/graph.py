"""The fault campaign's agent: the support agent, with tools that count every RAW execution.

``examples/support_agent.py`` hands its "providers" the idempotency key and they
deduplicate on it, as real ones do; that hides a re-execution from a count of
charges. Here every execution of every tool appends one line to the file named by
``CHAOS_EFFECTS`` (one ``write`` of one line with ``O_APPEND``: whole lines even when
the process is killed), whatever the key, so the campaign sees each re-run.

A turn: the model asks for ``lookup_order``, ``charge_card`` and ``send_receipt`` in
parallel (three calls, each branch on a copy of the state); then for one more call,
``add_note``, or ``approve_refund`` when the user's message says "approval" (it
``interrupt()``s for a human, so the run goes Interrupted and a resume continues it);
then it answers with every result. Tool results are deterministic: two runs of one
message end with equal messages. When the message asks for "the fraud check" (the MCP
scenario, ``bench.chaos.mcp_graph``), the first round has a fourth call, ``fraud_check``.

Each execution line: ``{"kind": "effect", "tool", "idem" (the idempotency key), "attempt"
(AGENTRUN_ATTEMPT), "pid", "begin" (time.time() when the tool body started)}``. A
``{"kind": "begin", ...}`` line marks the start of a body (the campaign's anchor for "kill
inside a tool"); it is no side effect. ``CHAOS_TOOL_SECONDS`` (default 0.4) is how long
each body takes: half before its side effect, half after, so a kill inside a tool lands
before or after the effect.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from typing import Any

from agentrun import END, START, Message, StateGraph, ToolCall, ToolNode, assistant, interrupt, tool, tools_condition
from agentrun.models import ScriptedModel

EFFECTS = "CHAOS_EFFECTS"
TOOL_SECONDS = "CHAOS_TOOL_SECONDS"
ORDER = {"amount_cents": 4999, "email": "customer-118@example.com", "card": "visa-4242"}


def _line(kind: str, name: str, idem: str | None, begin: float) -> None:
    record = {
        "kind": kind,
        "tool": name,
        "idem": idem,
        "attempt": int(os.environ.get("AGENTRUN_ATTEMPT", "0") or 0),
        "pid": os.getpid(),
        "begin": begin,
    }
    fd = os.open(os.environ[EFFECTS], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def _execute(name: str, idem: str | None) -> None:
    """One raw execution: half the body, the side effect (a line), the other half."""
    begin = time.time()
    _line("begin", name, idem, begin)
    half = float(os.environ.get(TOOL_SECONDS, "0.4") or 0) / 2
    time.sleep(half)
    _line("effect", name, idem, begin)
    time.sleep(half)


@tool(side_effects=True, in_doubt="retry")
def lookup_order(order_id: str, idempotency_key: str | None = None) -> dict[str, object]:
    """Look up an order: amount, customer e-mail, saved card."""
    _execute("lookup_order", idempotency_key)
    return {"order_id": order_id, **ORDER}


@tool(side_effects=True, in_doubt="retry")
def charge_card(order_id: str, idempotency_key: str | None = None) -> dict[str, object]:
    """Charge the customer's saved card for the order total."""
    _execute("charge_card", idempotency_key)
    return {"status": "succeeded", "order_id": order_id, "amount_cents": ORDER["amount_cents"]}


@tool(side_effects=True, in_doubt="retry")
def send_receipt(order_id: str, idempotency_key: str | None = None) -> dict[str, object]:
    """E-mail the receipt for the order."""
    _execute("send_receipt", idempotency_key)
    return {"sent_to": ORDER["email"], "order_id": order_id}


@tool(side_effects=True, in_doubt="retry")
def add_note(order_id: str, idempotency_key: str | None = None) -> str:
    """Note on the order that it was charged and the receipt sent."""
    _execute("add_note", idempotency_key)
    return f"noted on order {order_id}"


@tool(side_effects=True, in_doubt="retry")
def approve_refund(order_id: str, idempotency_key: str | None = None) -> str:
    """Ask a human to approve a goodwill refund, then book it."""
    decision = interrupt({"order_id": order_id}, message=f"approve a goodwill refund on order {order_id}?")
    _execute("approve_refund", idempotency_key)  # after interrupt(): the code before it runs again on resume
    return f"refund decision on order {order_id}: {json.dumps(decision, sort_keys=True)}"


def _call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=json.dumps(arguments))


def chaos_model(messages: Sequence[Message]) -> Message:
    """A tool-calling model made deterministic: the same messages, the same answer."""
    user = next(m for m in reversed(messages) if m.role == "user")
    match = re.search(r"order\s*#?(\d+)", user.content)
    order_id = match.group(1) if match else "4821"
    rounds = sum(1 for m in messages if m.role == "assistant" and m.tool_calls)
    if messages[-1].role == "user":
        calls = [
            _call("call_1", "lookup_order", order_id=order_id),
            _call("call_2", "charge_card", order_id=order_id),
            _call("call_3", "send_receipt", order_id=order_id),
        ]
        if "fraud check" in user.content:
            calls.append(_call("call_5", "fraud_check", order_id=order_id))
        return assistant(tool_calls=calls)
    if rounds == 1:
        follow_up = "approve_refund" if "approval" in user.content else "add_note"
        return assistant(tool_calls=[_call("call_4", follow_up, order_id=order_id)])
    results = [f"{m.name}: {m.content}" for m in messages if m.role == "tool"]
    return assistant("Done. " + " | ".join(results))


graph = StateGraph()
graph.add_node("model", ScriptedModel(chaos_model))
graph.add_node("tools", ToolNode([lookup_order, charge_card, send_receipt, add_note, approve_refund]))
graph.add_edge(START, "model")
graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
graph.add_edge("tools", "model")

app = graph.compile()
