"""The MCP scenario's server: the first round's tools, and ``fraud_check``, over stdio (FastMCP).

    python -m bench.chaos.mcp_server      # started by bench.chaos.mcp_graph in the runner pod

``lookup_order``, ``charge_card`` and ``send_receipt`` do what the native tools of
``bench.chaos.graph`` do (one ``begin`` line, half the body, the ``effect`` line, the other
half; the idempotency key comes as their ``idempotency_key`` argument), asynchronously, so
the server runs the calls of a round at the same time. ``fraud_check`` never answers: it
writes its ``begin`` line and waits until it is cancelled. ``charge_card``, after its side
effect, waits (at most ``DEADLINE_SECONDS + 20`` s) until ``fraud_check`` has been cancelled
before it answers, so the deadline always falls while the charge is in flight on the same
session: the scenario of the fault kind ``mcp_call_past_its_deadline_beside_a_charge``.

Two more kinds of line (no side effects; ``begin`` holds the moment): ``cancelled``, when
``fraud_check``'s task is cancelled (by the client's ``notifications/cancelled`` or by the
server shutting down), and ``answered``, when ``charge_card`` returns. The campaign counts
the scenario as having happened when a charge answered after a cancellation, in one server.
"""

from __future__ import annotations

import json
import os
import time

import anyio
from mcp.server.fastmcp import FastMCP

from .graph import ORDER, TOOL_SECONDS, _line
from .plan import DEADLINE_SECONDS, DEADLINE_TOOL

server = FastMCP("agentrun-chaos")
_cancelled: list[anyio.Event] = []  # created on the server's loop, on first use


def _fraud_check_cancelled() -> anyio.Event:
    if not _cancelled:
        _cancelled.append(anyio.Event())
    return _cancelled[0]


async def _execute(name: str, idem: str | None, *, wait_for_cancel: bool = False) -> None:
    begin = time.time()
    _line("begin", name, idem, begin)
    half = float(os.environ.get(TOOL_SECONDS, "0.4") or 0) / 2
    await anyio.sleep(half)
    _line("effect", name, idem, begin)
    if wait_for_cancel:
        with anyio.move_on_after(DEADLINE_SECONDS + 20):
            await _fraud_check_cancelled().wait()
    await anyio.sleep(half)


@server.tool()
async def lookup_order(order_id: str, idempotency_key: str | None = None) -> str:
    """Look up an order: amount, customer e-mail, saved card."""
    await _execute("lookup_order", idempotency_key)
    return json.dumps({"order_id": order_id, **ORDER})


@server.tool()
async def charge_card(order_id: str, idempotency_key: str | None = None) -> str:
    """Charge the customer's saved card for the order total."""
    await _execute("charge_card", idempotency_key, wait_for_cancel=True)
    _line("answered", "charge_card", idempotency_key, time.time())
    return json.dumps({"status": "succeeded", "order_id": order_id, "amount_cents": ORDER["amount_cents"]})


@server.tool()
async def send_receipt(order_id: str, idempotency_key: str | None = None) -> str:
    """E-mail the receipt for the order."""
    await _execute("send_receipt", idempotency_key)
    return json.dumps({"sent_to": ORDER["email"], "order_id": order_id})


@server.tool(name=DEADLINE_TOOL)
async def fraud_check(order_id: str) -> str:
    """Ask the fraud service about the order (it never answers)."""
    _line("begin", DEADLINE_TOOL, None, time.time())
    try:
        await anyio.sleep(3600)
    except anyio.get_cancelled_exc_class():
        _line("cancelled", DEADLINE_TOOL, None, time.time())
        _fraud_check_cancelled().set()
        raise
    return f"order {order_id}: no fraud"


if __name__ == "__main__":
    server.run(transport="stdio")
