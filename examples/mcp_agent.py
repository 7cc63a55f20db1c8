"""An agent whose tools come from an MCP server, as README's "Using your MCP servers" shows it
(``spec.graph: examples.mcp_agent:app``; ``pip install 'agentrun[mcp]'``).

The tools are listed at import, at module level, with the blocking ``mcp_tools()``: in a runner pod the
module is imported inside the runner's event loop, where the listing runs on a thread of its own, and the
calls then share one session opened on the run's loop. The server is ``examples.billing_mcp``:

- by default started by the runner as a child process over stdio (the pod's own Python);
- with ``BILLING_MCP_URL`` set (``http://billing:8000/mcp``), reached over streamable HTTP: a server of its
  own, a Service in a cluster.

``charge_card`` is declared a side effect with the in-doubt policy ``retry``: an intent is recorded before
the call, its result as soon as it returns, so a pod killed after the charge returned replays it from the
ledger on resume instead of charging again, and a pod killed while the call was in flight retries it with
the SAME idempotency key (the server sees it in the request metadata and as ``idempotency_key``).

    python -m examples.mcp_agent    # from the repository root: a turn on ./agentrun.db, charges: BILLING_CHARGES_FILE
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from agentrun import END, START, Message, StateGraph, ToolCall, ToolNode, assistant, tools_condition
from agentrun.integrations.mcp import MCPServer, mcp_tools
from agentrun.models import ScriptedModel

ROOT = Path(__file__).resolve().parents[1]
# What the stdio server may see of the pod's environment: its own settings, never the store's DSN.
_SERVER_ENV = ("PATH", "PYTHONPATH", "HOME", "BILLING_CHARGES_FILE", "BILLING_CHARGE_SECONDS")


def billing_server() -> MCPServer:
    if url := os.environ.get("BILLING_MCP_URL"):
        return MCPServer.http(url, name="billing")
    env = {k: v for k, v in os.environ.items() if k in _SERVER_ENV}
    return MCPServer.stdio(sys.executable, "-m", "examples.billing_mcp", env=env, cwd=ROOT, name="billing")


billing = billing_server()
tools = mcp_tools(billing, side_effects={"charge_card": "retry"}, timeouts={"charge_card": 60, "lookup_order": 10})


def _call(call_id: str, name: str, **arguments: object) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=json.dumps(arguments))


def billing_model(messages: Sequence[Message]) -> Message:
    """What a tool-calling LLM would answer here, made deterministic."""
    last = messages[-1]
    if last.role == "user":
        match = re.search(r"order\s*#?(\d+)", last.content, re.IGNORECASE)
        order_id = match.group(1) if match else "4821"
        calls = [_call("call_1", "lookup_order", order_id=order_id), _call("call_2", "charge_card", order_id=order_id)]
        return assistant(tool_calls=calls)
    results = [f"{m.name}: {m.content}" for m in messages if m.role == "tool"]
    return assistant("Done. " + " | ".join(results[-2:]))


graph = StateGraph()
graph.add_node("model", ScriptedModel(billing_model))
graph.add_node("tools", ToolNode(tools))
graph.add_edge(START, "model")
graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
graph.add_edge("tools", "model")
app = graph.compile()  # no checkpointer: an AgentRun gives it the run's store

if __name__ == "__main__":
    from agentrun import SqliteCheckpointer

    local = graph.compile(checkpointer=SqliteCheckpointer("agentrun.db"))
    thread = sys.argv[1] if len(sys.argv) > 1 else "mcp-order-4821"
    result = local.invoke("charge my saved card for order 4821", {"thread_id": thread})
    print(result["messages"][-1].content)
