"""A real MCP server (the ``mcp`` SDK's FastMCP) for the adapter's integration tests.

    python -m tests.support.mcp_server stdio
    python -m tests.support.mcp_server http PORT      # streamable HTTP on 127.0.0.1 only, path /mcp

``charge`` appends one line per EXECUTION to ``MCP_CHARGES_FILE``: the
idempotency key it got as an argument and the one it found in the request
metadata, so a test counts executions and distinct keys. With ``seconds`` it
then takes that long to answer (the card is charged, the answer is late),
except for a key it has charged before: a retry with a known key answers at
once, as a payment API that deduplicates would. ``hang`` never answers; when
the client cancels it (MCP ``notifications/cancelled``) it appends one line to
``MCP_CANCELS_FILE``. ``slow`` writes the server's pid to ``MCP_PID_FILE`` and
then sleeps, so a test can kill the server mid-call.
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


def _append(path: str, record: dict[str, object]) -> None:
    """One line, at once (a test may kill the server right after)."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _charged_before(key: str | None) -> bool:
    path = os.environ["MCP_CHARGES_FILE"]
    if key is None or not os.path.exists(path):
        return False
    with open(path) as f:
        return any(json.loads(line)["argument"] == key for line in f)


@server.tool()
async def charge(order_id: str, ctx: Context, idempotency_key: str | None = None, seconds: float = 0) -> str:  # type: ignore[type-arg]
    """Charge the customer's card for the order."""
    known = _charged_before(idempotency_key)
    # The pid first: a test that kills the server once it sees the charge must find the pid written.
    await anyio.Path(os.environ["MCP_PID_FILE"]).write_text(str(os.getpid()))
    _append(os.environ["MCP_CHARGES_FILE"], {"order_id": order_id, "argument": idempotency_key, "meta": _meta_key(ctx)})
    if seconds and not known:
        await anyio.sleep(seconds)
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
    try:
        await anyio.sleep(3600)
    except anyio.get_cancelled_exc_class():
        _append(os.environ["MCP_CANCELS_FILE"], {"tool": "hang", "pid": os.getpid()})
        raise
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
