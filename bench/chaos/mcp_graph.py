"""The fault campaign's agent with its first round on an MCP server: the scenario of ``MCP_SIBLING_TIMEOUT``.

The same model and second round as ``bench.chaos.graph``; ``lookup_order``, ``charge_card``,
``send_receipt`` and ``fraud_check`` are the tools of ``bench.chaos.mcp_server``, started
over stdio by the runner and reached through one session. ``fraud_check`` has its own
deadline (``DEADLINE_SECONDS``, ``timeouts=``) and never answers; the other three are
side-effect tools with in-doubt policy ``retry``, like their native twins. What must hold:
the deadline cancels ``fraud_check`` alone, ``charge_card`` (in flight on the same session)
answers and is recorded, once.
"""

from __future__ import annotations

import os
import sys

from agentrun import END, START, StateGraph, ToolNode, tools_condition
from agentrun.integrations.mcp import MCPServer, mcp_tools
from agentrun.models import ScriptedModel

from .graph import add_note, approve_refund, chaos_model
from .plan import DEADLINE_SECONDS, DEADLINE_TOOL

# The server's environment is the runner's: CHAOS_EFFECTS, CHAOS_TOOL_SECONDS, AGENTRUN_ATTEMPT, PYTHONPATH.
server = MCPServer.stdio(sys.executable, "-m", "bench.chaos.mcp_server", env=dict(os.environ), name="chaos-mcp")
tools = mcp_tools(
    server,
    side_effects=dict.fromkeys(("lookup_order", "charge_card", "send_receipt"), "retry"),
    timeouts={DEADLINE_TOOL: DEADLINE_SECONDS},
)

graph = StateGraph()
graph.add_node("model", ScriptedModel(chaos_model))
graph.add_node("tools", ToolNode([*tools, add_note, approve_refund]))
graph.add_edge(START, "model")
graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
graph.add_edge("tools", "model")

app = graph.compile()
