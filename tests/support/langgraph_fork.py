"""An edited fork of a LangGraph thread, as LangGraph's docs edit a tool call (issue 31): the scenario and its counts.

A model asks for ``charge_card(order_id="4821")`` (message id ``ai-1``, call id
``c1``); the tool node charges it. Then ``update_state`` on the checkpoint
before the tool node replaces that assistant message with one of the SAME
message id and call id asking for order ``9999``, and the fork is run. Then the
fork's tool node and the original branch's tool node are replayed from their
checkpoints. Every execution of the tool is appended to ``CHARGES`` with the
idempotency key it was given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition

CHARGES: list[tuple[str, str | None]] = []
ORIGINAL, EDITED = "4821", "9999"


def _key() -> str | None:
    from agentrun.integrations.langgraph import current_idempotency_key

    return current_idempotency_key()


@tool
async def charge_card(order_id: str) -> str:
    """Charge the customer's card for the order."""
    CHARGES.append((order_id, _key()))
    return f"charged order {order_id}"


@tool("charge_card")
def charge_card_sync(order_id: str) -> str:
    """Charge the customer's card for the order (a sync tool, for a sync graph)."""
    CHARGES.append((order_id, _key()))
    return f"charged order {order_id}"


def request(order_id: str) -> AIMessage:
    """The assistant message asking for the charge: the same ids whatever the order (an edit keeps them)."""
    return AIMessage(
        content="", id="ai-1", tool_calls=[{"id": "c1", "name": "charge_card", "args": {"order_id": order_id}}]
    )


def model(state: MessagesState) -> dict[str, list[BaseMessage]]:
    if isinstance(state["messages"][-1], HumanMessage):
        return {"messages": [request(ORIGINAL)]}
    return {"messages": [AIMessage(content=f"done: {state['messages'][-1].content}", id="ai-2")]}


def build(node: ToolNode) -> StateGraph[MessagesState]:
    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", node)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph


def tools(sync: bool) -> list[BaseTool]:
    return [charge_card_sync if sync else charge_card]


@dataclass
class Fork:
    """What each run of the scenario answered (the tool message of each), and the executions in order."""

    original: str
    fork: str
    fork_replayed: str | None = None
    original_replayed: str | None = None


def _answer(values: dict[str, Any]) -> str:
    return str([m for m in values["messages"] if isinstance(m, ToolMessage)][-1].content)


async def afork(app: CompiledStateGraph[Any], *, replays: bool = True) -> Fork:
    """The scenario with ``ainvoke``; ``replays``: also replay both branches' tool nodes."""
    config: Any = {"configurable": {"thread_id": "order-4821"}}
    original = _answer(await app.ainvoke({"messages": [HumanMessage("charge order 4821")]}, config))
    before = [s async for s in app.aget_state_history(config) if s.next == ("tools",)][-1]
    forked = await app.aupdate_state(before.config, {"messages": [request(EDITED)]})
    result = Fork(original, _answer(await app.ainvoke(None, forked)))
    if replays:
        result.fork_replayed = _answer(await app.ainvoke(None, forked))
        result.original_replayed = _answer(await app.ainvoke(None, before.config))
    return result


def fork(app: CompiledStateGraph[Any]) -> Fork:
    """``afork`` with the sync API (``invoke``, ``update_state``)."""
    config: Any = {"configurable": {"thread_id": "order-4821"}}
    original = _answer(app.invoke({"messages": [HumanMessage("charge order 4821")]}, config))
    before = [s for s in app.get_state_history(config) if s.next == ("tools",)][-1]
    forked = app.update_state(before.config, {"messages": [request(EDITED)]})
    result = Fork(original, _answer(app.invoke(None, forked)))
    result.fork_replayed = _answer(app.invoke(None, forked))
    result.original_replayed = _answer(app.invoke(None, before.config))
    return result


def check(result: Fork, store: str) -> None:
    """The guarantees, with messages saying which broke."""
    charged = [order for order, _ in CHARGES]
    assert result.fork == f"charged order {EDITED}", (
        f"GUARANTEE BROKEN ({store}): the edited fork was answered {result.fork!r} from the ledger, "
        f"not by charging order {EDITED}"
    )
    assert charged == [ORIGINAL, EDITED], f"GUARANTEE BROKEN ({store}): charges {charged}, expected one of each"
    (_, first_key), (_, edited_key) = CHARGES
    assert first_key and edited_key and first_key != edited_key, (
        f"GUARANTEE BROKEN ({store}): the edited call reused the original's idempotency key {first_key}: a "
        "downstream API would answer it with the original charge"
    )
    assert result.fork_replayed == f"charged order {EDITED}", f"the fork's replay answered {result.fork_replayed!r}"
    assert result.original_replayed == f"charged order {ORIGINAL}", (
        f"the original branch's replay answered {result.original_replayed!r}"
    )
