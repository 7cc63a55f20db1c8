"""Pure nodes: run inline on the event loop, and computed while the previous step's checkpoint is in flight.

A node declared ``@pure`` promises to be a function of its input alone:
no I/O, no tool or model call, no ``interrupt()``, no global state, the
same update for the same state (a plain transformation, a router's
bookkeeping, a formatter). The engine cannot check that promise in Python,
so purity is an opt-in per node and nothing else is ever run ahead; a node
that does any of these things must not be declared pure.

What the engine does with the promise:

- **Inline**: a pure sync node is called on the event loop, without its
  supervisor task, its worker thread (``agentrun.sync``) or a run context.
  Hazard: while it runs the loop is blocked, so its ``node_timeout`` is not
  enforced and a stop or a preemption is heard only once it returned.
  Declare pure only what is cheap (microseconds to a few milliseconds).
  It sees no run context: ``interrupt()`` and the run's tools raise there.
- **Ahead**: when step N's successor is a pure node, its update is computed
  from step N's state while step N's checkpoint write is in flight (on
  PostgreSQL, on the wire; SQLite writes on its own thread; the memory store
  returns at once, so there nothing overlaps and the steps stay sequential).
  Nothing of step N+1 is released before step N is durable: the update is
  held aside, not merged into the run; step N's event is yielded only after
  its write returned; then the checks that may act before a node
  (recursion limit, preemption, a stop) run as for any node, and only if
  none acted is the held update merged, step N+1 routed and checkpointed.
  A check that acts, a failed write or a crash drops the held update: since
  the node is pure, dropping it (and computing it again on resume) has no
  effect anywhere. An update that raised is dropped too; the node then runs
  again the ordinary way, which reports what it raises.

``tests/postgres/test_pure_ahead_crash.py`` SIGKILLs a runner at
``ahead_of_checkpoint`` (N+1 computed, N's write not yet acknowledged) on
PostgreSQL and SQLite: no event of N or N+1 was seen, no row of N+1 exists,
and the resumed run ends in the uninterrupted run's state.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from .config import RunConfig
from .faults import fault_point
from .nodes import Node, NodeFn
from .state import node_input

F = TypeVar("F")

# The attribute ``pure`` sets on a node function (read when the node runs: the builder is not ours to change).
PURE_ATTRIBUTE = "__agentrun_pure__"


def pure(fn: F) -> F:
    """Declare the node function ``fn`` pure and cheap: run inline, and ahead of the previous checkpoint.

    See this module's docstring for the promise it makes and what the engine does with it.
    """
    setattr(fn, PURE_ATTRIBUTE, True)
    return fn


def is_pure(node: Node) -> bool:
    """Whether ``node`` is a sync function declared ``@pure`` (a context node or an async one never is)."""
    return not node.context_node and not node.is_async and getattr(node.fn, PURE_ATTRIBUTE, False) is True


def call_pure(node: Node, state: dict[str, Any], cfg: RunConfig) -> Any:
    """Call the pure ``node`` on a copy of ``state``, inline, in an empty context (no run context to reach)."""
    args: tuple[Any, ...] = (node_input(state), cfg) if node.wants_config else (node_input(state),)
    return contextvars.Context().run(cast(NodeFn, node.fn), *args)


@dataclass(frozen=True)
class Ahead:
    """A pure node's update computed from ``state`` (the run's state object then), held until it may be used."""

    node: Node
    state: dict[str, Any]
    update: Any
    seconds: float  # the call's duration, for the step metric observed once the update is used


def compute_ahead(node: Node, state: dict[str, Any], cfg: RunConfig) -> Ahead | None:
    """``node``'s update for ``state``, or ``None`` when it raised or returned an awaitable (run it normally)."""
    started = time.perf_counter()
    try:
        update = call_pure(node, state, cfg)
    except Exception:
        return None  # the ordinary path runs it again and reports the error with the run's policy
    if inspect.isawaitable(update):
        if inspect.iscoroutine(update):
            update.close()
        return None
    return Ahead(node, state, update, time.perf_counter() - started)


async def write_while_ahead(write: Awaitable[None], node: Node, state: dict[str, Any], cfg: RunConfig) -> Ahead | None:
    """Await ``write`` (step N's checkpoint), computing the pure ``node``'s update from ``state`` meanwhile.

    Returns the held update, or ``None`` when the write did not wait (nothing
    to overlap: the node runs after it the ordinary way). Raises what the
    write raised; the held update is then dropped.
    """
    task = asyncio.ensure_future(write)
    try:
        await asyncio.sleep(0)  # the write runs up to its first wait (on PostgreSQL: sent)
        ahead = None
        if not task.done():
            ahead = compute_ahead(node, state, cfg)
            fault_point("ahead_of_checkpoint", node.name)  # N+1 computed, N's write not acknowledged
        await task
        return ahead
    finally:
        if not task.done():  # we were interrupted before awaiting it: do not leave the write running alone
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
