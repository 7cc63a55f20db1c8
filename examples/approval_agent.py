"""A human in the loop: the refund agent asks a person before it refunds.

A customer writes "please refund order 4821". The model looks the order up
and asks for the refund; the ``refund`` tool calls ``interrupt()`` with what
a person needs to decide (order, amount, customer), and the run pauses: its
pod exits 3 and the AgentRun shows phase ``Interrupted`` with that payload.

    kubectl apply -f examples/approval.yaml
    kubectl agentrun describe refund-order-4821     # what it waits for
    kubectl agentrun approve refund-order-4821      # or: reject, or approve --value '{"amount_cents": 2000}'

The answer goes into ``spec.resume``; a new pod runs the ``tools`` node
again with it. The lookup, which completed before the pause, comes from the
ledger; only the paused call continues: ``true`` refunds the full amount, a
JSON object with ``amount_cents`` refunds that much, anything else declines.
Refunds land in the same stand-in payment provider as the support agent's
(``SUPPORT_EFFECTS_DB``), deduplicated on the idempotency key.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentrun import END, START, Message, StateGraph, ToolCall, ToolNode, assistant, interrupt, tool, tools_condition
from agentrun.models import ScriptedModel
from examples.support_agent import ORDERS, _side_effect, lookup_order


def _amount(decision: Any, full: int) -> int:
    if decision is True:
        return full
    if isinstance(decision, dict) and isinstance(decision.get("amount_cents"), int):
        return min(full, max(0, int(decision["amount_cents"])))
    return 0


@tool(side_effects=True, in_doubt="interrupt")
def refund(order_id: str, idempotency_key: str | None = None) -> dict[str, object]:
    """Refund an order, once a person approved it."""
    order = ORDERS[order_id]
    decision = interrupt(
        {"order_id": order_id, "amount_cents": order["amount_cents"], "customer": order["email"]},
        message=f"refund {int(str(order['amount_cents'])) / 100:.2f} for order {order_id}?",
    )
    cents = _amount(decision, int(str(order["amount_cents"])))
    if not cents:
        return {"status": "declined", "order_id": order_id}
    _side_effect("refund", "refunds", (idempotency_key, order_id, cents), order_id, idempotency_key)
    return {"status": "refunded", "order_id": order_id, "amount_cents": cents}


def _model(messages: Sequence[Message]) -> Message:
    last = messages[-1]
    if last.role == "user":
        match = re.search(r"\d{4}", last.content or "")
        order_id = match.group(0) if match else "4821"
        return assistant(
            tool_calls=[
                ToolCall(id="call_lookup", name="lookup_order", arguments=f'{{"order_id": "{order_id}"}}'),
                ToolCall(id="call_refund", name="refund", arguments=f'{{"order_id": "{order_id}"}}'),
            ]
        )
    outcome = next((m.content for m in reversed(messages) if m.role == "tool" and "status" in (m.content or "")), "")
    if '"refunded"' in (outcome or ""):
        return assistant("Your refund is on its way.")
    return assistant("Your refund was not approved; a colleague will contact you.")


graph = StateGraph()
graph.add_node("model", ScriptedModel(_model))
graph.add_node("tools", ToolNode([lookup_order, refund]))
graph.add_edge(START, "model")
graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
graph.add_edge("tools", "model")
app = graph.compile()
