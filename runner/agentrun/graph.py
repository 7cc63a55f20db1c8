"""The graph builder: nodes, edges, conditional edges, ``START`` and ``END``.

Building is pure; ``compile()`` validates the shape and hands it to the
engine (which sees it as a ``nodes.Topology``, so the import runs one way:
builder -> engine). Nodes run one at a time (parallelism lives inside the
tool node), so every node has exactly one way out: a plain edge or a
conditional edge.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from .checkpoint.base import Checkpointer
from .constants import END, START
from .engine import CompiledGraph
from .errors import GraphDefinitionError
from .nodes import ContextNode, Node, NodeFn
from .state import StateSchema

__all__ = ["END", "START", "Branch", "StateGraph"]


@dataclass(frozen=True)
class Branch:
    """A conditional edge: ``path(state)`` names the next node, optionally through ``path_map``."""

    path: Callable[[dict[str, Any]], Hashable]
    path_map: dict[Hashable, str] | None

    def resolve(self, state: dict[str, Any], source: str) -> str:
        """The next node chosen by the branch's ``path``; raises ``GraphDefinitionError`` for an unmapped answer."""
        result = self.path(state)
        if self.path_map is not None:
            if result not in self.path_map:
                raise GraphDefinitionError(
                    f"conditional edge from {source!r} returned {result!r}, "
                    f"which is not in its path map {sorted(map(str, self.path_map))}"
                )
            return self.path_map[result]
        if not isinstance(result, str):
            raise GraphDefinitionError(f"conditional edge from {source!r} must return a node name, got {result!r}")
        return result


class StateGraph:
    """Build a graph over a state schema (a ``TypedDict``; default: ``MessagesState``)."""

    def __init__(self, state_schema: type | None = None) -> None:
        self.schema = StateSchema(state_schema)
        self.nodes: dict[str, Node] = {}
        self.edges: dict[str, str] = {}
        self.branches: dict[str, Branch] = {}

    def add_node(self, name: str | NodeFn | ContextNode, fn: NodeFn | ContextNode | None = None) -> StateGraph:
        """Add a node. ``fn(state)`` or ``fn(state, config)``, sync or async, returns an update dict.

        A ``nodes.ContextNode`` (such as ``ToolNode``) is called with the run context instead.
        """
        if fn is None:
            if isinstance(name, str):
                raise GraphDefinitionError(f"node {name!r} needs a function")
            fn = name
            name = str(getattr(fn, "name", None) or getattr(fn, "__name__", ""))
        if not isinstance(name, str) or not name:
            raise GraphDefinitionError(f"node {fn!r} has no name: use add_node('<name>', node)")
        if name in (START, END):
            raise GraphDefinitionError(f"{name!r} is reserved")
        if name in self.nodes:
            raise GraphDefinitionError(f"node {name!r} is already defined")
        self.nodes[name] = Node.of(name, fn)
        return self

    def add_edge(self, source: str, target: str) -> StateGraph:
        """Always go from ``source`` to ``target``; ``GraphDefinitionError`` if ``source`` has a way out already."""
        if source == END or target == START:
            raise GraphDefinitionError(f"invalid edge {source!r} -> {target!r}")
        if source in self.edges or source in self.branches:
            raise GraphDefinitionError(
                f"node {source!r} already has a way out; nodes run one at a time, "
                "so use a conditional edge to choose between targets"
            )
        self.edges[source] = target
        return self

    def add_conditional_edges(
        self,
        source: str,
        path: Callable[[dict[str, Any]], Hashable],
        path_map: dict[Hashable, str] | Sequence[str] | None = None,
    ) -> StateGraph:
        """Go from ``source`` where ``path(state)`` says (through ``path_map`` when given); one way out per node."""
        if source in self.edges or source in self.branches:
            raise GraphDefinitionError(f"node {source!r} already has a way out")
        mapping: dict[Hashable, str] | None = (
            path_map if path_map is None or isinstance(path_map, dict) else {name: name for name in path_map}
        )
        self.branches[source] = Branch(path, mapping)
        return self

    def set_entry_point(self, name: str) -> StateGraph:
        """Start the graph at ``name`` (``add_edge(START, name)``)."""
        return self.add_edge(START, name)

    def set_finish_point(self, name: str) -> StateGraph:
        """End the graph after ``name`` (``add_edge(name, END)``)."""
        return self.add_edge(name, END)

    def validate(self) -> None:
        """Raise ``GraphDefinitionError``: no entry point, an edge from or to an unknown node, a dead end."""
        if START not in self.edges and START not in self.branches:
            raise GraphDefinitionError("the graph has no entry point: add_edge(START, <node>)")
        known = set(self.nodes) | {END}
        for source, target in self.edges.items():
            if source != START and source not in self.nodes:
                raise GraphDefinitionError(f"edge from unknown node {source!r}")
            if target not in known:
                raise GraphDefinitionError(f"edge {source!r} -> unknown node {target!r}")
        for source, branch in self.branches.items():
            if source != START and source not in self.nodes:
                raise GraphDefinitionError(f"conditional edge from unknown node {source!r}")
            for target in (branch.path_map or {}).values():
                if target not in known:
                    raise GraphDefinitionError(f"conditional edge {source!r} -> unknown node {target!r}")
        for name in self.nodes:
            if name not in self.edges and name not in self.branches:
                raise GraphDefinitionError(
                    f"node {name!r} has no way out: add_edge({name!r}, END) or a conditional edge"
                )

    def next_node(self, source: str, state: dict[str, Any]) -> str:
        """The node after ``source`` for ``state``; raises ``GraphDefinitionError`` for an unknown target."""
        if source in self.edges:
            return self.edges[source]
        target = self.branches[source].resolve(state, source)
        if target != END and target not in self.nodes:
            raise GraphDefinitionError(f"conditional edge from {source!r} chose unknown node {target!r}")
        return target

    def compile(self, checkpointer: Checkpointer | None = None, *, name: str = "graph") -> CompiledGraph:
        """Validate the graph and return a runnable app bound to ``checkpointer``.

        Without a checkpointer the app keeps state in process memory only.
        """
        self.validate()
        return CompiledGraph(self, checkpointer=checkpointer, name=name)
