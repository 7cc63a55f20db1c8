"""A ``create_agent`` agent whose card charges wait for a person: LangChain's ``HumanInTheLoopMiddleware`` on
``charge_card``, agentrun's ``LedgerMiddleware`` for the ledger (``spec.graph: examples.langchain_review:app``).

The model asks to charge the order the customer named; the run pauses (phase Interrupted) with the pending
tool call, and a person approves it, rejects it or edits its arguments first: on the run's page (Approve,
Edit, Reject) or with ``kubectl agentrun approve NAME --edit '{"order_id": "4821"}'``. Only then does
``charge_card`` run, once, with the arguments the person sent. ``LedgerMiddleware`` comes first, as always
(``examples.langchain_create_agent``): the charge is recorded the moment it returns, so a pod lost after it
does not charge the card again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from agentrun.integrations.langgraph import LedgerMiddleware
from examples.langgraph_support_agent import charge_card


class ChargeChatModel(BaseChatModel):
    """A tool-calling chat model made deterministic: it charges the order named, then reports the result."""

    @property
    def _llm_type(self) -> str:
        return "charge-scripted"

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
            call = {"id": "call_1", "name": "charge_card", "args": {"order_id": match.group(1) if match else "4821"}}
            reply = AIMessage(content="", tool_calls=[call])
        else:
            results = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
            reply = AIMessage(content="Done: " + (results[-1] if results else "nothing ran"))
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self  # it knows its tool; a real model gets the schemas here


app = create_agent(
    ChargeChatModel(),
    tools=[charge_card],
    system_prompt="You are a support agent. Charge orders only once.",
    middleware=[
        LedgerMiddleware(side_effects={"charge_card"}, in_doubt={"charge_card": "retry"}),
        HumanInTheLoopMiddleware(
            interrupt_on={
                "charge_card": {
                    "allowed_decisions": ["approve", "edit", "reject"],
                    "description": "Charge the customer's card? Check the order id first.",
                }
            }
        ),
    ],
)
