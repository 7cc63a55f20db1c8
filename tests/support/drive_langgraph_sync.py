"""A SYNC LangGraph program on ``AgentrunSaver``, as a user writes one (the sync-setup tests' child, issue 31).

    python -m tests.support.drive_langgraph_sync STORE SETUP

``STORE``: ``sqlite:///...`` or ``postgresql://...``. ``SETUP``, how the program
sets the saver up before ``app.invoke``:

- ``setup``: ``saver.setup()`` (sync), then ``saver.close()``;
- ``asyncio-run-setup``: ``asyncio.run(saver.setup())``, as LangGraph's async
  savers are set up (issue 31: "Event loop is closed" on PostgreSQL);
- ``none``: no setup at all (issue 31: "no such table" on a fresh SQLite file);
- ``with``: ``with AgentrunSaver.from_url(STORE) as saver:``;
- ``asyncio-run-asetup``: ``asyncio.run(saver.asetup())``, which cannot work on
  PostgreSQL (the pool belongs to the closed loop) and must say what to do.

Two turns of a graph whose tool node (``LedgerToolNode``, a sync tool with side
effects) charges a card, then a replay of the first turn's tool node from its
checkpoint (the ledger answers). Prints one ``FINAL`` JSON line: the answers
and how many times the tool ran.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from agentrun.integrations.langgraph import AgentrunSaver, LedgerToolNode

ROOT = Path(__file__).resolve().parents[2]
# What the program prints when it ran as it should: two turns answered, the replay answered from the ledger.
EXPECTED = {
    "answers": ["done: charged order 4821", "done: charged order 4822"],
    "replayed": ["charged order 4821"],
    "charges": ["4821", "4822"],
}
CHARGES: list[str] = []


@tool
def charge_card(order_id: str) -> str:
    """Charge the customer's card."""
    CHARGES.append(order_id)
    return f"charged order {order_id}"


def model(state: MessagesState) -> dict[str, list[BaseMessage]]:
    last = state["messages"][-1]
    if isinstance(last, HumanMessage):
        call = {"id": "call_1", "name": "charge_card", "args": {"order_id": str(last.content)}}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}
    return {"messages": [AIMessage(content=f"done: {last.content}")]}


def build() -> StateGraph[MessagesState]:
    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", LedgerToolNode([charge_card], side_effects={"charge_card"}))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph


def run(saver: AgentrunSaver) -> dict[str, Any]:
    app = build().compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "sync-order"}}
    answers = [
        app.invoke({"messages": [HumanMessage(order)]}, config)["messages"][-1].content for order in ("4821", "4822")
    ]
    first_tools = list(app.get_state_history(config))[-3]  # the first turn, before its tool node
    assert first_tools.next == ("tools",), first_tools.next
    replayed = app.invoke(None, first_tools.config)
    tool_answers = [m.content for m in replayed["messages"] if isinstance(m, ToolMessage)]
    return {"answers": answers, "replayed": tool_answers, "charges": CHARGES}


def run_program(env: dict[str, str], store: str, setup: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    """Run this program in a new process (a fresh interpreter: no event loop left by the tests); it and its FINAL."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.drive_langgraph_sync", store, setup],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
    )
    final = next((json.loads(line[6:]) for line in done.stdout.splitlines() if line.startswith("FINAL ")), None)
    return done, final


def main() -> int:
    store, setup = sys.argv[1], sys.argv[2]
    if setup == "with":
        with AgentrunSaver.from_url(store) as saver:
            result = run(saver)
    else:
        saver = AgentrunSaver.from_url(store)
        if setup == "setup":
            saver.setup()
        elif setup == "asyncio-run-setup":
            asyncio.run(saver.setup())  # type: ignore[arg-type]  # as users write it; it works
        elif setup == "asyncio-run-asetup":
            asyncio.run(saver.asetup())
        try:
            result = run(saver)
        finally:
            saver.close()
    print("FINAL " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
