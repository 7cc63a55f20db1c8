"""The support agent in plain LangGraph, run as an AgentRun (``spec.graph: examples.langgraph_support_agent:app``).

Nothing agentrun-specific but the tool node: ``LedgerToolNode`` instead of
LangGraph's ``ToolNode``, so a pod killed after ``charge_card`` returned does
not charge the card again on resume. Compile WITHOUT a checkpointer: the
runner gives the graph ``AgentrunSaver`` on the run's store.

The scripted model (no network) answers "charge ... order 4821" with ONE
assistant message holding three tool calls (``lookup_order``,
``charge_card``, ``send_receipt``), and "refund ... order 4821" with
``refund_payment``, which asks a human first (LangGraph ``interrupt()``:
the AgentRun waits; ``kubectl agentrun approve`` resumes it). Effects go to
the same SQLite "provider" tables as ``examples.support_agent``
(``SUPPORT_EFFECTS_DB``), deduplicated on the idempotency key;
``SUPPORT_TOOL_DELAY`` slows the side-effect tools (async sleeps, so a stop
cancels them at once).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import interrupt

from agentrun.integrations.langgraph import LedgerToolNode, current_idempotency_key
from examples.support_agent import ORDERS, effects_db


async def _side_effect(tool_name: str, table: str, row: tuple[object, ...], order_id: str) -> None:
    """Log the invocation, then apply the effect once per idempotency key (as a provider would)."""
    delay = float(os.environ.get("SUPPORT_TOOL_DELAY", "0") or 0)
    if delay:
        await asyncio.sleep(delay)
    key = current_idempotency_key()

    def write() -> None:
        conn = effects_db()
        try:
            with conn:
                conn.execute(
                    "INSERT INTO tool_invocations (tool, order_id, idempotency_key, at) VALUES (?, ?, ?, ?)",
                    (tool_name, order_id, key, time.time()),
                )
                placeholders = ", ".join("?" for _ in range(len(row) + 2))
                conn.execute(f"INSERT OR IGNORE INTO {table} VALUES ({placeholders})", (key, *row, time.time()))
        finally:
            conn.close()

    await asyncio.to_thread(write)


@tool
async def lookup_order(order_id: str) -> str:
    """Look up an order: amount, customer e-mail, saved card."""
    order = ORDERS[order_id]
    return f"order {order_id}: {order['amount_cents']} cents, card {order['card']}"


@tool
async def charge_card(order_id: str) -> str:
    """Charge the customer's saved card for the order total."""
    order = ORDERS[order_id]
    await _side_effect("charge_card", "charges", (order_id, order["amount_cents"]), order_id)
    return f"charged {order['amount_cents']} cents to {order['card']}"


@tool
async def send_receipt(order_id: str) -> str:
    """E-mail the receipt for the order."""
    order = ORDERS[order_id]
    await _side_effect("send_receipt", "receipts", (order_id, order["email"]), order_id)
    return f"receipt sent to {order['email']}"


@tool
async def refund_payment(order_id: str) -> str:
    """Refund the order's payment, once a human approved it."""
    order = ORDERS[order_id]
    answer = interrupt({"question": f"refund {order['amount_cents']} cents for order {order_id}?"})
    # kubectl agentrun approve sends true, reject false; another --value is the reviewer's note.
    if answer is not True and str(answer).lower() not in ("approve", "approved", "yes"):
        return f"refund not approved: {answer}"
    await _side_effect("refund_payment", "refunds", (order_id, order["amount_cents"]), order_id)
    return f"refunded {order['amount_cents']} cents"


def model(state: MessagesState) -> dict[str, Any]:
    """What a tool-calling LLM would answer here, made deterministic."""
    last = state["messages"][-1]
    if isinstance(last, HumanMessage):
        text = str(last.content)
        match = re.search(r"order\s*#?(\d+)", text, re.IGNORECASE)
        order = {"order_id": match.group(1) if match else "4821"}
        if "refund" in text.lower():
            calls = [{"id": "call_1", "name": "refund_payment", "args": order}]
        else:
            calls = [
                {"id": "call_1", "name": "lookup_order", "args": order},
                {"id": "call_2", "name": "charge_card", "args": order},
                {"id": "call_3", "name": "send_receipt", "args": order},
            ]
        return {"messages": [AIMessage(content="", tool_calls=calls)]}
    results = [str(m.content) for m in state["messages"] if isinstance(m, ToolMessage)]
    return {"messages": [AIMessage(content="Done: " + "; ".join(results[-3:]))]}


graph = StateGraph(MessagesState)
graph.add_node("model", model)
graph.add_node(
    "tools",
    LedgerToolNode(
        [lookup_order, charge_card, send_receipt, refund_payment],
        side_effects={"charge_card", "send_receipt", "refund_payment"},
        in_doubt={"charge_card": "retry", "send_receipt": "retry"},
    ),
)
graph.add_edge(START, "model")
graph.add_conditional_edges("model", tools_condition)
graph.add_edge("tools", "model")
app = graph.compile()
