"""The benchmark's graphs, the same shapes on agentrun and on LangGraph.

- plain: ``NODES`` nodes in a chain, each appending an int to a list channel.
- msg: the same chain, each node appending a ~200-byte assistant message.
- big: the same chain over a state holding an unchanged ``BIG`` (~100 KB) channel,
  each node bumping a counter: what a step costs when most of the state did not change.
- tools: a scripted model that asks for 3 parallel tool calls ``ITERATIONS``
  times, then answers; a tool node runs them (agentrun: with the ledger and,
  for the side-effecting tool, an intent).

``plain_graph`` is also the graph of ``runner_cold_start_ms`` (``bench.graphs:runner_graph``).
"""

from __future__ import annotations

import json
import operator
from typing import Annotated, Any, TypedDict

NODES = 50
ITERATIONS = 20
BODY = "x" * 200  # the ~200-byte message of the msg shape
BIG = "y" * 100_000  # the unchanged channel of the big shape


def _append(i: int) -> Any:
    """A node appending ``i`` (a closure: a default argument would read as the node's config parameter)."""

    def node(state: dict[str, Any]) -> dict[str, Any]:
        return {"items": [i]}

    return node


# -- agentrun ----------------------------------------------------------------------------------


class PlainState(TypedDict, total=False):
    items: Annotated[list[int], operator.add]


def agentrun_plain_graph(nodes: int = NODES, *, pure: bool = False) -> Any:
    """The plain chain; ``pure``: its nodes declared ``agentrun.ahead.pure`` (they are: each returns a constant)."""
    from agentrun import END, START, StateGraph
    from agentrun.ahead import pure as declare_pure

    graph = StateGraph(PlainState)
    for i in range(nodes):
        graph.add_node(f"n{i}", declare_pure(_append(i)) if pure else _append(i))
        graph.add_edge(START if i == 0 else f"n{i - 1}", f"n{i}")
    graph.add_edge(f"n{nodes - 1}", END)
    return graph


def agentrun_plain(checkpointer: Any, nodes: int = NODES, *, pure: bool = False) -> Any:
    return agentrun_plain_graph(nodes, pure=pure).compile(checkpointer)


class BigState(TypedDict, total=False):
    big: str
    n: int


def _bump(state: dict[str, Any]) -> dict[str, Any]:
    return {"n": state["n"] + 1}


def _big_graph(graph: Any, start: Any, end: Any, nodes: int) -> Any:
    for i in range(nodes):
        graph.add_node(f"n{i}", _bump)
        graph.add_edge(start if i == 0 else f"n{i - 1}", f"n{i}")
    graph.add_edge(f"n{nodes - 1}", end)
    return graph


def agentrun_big(checkpointer: Any, nodes: int = NODES) -> Any:
    from agentrun import END, START, StateGraph

    return _big_graph(StateGraph(BigState), START, END, nodes).compile(checkpointer)


def agentrun_msg(checkpointer: Any, nodes: int = NODES) -> Any:
    from agentrun import END, START, StateGraph
    from agentrun.messages import assistant

    graph = StateGraph()
    for i in range(nodes):
        graph.add_node(f"n{i}", lambda state: {"messages": [assistant(BODY)]})
        graph.add_edge(START if i == 0 else f"n{i - 1}", f"n{i}")
    graph.add_edge(f"n{nodes - 1}", END)
    return graph.compile(checkpointer)


def agentrun_tools(checkpointer: Any, iterations: int = ITERATIONS) -> Any:
    from agentrun import END, START, StateGraph, ToolNode, tool
    from agentrun.messages import ToolCall, assistant

    @tool
    async def lookup(key: str) -> str:
        return f"value of {key}"

    @tool
    async def score(key: str) -> int:
        return len(key)

    @tool(side_effects=True, in_doubt="retry")
    async def notify(key: str) -> str:
        return f"notified {key}"

    def model(state: dict[str, Any]) -> dict[str, Any]:
        done = sum(1 for m in state["messages"] if m.role == "assistant")
        if done >= iterations:
            return {"messages": [assistant("done")]}
        calls = [
            ToolCall(id=f"c{done}_{name}", name=name, arguments=json.dumps({"key": f"k{done}"}))
            for name in ("lookup", "score", "notify")
        ]
        return {"messages": [assistant("", tool_calls=calls)]}

    graph = StateGraph()
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([lookup, score, notify]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", lambda s: "tools" if s["messages"][-1].tool_calls else END)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer)


def __getattr__(name: str) -> Any:
    # ``runner_graph``: the graph ``python -m agentrun.runner`` loads for the cold start (the plain chain),
    # built on first access so that the LangGraph jobs do not import agentrun.
    if name == "runner_graph":
        return agentrun_plain_graph()
    raise AttributeError(name)


# -- LangGraph ---------------------------------------------------------------------------------


def langgraph_plain(saver: Any, nodes: int = NODES) -> Any:
    from langgraph.graph import END, START, StateGraph

    graph = StateGraph(PlainState)
    for i in range(nodes):
        graph.add_node(f"n{i}", _append(i))
        graph.add_edge(START if i == 0 else f"n{i - 1}", f"n{i}")
    graph.add_edge(f"n{nodes - 1}", END)
    return graph.compile(checkpointer=saver)


def langgraph_big(saver: Any, nodes: int = NODES) -> Any:
    from langgraph.graph import END, START, StateGraph

    return _big_graph(StateGraph(BigState), START, END, nodes).compile(checkpointer=saver)


def langgraph_msg(saver: Any, nodes: int = NODES) -> Any:
    from langchain_core.messages import AIMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    graph = StateGraph(MessagesState)
    for i in range(nodes):
        graph.add_node(f"n{i}", lambda state: {"messages": [AIMessage(BODY)]})
        graph.add_edge(START if i == 0 else f"n{i - 1}", f"n{i}")
    graph.add_edge(f"n{nodes - 1}", END)
    return graph.compile(checkpointer=saver)


def langgraph_tools(saver: Any, iterations: int = ITERATIONS) -> Any:
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    @lc_tool
    async def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"

    @lc_tool
    async def score(key: str) -> int:
        """Score a key."""
        return len(key)

    @lc_tool
    async def notify(key: str) -> str:
        """Notify about a key."""
        return f"notified {key}"

    def model(state: dict[str, Any]) -> dict[str, Any]:
        done = sum(1 for m in state["messages"] if m.type == "ai")
        if done >= iterations:
            return {"messages": [AIMessage("done")]}
        calls = [
            {"id": f"c{done}_{name}", "name": name, "args": {"key": f"k{done}"}}
            for name in ("lookup", "score", "notify")
        ]
        return {"messages": [AIMessage("", tool_calls=calls)]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([lookup, score, notify]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=saver)
