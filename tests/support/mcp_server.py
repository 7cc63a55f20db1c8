"""A real MCP server (the ``mcp`` SDK's FastMCP) for the adapter's integration tests.

    python -m tests.support.mcp_server stdio
    python -m tests.support.mcp_server http PORT      # streamable HTTP on 127.0.0.1 only, path /mcp

``charge`` appends one line per EXECUTION to ``MCP_CHARGES_FILE``: the
idempotency key it got as an argument and the one it found in the request
metadata, so a test counts executions and distinct keys. ``hang`` never
answers; ``slow`` writes the server's pid to ``MCP_PID_FILE`` and then
sleeps, so a test can kill the server mid-call.
"""

from __future__ import annotations

import json
import os
import sys

import anyio
from mcp.server.fastmcp import Context, FastMCP

server = FastMCP("agentrun-test", host="127.0.0.1")


def _meta_key(ctx: Context) -> str | None:  # type: ignore[type-arg]
    meta = ctx.request_context.meta
    extra = (meta.model_extra or {}) if meta is not None else {}
    value = extra.get("agentrun/idempotency-key")
    return value if isinstance(value, str) else None


@server.tool()
def charge(order_id: str, ctx: Context, idempotency_key: str | None = None) -> str:  # type: ignore[type-arg]
    """Charge the customer's card for the order."""
    with open(os.environ["MCP_CHARGES_FILE"], "a") as f:
        f.write(json.dumps({"order_id": order_id, "argument": idempotency_key, "meta": _meta_key(ctx)}) + "\n")
    return json.dumps({"status": "succeeded", "order_id": order_id})


@server.tool()
def lookup(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: 49.99 EUR"


@server.tool()
def refuse(order_id: str) -> str:
    """Always fails."""
    raise ValueError(f"order {order_id} is locked")


@server.tool()
async def hang() -> str:
    """Never answers."""
    await anyio.sleep(3600)
    return "never"


@server.tool()
async def slow(seconds: float) -> str:
    """Sleeps, after telling the test its pid."""
    await anyio.Path(os.environ["MCP_PID_FILE"]).write_text(str(os.getpid()))
    await anyio.sleep(seconds)
    return "slept"


def main() -> None:
    if sys.argv[1] == "http":
        server.settings.port = int(sys.argv[2])
        server.run(transport="streamable-http")
    else:
        server.run(transport="stdio")


if __name__ == "__main__":
    main()
