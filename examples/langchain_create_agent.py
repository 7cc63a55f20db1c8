"""The support agent built with LangChain's ``create_agent``, run as an AgentRun
(``spec.graph: examples.langchain_create_agent:app``; ``pip install 'agentrun[langgraph]'``).

``create_agent`` builds its own tool node, so agentrun's ledger comes in as middleware:
``LedgerMiddleware`` (listed first) records each tool call the moment it returns and answers it
from the ledger on a replay, so a pod killed after ``charge_card`` returned does not charge the card
again. The tools are ``examples.langgraph_support_agent``'s (they read ``current_idempotency_key()``
and deduplicate on it, as a payment provider would); ``SupportChatModel`` stands in for
``ChatOpenAI(model=...)`` so the example runs without a network or a key: it answers "charge ...
order 4821" with ONE assistant message holding three tool calls, then sums up the results.

Create the agent WITHOUT a checkpointer: the runner gives it ``AgentrunSaver`` on the run's store.

    python -m examples.langchain_create_agent      # from the repository root: one turn on ./agentrun.db
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from agentrun.integrations.langgraph import LedgerMiddleware
from examples.langgraph_support_agent import charge_card, lookup_order, send_receipt


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
                {"id": "call_3", "name": "send_receipt", "args": order},
            ]
            reply = AIMessage(content="", tool_calls=calls)
        else:
            results = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
            reply = AIMessage(content="Done: " + "; ".join(results[-3:]))
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self  # it knows its three tools; a real model gets their schemas here


app = create_agent(
    SupportChatModel(),
    tools=[lookup_order, charge_card, send_receipt],
    system_prompt="You are a support agent. Charge orders only once.",
    # First in the list: the other tool middleware (retries, limits) run inside the recorded call.
    # A call that started but never returned runs again with its idempotency key (the provider deduplicates).
    middleware=[
        LedgerMiddleware(
            side_effects={"charge_card", "send_receipt"}, in_doubt={"charge_card": "retry", "send_receipt": "retry"}
        )
    ],
)


async def _main(thread: str) -> None:
    from agentrun.integrations.langgraph import AgentrunSaver

    async with AgentrunSaver.from_url("sqlite:///agentrun.db") as saver:
        local = app.copy(update={"checkpointer": saver})  # as the runner does with the run's store
        result = await local.ainvoke(
            {"messages": [HumanMessage("charge my saved card for order 4821")]},
            {"configurable": {"thread_id": thread}},
        )
        print(result["messages"][-1].content)


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1] if len(sys.argv) > 1 else "create-agent-order-4821"))
