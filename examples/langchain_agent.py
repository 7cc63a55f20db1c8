"""The support agent with LangChain tools and a LangChain chat model on agentrun's engine
(``spec.graph: examples.langchain_agent:app``; ``pip install 'agentrun[langchain]'``).

Your LangChain tools go into agentrun's ``ToolNode`` as they are; the ones with side effects are declared
so with ``tool(lc_tool, side_effects=True, in_doubt=...)``: an intent before the call, the result in the
ledger as soon as it returns, and the call's idempotency key as the tool's ``idempotency_key`` argument.
Any LangChain chat model becomes the model node through ``LangChainChatModel`` (its token usage is
counted); here a small deterministic one stands in for ``ChatOpenAI(model=...)`` so the example runs
without a network or a key.

Effects go to the same SQLite "provider" tables as ``examples.support_agent`` (``SUPPORT_EFFECTS_DB``),
deduplicated on the idempotency key.

    python -m examples.langchain_agent      # from the repository root: runs a turn on ./agentrun.db
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool as langchain_tool

from agentrun import END, START, StateGraph, ToolNode, tool, tools_condition
from agentrun.models.langchain import LangChainChatModel
from examples.support_agent import ORDERS, effects_db


def _charge(order_id: str, idempotency_key: str | None) -> None:
    """One invocation logged, one charge per idempotency key (as a provider would)."""
    conn = effects_db()
    try:
        with conn:
            conn.execute(
                "INSERT INTO tool_invocations (tool, order_id, idempotency_key, at) VALUES (?, ?, ?, ?)",
                ("charge_card", order_id, idempotency_key, time.time()),
            )
            amount = ORDERS[order_id]["amount_cents"]
            conn.execute(
                "INSERT OR IGNORE INTO charges VALUES (?, ?, ?, ?)", (idempotency_key, order_id, amount, time.time())
            )
    finally:
        conn.close()


@langchain_tool
def lookup_order(order_id: str) -> str:
    """Look up an order: amount and saved card."""
    order = ORDERS[order_id]
    return f"order {order_id}: {order['amount_cents']} cents, card {order['card']}"


@langchain_tool
def charge_card(order_id: str, idempotency_key: str | None = None) -> str:
    """Charge the customer's saved card for the order total."""
    _charge(order_id, idempotency_key)
    return f"charged {ORDERS[order_id]['amount_cents']} cents to {ORDERS[order_id]['card']}"


class SupportChatModel(BaseChatModel):
    """What a tool-calling chat model would answer here, made deterministic (a LangChain model all the same)."""

    @property
    def _llm_type(self) -> str:
        return "support-scripted"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        last = messages[-1]
        if isinstance(last, HumanMessage):
            match = re.search(r"order\s*#?(\d+)", str(last.content), re.IGNORECASE)
            order = {"order_id": match.group(1) if match else "4821"}
            calls = [
                {"id": "call_1", "name": "lookup_order", "args": order},
                {"id": "call_2", "name": "charge_card", "args": order},
            ]
            reply = AIMessage(content="", tool_calls=calls)
        else:
            results = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
            reply = AIMessage(content="Done: " + "; ".join(results[-2:]))
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self  # it knows its two tools; a real model gets their schemas here


tools = [tool(lookup_order), tool(charge_card, side_effects=True, in_doubt="retry")]

graph = StateGraph()
graph.add_node("model", LangChainChatModel(SupportChatModel(), tools=tools, model_label="support-scripted"))
graph.add_node("tools", ToolNode(tools))
graph.add_edge(START, "model")
graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
graph.add_edge("tools", "model")
app = graph.compile()  # no checkpointer: an AgentRun gives it the run's store

if __name__ == "__main__":
    from agentrun import SqliteCheckpointer

    local = graph.compile(checkpointer=SqliteCheckpointer("agentrun.db"))
    thread = sys.argv[1] if len(sys.argv) > 1 else "langchain-order-4821"
    result = local.invoke("charge my saved card for order 4821", {"thread_id": thread})
    print(result["messages"][-1].content)
