"""The support agent: the scenario agentrun exists for.

A customer writes "charge my saved card for order 4821 and email me the
receipt". The model answers with one assistant message holding three tool
calls, run in parallel: ``lookup_order``, ``charge_card``, ``send_receipt``.
If the process dies after the card was charged, the replay must not charge
it again. In a later turn the customer asks for a refund and the model uses
the call id ``call_1`` again; the ledger must not confuse the two turns.

The "payment provider" and "mail server" are tables in a local SQLite file
(``SUPPORT_EFFECTS_DB``, default ``support_effects.db``), so tests and the
demo can count charges, refunds and receipts. Like real providers, they
deduplicate on the idempotency key agentrun hands to each call; every
invocation is also logged in ``tool_invocations`` so a re-run is visible.

``SUPPORT_TOOL_DELAY`` (seconds) slows each side-effect tool down, for
demos and for killing the process mid-tool; ``SUPPORT_TOOL_DELAY_<TOOL>``
(e.g. ``SUPPORT_TOOL_DELAY_SEND_RECEIPT``) overrides it for one tool.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from collections.abc import Sequence

from agentrun import END, START, Message, StateGraph, ToolCall, ToolNode, assistant, tool, tools_condition
from agentrun.models import ScriptedModel

ORDERS = {"4821": {"amount_cents": 4999, "email": "customer-118@example.com", "card": "visa-4242"}}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tool_invocations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, tool TEXT NOT NULL, order_id TEXT, idempotency_key TEXT, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS charges (
    idempotency_key TEXT PRIMARY KEY, order_id TEXT NOT NULL, amount_cents INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS receipts (
    idempotency_key TEXT PRIMARY KEY, order_id TEXT NOT NULL, email TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS refunds (
    idempotency_key TEXT PRIMARY KEY, order_id TEXT NOT NULL, amount_cents INTEGER NOT NULL, at REAL NOT NULL);
"""


def effects_db() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ.get("SUPPORT_EFFECTS_DB", "support_effects.db"), timeout=30)
    conn.executescript(_SCHEMA)
    return conn


def count_effects(path: str) -> dict[str, int]:
    """Rows per effects table: what the customer actually experienced."""
    conn = sqlite3.connect(path)
    try:
        conn.executescript(_SCHEMA)
        tables = ("tool_invocations", "charges", "receipts", "refunds")
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}
    finally:
        conn.close()


def _side_effect(tool_name: str, table: str, row: tuple[object, ...], order_id: str, key: str | None) -> None:
    """Log the invocation, then apply the effect once per idempotency key (as a provider would)."""
    delay = float(
        os.environ.get(f"SUPPORT_TOOL_DELAY_{tool_name.upper()}", "") or os.environ.get("SUPPORT_TOOL_DELAY", "0") or 0
    )
    if delay:
        time.sleep(delay)
    conn = effects_db()
    try:
        with conn:
            conn.execute(
                "INSERT INTO tool_invocations (tool, order_id, idempotency_key, at) VALUES (?, ?, ?, ?)",
                (tool_name, order_id, key, time.time()),
            )
            placeholders = ", ".join("?" for _ in range(len(row) + 1))
            conn.execute(f"INSERT OR IGNORE INTO {table} VALUES ({placeholders})", (*row, time.time()))
    finally:
        conn.close()


def _order(order_id: str) -> dict[str, object]:
    if order_id not in ORDERS:
        raise ValueError(f"no order {order_id}")
    return ORDERS[order_id]


@tool
def lookup_order(order_id: str) -> dict[str, object]:
    """Look up an order: amount, customer e-mail, saved card."""
    return {"order_id": order_id, **_order(order_id)}


@tool(side_effects=True, in_doubt="retry")
def charge_card(order_id: str, idempotency_key: str | None = None) -> dict[str, object]:
    """Charge the customer's saved card for the order total."""
    order = _order(order_id)
    _side_effect(
        "charge_card", "charges", (idempotency_key, order_id, order["amount_cents"]), order_id, idempotency_key
    )
    # Like a real provider, a repeated idempotency key gets the original answer, not a second charge.
    return {"status": "succeeded", "amount_cents": order["amount_cents"], "card": order["card"]}


@tool(side_effects=True, in_doubt="retry")
def send_receipt(order_id: str, idempotency_key: str | None = None) -> dict[str, object]:
    """E-mail the receipt for the order."""
    order = _order(order_id)
    _side_effect("send_receipt", "receipts", (idempotency_key, order_id, order["email"]), order_id, idempotency_key)
    return {"sent_to": order["email"]}


@tool(side_effects=True, in_doubt="interrupt")
def refund_payment(order_id: str, idempotency_key: str | None = None) -> dict[str, object]:
    """Refund the order's payment to the saved card."""
    order = _order(order_id)
    _side_effect(
        "refund_payment", "refunds", (idempotency_key, order_id, order["amount_cents"]), order_id, idempotency_key
    )
    return {"status": "refunded", "amount_cents": order["amount_cents"]}


def _call(call_id: str, name: str, **arguments: object) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=json.dumps(arguments))


def support_model(messages: Sequence[Message]) -> Message:
    """What a tool-calling LLM would answer here, made deterministic."""
    last = messages[-1]
    if last.role == "user":
        match = re.search(r"order\s*#?(\d+)", last.content, re.IGNORECASE)
        order_id = match.group(1) if match else "4821"
        if "refund" in last.content.lower():
            return assistant(tool_calls=[_call("call_1", "refund_payment", order_id=order_id)])
        return assistant(
            tool_calls=[
                _call("call_1", "lookup_order", order_id=order_id),
                _call("call_2", "charge_card", order_id=order_id),
                _call("call_3", "send_receipt", order_id=order_id),
            ]
        )
    results = []
    for message in reversed(messages):
        if message.role != "tool":
            break
        results.append(f"{message.name}: {message.content}")
    return assistant("Done. " + " | ".join(reversed(results)))


tools = ToolNode([lookup_order, charge_card, send_receipt, refund_payment])

graph = StateGraph()
graph.add_node("model", ScriptedModel(support_model))
graph.add_node("tools", tools)
graph.add_edge(START, "model")
graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
graph.add_edge("tools", "model")

# The graph reference used by the CLI, the runner pod and examples/agentrun.yaml.
app = graph.compile()
