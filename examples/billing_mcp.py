"""A stand-in payment provider as an MCP server (the ``mcp`` SDK's FastMCP), used by ``examples.mcp_agent``.

    python -m examples.billing_mcp                 # stdio: what MCPServer.stdio(...) starts
    python -m examples.billing_mcp http 8000       # streamable HTTP on 127.0.0.1:8000, path /mcp

``charge_card`` appends one JSON line per EXECUTION to ``BILLING_CHARGES_FILE``
(default ``/tmp/billing_charges.jsonl``) with the idempotency key it got, so a
demo or a test counts how often the card was really charged. Like a real
provider, a key it has seen before answers with the first charge instead of
charging again (the line says ``"repeat": true``). ``BILLING_CHARGE_SECONDS``
makes each charge take that long (for killing the agent mid-call).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import anyio
from mcp.server.fastmcp import Context, FastMCP

ORDERS = {"4821": {"amount_cents": 4999, "card": "visa-4242"}}
IDEMPOTENCY_META_KEY = "agentrun/idempotency-key"  # where agentrun also puts the key (request metadata)

server = FastMCP("billing", host="127.0.0.1")


def charges_file() -> Path:
    return Path(os.environ.get("BILLING_CHARGES_FILE", "/tmp/billing_charges.jsonl"))


def charges(path: Path | None = None) -> list[dict[str, object]]:
    """Every execution of ``charge_card`` so far, oldest first."""
    path = path or charges_file()
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _order(order_id: str) -> dict[str, object]:
    if order_id not in ORDERS:
        raise ValueError(f"no order {order_id}")
    return ORDERS[order_id]


@server.tool()
def lookup_order(order_id: str) -> str:
    """Look up an order: its amount and the saved card."""
    order = _order(order_id)
    return json.dumps({"order_id": order_id, **order})


@server.tool()
async def charge_card(order_id: str, ctx: Context, idempotency_key: str | None = None) -> str:  # type: ignore[type-arg]
    """Charge the customer's saved card for the order total."""
    order = _order(order_id)
    meta = ctx.request_context.meta
    key = idempotency_key or ((meta.model_extra or {}).get(IDEMPOTENCY_META_KEY) if meta else None)
    repeat = key is not None and any(c.get("idempotency_key") == key for c in charges())
    line = {"order_id": order_id, "idempotency_key": key, "repeat": repeat, "pid": os.getpid(), "at": time.time()}
    with charges_file().open("a") as f:  # one line at once: the caller may be killed right after
        f.write(json.dumps(line) + "\n")
    if seconds := float(os.environ.get("BILLING_CHARGE_SECONDS", "0") or 0):
        await anyio.sleep(seconds)
    return json.dumps({"status": "succeeded", "order_id": order_id, "amount_cents": order["amount_cents"]})


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.settings.port = int(sys.argv[2])
        server.run(transport="streamable-http")
    else:
        server.run(transport="stdio")


if __name__ == "__main__":
    main()
