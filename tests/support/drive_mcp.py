"""Run a graph whose tools come from the test MCP server, once, in this process; used by the crash tests.

    python -m tests.support.drive_mcp STORE_URL THREAD_ID (--stdio | --url URL) [--input TEXT]

The model asks for ``charge`` and ``lookup`` in one message; ``charge`` is
declared a side-effect tool with in-doubt policy ``retry``. Without --input
it resumes the thread's unfinished run. Prints the final messages as one
``FINAL`` JSON line; exit 0 when the run completed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence

from agentrun import END, START, Message, StateGraph, ToolCall, ToolNode, assistant, tools_condition
from agentrun.checkpoint import from_url
from agentrun.engine import CompiledGraph
from agentrun.integrations.mcp import MCPServer, mcp_tools
from agentrun.models import ScriptedModel


def respond(messages: Sequence[Message]) -> Message:
    if messages[-1].role == "user":
        return assistant(
            tool_calls=[
                ToolCall(id="call_1", name="charge", arguments=json.dumps({"order_id": "4821"})),
                ToolCall(id="call_2", name="lookup", arguments=json.dumps({"order_id": "4821"})),
            ]
        )
    return assistant("done: " + " | ".join(m.content for m in messages if m.role == "tool"))


def build(server: MCPServer) -> StateGraph:
    graph = StateGraph()
    graph.add_node("model", ScriptedModel(respond))
    graph.add_node("tools", ToolNode(mcp_tools(server, side_effects={"charge": "retry"}, include=["charge", "lookup"])))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph


async def drive(app: CompiledGraph, server: MCPServer, thread_id: str, text: str | None) -> None:
    try:
        values = await app.ainvoke(text, {"thread_id": thread_id})
    finally:
        await server.aclose()
    summary = [{"role": m.role, "content": m.content, "error": m.is_error} for m in values["messages"]]
    print("FINAL " + json.dumps(summary), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("thread_id")
    parser.add_argument("--input")
    parser.add_argument("--url")
    parser.add_argument("--stdio", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    if args.stdio:
        server = MCPServer.stdio(sys.executable, "-m", "tests.support.mcp_server", "stdio", env=dict(os.environ))
    else:
        server = MCPServer.http(args.url)
    checkpointer = from_url(args.store)
    app = CompiledGraph(build(server), checkpointer=checkpointer, name="mcp")

    async def run() -> None:
        try:
            await drive(app, server, args.thread_id, args.input)
        finally:
            await checkpointer.aclose()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
