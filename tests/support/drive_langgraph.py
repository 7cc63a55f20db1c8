"""The seed's support scenario in plain LangGraph, run once in this process (the crash tests' child).

    python -m tests.support.drive_langgraph SAVER STORE THREAD_ID [--input TEXT] [--mode invoke|stream]

A ``StateGraph(MessagesState)``: a scripted model asks for THREE tools in one
assistant message (``lookup_order``, ``charge_card``, ``send_receipt``), a
tool node runs them in parallel, the model answers. ``SAVER``:

- ``agentrun``: ``AgentrunSaver`` on our store (``STORE``: ``sqlite:///...`` or
  ``postgresql://...``) and ``LedgerToolNode`` (charge_card and send_receipt
  with side effects, in-doubt policy retry);
- ``langgraph-postgres``: LangGraph's own ``AsyncPostgresSaver`` on ``STORE``
  and LangGraph's plain ``ToolNode``; the fault point ``after_tool`` fires
  from a wrapper right after a tool returned (there is no ledger to record in).

Every EXECUTION of a tool appends one line (tool, idempotency key) to
``LG_EFFECTS_FILE``; ``charge_card`` takes longer than its siblings, so a kill
right after it returned finds them finished. Prints the final messages as one
``FINAL`` JSON line. Checkpoints are written with ``durability="sync"``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from agentrun.faults import fault_point


def _key() -> str | None:
    """The call's idempotency key under agentrun's LedgerToolNode; plain LangGraph has none."""
    try:
        from agentrun.integrations.langgraph import current_idempotency_key
    except ImportError:
        return None
    return current_idempotency_key()


def _effect(name: str, key: str | None) -> None:
    with open(os.environ["LG_EFFECTS_FILE"], "a") as f:
        f.write(json.dumps({"tool": name, "key": key}) + "\n")


@tool
async def lookup_order(order_id: str) -> str:
    """Look the order up."""
    _effect("lookup_order", _key())
    return f"order {order_id}: 49.99 EUR"


@tool
async def charge_card(order_id: str, amount_cents: int) -> str:
    """Charge the customer's card."""
    await asyncio.sleep(0.3)  # the slowest sibling: when it returns, the others have
    _effect("charge_card", _key())
    return f"charged {amount_cents} cents for order {order_id}"


@tool
async def send_receipt(order_id: str) -> str:
    """E-mail the receipt."""
    _effect("send_receipt", _key())
    return f"receipt for {order_id} sent"


TOOLS = [lookup_order, charge_card, send_receipt]


def model(state: MessagesState) -> dict[str, list[BaseMessage]]:
    last = state["messages"][-1]
    if isinstance(last, HumanMessage):
        calls = [
            {"id": "call_1", "name": "lookup_order", "args": {"order_id": "4821"}},
            {"id": "call_2", "name": "charge_card", "args": {"order_id": "4821", "amount_cents": 4999}},
            {"id": "call_3", "name": "send_receipt", "args": {"order_id": "4821"}},
        ]
        return {"messages": [AIMessage(content="", tool_calls=calls)]}
    results = [str(m.content) for m in state["messages"] if isinstance(m, ToolMessage)]
    return {"messages": [AIMessage(content="done: " + " | ".join(results))]}


async def _die_after_tool(request: ToolCallRequest, execute: Any) -> ToolMessage | Command[Any]:
    result: ToolMessage | Command[Any] = await execute(request)
    fault_point("after_tool", request.tool_call["name"])
    return result


def build(saver_kind: str) -> StateGraph[MessagesState]:
    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    if saver_kind == "agentrun":
        from agentrun.integrations.langgraph import LedgerToolNode

        graph.add_node(
            "tools",
            LedgerToolNode(
                TOOLS,
                side_effects={"charge_card", "send_receipt"},
                in_doubt={"charge_card": "retry", "send_receipt": "retry"},
            ),
        )
    else:
        graph.add_node("tools", ToolNode(TOOLS, awrap_tool_call=_die_after_tool))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph


async def _run(saver: BaseCheckpointSaver[Any], saver_kind: str, thread_id: str, text: str | None, mode: str) -> None:
    app = build(saver_kind).compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": thread_id}}
    payload: Any = None if text is None else {"messages": [HumanMessage(content=text)]}
    if mode == "stream":
        async for _ in app.astream(payload, config, stream_mode="updates", durability="sync"):
            pass
        values = (await app.aget_state(config)).values
    else:
        values = await app.ainvoke(payload, config, durability="sync")
    summary = [{"type": m.type, "content": m.content} for m in values["messages"]]
    print("FINAL " + json.dumps(summary), flush=True)


async def drive(
    saver_kind: str, store: str, thread_id: str, text: str | None, mode: str, hold: float | None = None
) -> None:
    if saver_kind == "agentrun":
        from agentrun.integrations.langgraph import AgentrunSaver

        saver = AgentrunSaver.from_url(store) if hold is None else AgentrunSaver.from_url(store, hold_writes=hold)
        await saver.setup()
        try:
            await _run(saver, saver_kind, thread_id, text, mode)
        finally:
            await saver.aclose()
        return
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    async with AsyncPostgresSaver.from_conn_string(store) as pg_saver:
        await pg_saver.setup()
        await _run(pg_saver, saver_kind, thread_id, text, mode)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("saver", choices=["agentrun", "langgraph-postgres"])
    parser.add_argument("store")
    parser.add_argument("thread_id")
    parser.add_argument("--input")
    parser.add_argument("--mode", choices=["invoke", "stream"], default="invoke")
    # AgentrunSaver's hold_writes (seconds): a crash test at the hold's fault points makes it long, so that a
    # loaded machine cannot let a task's writes go alone before the checkpoint that should carry them.
    parser.add_argument("--hold", type=float)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(drive(args.saver, args.store, args.thread_id, args.input, args.mode, args.hold))
    return 0


if __name__ == "__main__":
    sys.exit(main())
