"""A graph's structure as the run history draws it: its nodes and edges, recorded once per turn.

Both engines expose their shape: our ``StateGraph`` (nodes, plain edges, conditional edges with their path
map) and LangGraph's ``get_graph()`` (nodes and edges, conditional ones marked). The runner records it in the
meta of the turn's opening checkpoint (``META_KEY``; an answered interrupt's opening checkpoint too), written
before any node runs, so no step pays for it; the history server reads the newest one of the run
(``checkpoint.pg_inspect``) and draws it with the node the run is at.

Bounded: at most ``MAX_NODES`` nodes and ``MAX_EDGES`` edges, names cut at ``MAX_NAME`` characters (a graph
larger than that is drawn in part, ``cut`` says so). A conditional edge without a path map may go to any node:
its target is ``"*"``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from .constants import END, START

__all__ = ["ANY", "META_KEY", "of_agentrun", "of_langgraph"]

log = logging.getLogger("agentrun")

META_KEY = "graph"
MAX_NODES = 200
MAX_EDGES = 1000
MAX_NAME = 80
ANY = "*"  # the target of a conditional edge without a path map: whichever node it names


def _bounded(engine: str, nodes: Iterable[str], edges: Iterable[tuple[str, str, bool]]) -> dict[str, Any]:
    names = list(dict.fromkeys(str(n)[:MAX_NAME] for n in nodes))
    kept = names[:MAX_NODES]
    known = {*kept, ANY}
    listed = [
        [str(s)[:MAX_NAME], str(t)[:MAX_NAME], bool(c)]
        for s, t, c in edges
        if str(s)[:MAX_NAME] in known and str(t)[:MAX_NAME] in known
    ]
    return {
        "engine": engine,
        "nodes": kept,
        "edges": listed[:MAX_EDGES],
        "cut": len(names) > MAX_NODES or len(listed) > MAX_EDGES,
    }


def of_agentrun(graph: Any) -> dict[str, Any] | None:
    """Our ``StateGraph``'s structure (duck-typed: ``nodes``, ``edges``, ``branches``), or None if it has none."""
    nodes: Mapping[str, Any] | None = getattr(graph, "nodes", None)
    if nodes is None:
        return None
    edges: list[tuple[str, str, bool]] = [(s, t, False) for s, t in (getattr(graph, "edges", None) or {}).items()]
    for source, branch in (getattr(graph, "branches", None) or {}).items():
        targets = list(dict.fromkeys((branch.path_map or {}).values())) or [ANY]
        edges += [(source, target, True) for target in targets]
    return _bounded("agentrun", [START, *nodes, END], edges)


def of_langgraph(app: Any) -> dict[str, Any] | None:
    """A compiled LangGraph graph's structure (``get_graph()``), or None when it cannot say (logged)."""
    try:
        drawn = app.get_graph()
        nodes = [str(n) for n in drawn.nodes]
        edges = [(str(e.source), str(e.target), bool(e.conditional)) for e in drawn.edges]
    except Exception as e:  # a drawing is a nicety: never a reason to fail a run
        log.info("the graph's structure is not recorded: get_graph() failed: %r", e)
        return None
    return _bounded("langgraph", nodes, edges)
