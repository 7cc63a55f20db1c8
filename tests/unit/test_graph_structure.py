"""The graph's structure the history draws (``agentrun.structure``), from both engines' own description."""

from __future__ import annotations

import itertools

import pytest

from agentrun import END, START, StateGraph, ToolNode, tools_condition
from agentrun.structure import ANY, MAX_NODES, of_agentrun, of_langgraph

pytestmark = pytest.mark.unit


def test_our_graph_gives_its_nodes_plain_and_conditional_edges() -> None:
    g = StateGraph()
    g.add_node("model", lambda s: {})
    g.add_node("tools", ToolNode([]))
    g.add_node("route", lambda s: {})
    g.add_edge(START, "model")
    g.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    g.add_edge("tools", "route")
    g.add_conditional_edges("route", lambda s: "model")  # no path map: any node
    shape = of_agentrun(g)
    assert shape is not None and shape["nodes"] == ["__start__", "model", "tools", "route", "__end__"]
    assert sorted(map(tuple, shape["edges"])) == [
        ("__start__", "model", False),
        ("model", "__end__", True),
        ("model", "tools", True),
        ("route", ANY, True),
        ("tools", "route", False),
    ]
    assert not shape["cut"]


def test_a_langgraph_graph_gives_get_graphs_nodes_and_edges() -> None:
    pytest.importorskip("langgraph")
    from examples.langgraph_support_agent import app

    shape = of_langgraph(app)
    assert shape is not None and shape["engine"] == "langgraph"
    assert shape["nodes"] == ["__start__", "model", "tools", "__end__"]
    assert sorted(map(tuple, shape["edges"])) == [
        ("__start__", "model", False),
        ("model", "__end__", True),
        ("model", "tools", True),
        ("tools", "model", False),
    ]
    assert of_langgraph(object()) is None, "a graph that cannot say is not recorded, never an error"


def test_a_huge_graph_is_kept_to_the_bound_and_says_so() -> None:
    g = StateGraph()
    names = [f"n{i}" for i in range(MAX_NODES + 50)]
    for name in names:
        g.add_node(name, lambda s: {})
    g.add_edge(START, names[0])
    for a, b in itertools.pairwise(names):
        g.add_edge(a, b)
    g.add_edge(names[-1], END)
    shape = of_agentrun(g)
    assert shape is not None and len(shape["nodes"]) == MAX_NODES and shape["cut"]
    assert all(s in shape["nodes"] and t in shape["nodes"] for s, t, _ in shape["edges"])
