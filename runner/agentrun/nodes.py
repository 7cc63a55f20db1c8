"""What the engine runs: nodes, how each one is called, and the shape of a graph.

The builder (``graph.StateGraph``) produces this shape and hands it to the
engine, which depends on the shape only, never on the builder, so imports
run one way: graph -> engine -> nodes.

Two calling conventions, fixed when a node is added:

- a function ``fn(state)`` or ``fn(state, config)``, sync or async: user
  code. It reaches the run (``interrupt()``, the run's logger) through the
  context variables of ``agentrun.context``, having no other channel;
- a ``ContextNode``: an object with ``run_with_context(state, ctx)``. The
  engine hands it the run context (store, config, logger, resume values) as
  an explicit parameter. The tool node is one; built-in nodes that use the
  store are written this way, so their dependencies show in their signatures.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

from .context import RunContext
from .state import StateSchema
from .sync import run_sync

NodeFn = Callable[..., Any]


@runtime_checkable
class ContextNode(Protocol):
    """A node that receives the run context as a parameter instead of reading context variables."""

    async def run_with_context(self, state: dict[str, Any], ctx: RunContext) -> dict[str, Any] | None:
        """Return the node's update (or ``None``); ``state`` is the node's own copy."""
        ...


def _wants_config(fn: NodeFn) -> bool:
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return False
    return len(params) >= 2


@dataclass(frozen=True)
class Node:
    """A graph node: its function and how it is called (with the config, the run context, or the state only)."""

    name: str
    fn: NodeFn | ContextNode
    wants_config: bool
    # Fixed when the node is added, not per call: a runtime-checkable Protocol's isinstance and the
    # coroutine checks cost about 50 µs, a tenth of a durable step.
    context_node: bool = False
    is_async: bool = False

    @classmethod
    def of(cls, name: str, fn: NodeFn | ContextNode) -> Node:
        """A node calling ``fn`` by its convention: context node, ``fn(state, config)`` or ``fn(state)``."""
        if isinstance(fn, ContextNode):
            return cls(name, fn, False, context_node=True, is_async=True)
        is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
        return cls(name, fn, _wants_config(fn), is_async=is_async)

    async def call(self, state: dict[str, Any], ctx: RunContext) -> Any:
        """Run the node once and return what it returned (the engine validates the update)."""
        fn = self.fn
        if self.context_node:
            return await cast(ContextNode, fn).run_with_context(state, ctx)
        args: tuple[Any, ...] = (state, ctx.config) if self.wants_config else (state,)
        if self.is_async:
            return await cast(NodeFn, fn)(*args)
        result = await run_sync(cast(NodeFn, fn), *args)
        return await result if inspect.isawaitable(result) else result


class Topology(Protocol):
    """What the engine needs of a graph: its state schema, its nodes and the route between them.

    ``StateGraph`` provides it; ``next_node`` raises ``GraphDefinitionError``
    when a conditional edge names a node that does not exist.
    """

    @property
    def schema(self) -> StateSchema:
        """The state's channels and their reducers."""
        ...

    @property
    def nodes(self) -> Mapping[str, Node]:
        """The nodes by name."""
        ...

    def next_node(self, source: str, state: dict[str, Any]) -> str:
        """The node after ``source`` for ``state``."""
        ...
