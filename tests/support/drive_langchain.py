"""A graph whose tools are LangChain tools (a ``@tool`` and a ``StructuredTool``), run once in this process.

    python -m tests.support.drive_langchain STORE_URL THREAD_ID [--input TEXT]

The model asks for both tools in ONE message, so they run in parallel; both
are side-effect tools (in-doubt policy ``retry``) that append one line per
EXECUTION, with the idempotency key they got, to ``LC_EFFECTS_FILE``. Used
by the crash tests; prints the final messages as one ``FINAL`` JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence

from langchain_core.tools import StructuredTool
from langchain_core.tools import tool as lc_tool

from agentrun import END, START, Message, StateGraph, ToolCall, ToolNode, assistant, tools_condition
from agentrun.checkpoint import from_url
from agentrun.engine import CompiledGraph
from agentrun.integrations.langchain import from_langchain_tool
from agentrun.models import ScriptedModel


def _effect(name: str, order_id: str, key: str | None) -> None:
    with open(os.environ["LC_EFFECTS_FILE"], "a") as f:
        f.write(json.dumps({"tool": name, "order_id": order_id, "key": key}) + "\n")


@lc_tool
def charge(order_id: str, idempotency_key: str | None = None) -> str:
    """Charge the customer's card for the order."""
    _effect("charge", order_id, idempotency_key)
    return f"charged order {order_id}"


async def _send_receipt(order_id: str, idempotency_key: str | None = None) -> str:
    await asyncio.to_thread(_effect, "send_receipt", order_id, idempotency_key)
    return f"receipt for {order_id} sent"


send_receipt = StructuredTool.from_function(
    coroutine=_send_receipt, name="send_receipt", description="E-mail the receipt for the order."
)


def respond(messages: Sequence[Message]) -> Message:
    if messages[-1].role == "user":
        args = json.dumps({"order_id": "4821"})
        return assistant(
            tool_calls=[
                ToolCall(id="call_1", name="charge", arguments=args),
                ToolCall(id="call_2", name="send_receipt", arguments=args),
            ]
        )
    return assistant("done: " + " | ".join(m.content for m in messages if m.role == "tool"))


def build() -> StateGraph:
    graph = StateGraph()
    graph.add_node("model", ScriptedModel(respond))
    tools = [from_langchain_tool(t, side_effects=True, in_doubt="retry") for t in (charge, send_receipt)]
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph


async def drive(store: str, thread_id: str, text: str | None) -> None:
    checkpointer = from_url(store)
    app = CompiledGraph(build(), checkpointer=checkpointer, name="langchain")
    try:
        values = await app.ainvoke(text, {"thread_id": thread_id})
    finally:
        await checkpointer.aclose()
    summary = [{"role": m.role, "content": m.content, "error": m.is_error} for m in values["messages"]]
    print("FINAL " + json.dumps(summary), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("thread_id")
    parser.add_argument("--input")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(drive(args.store, args.thread_id, args.input))
    return 0


if __name__ == "__main__":
    sys.exit(main())
