"""agentrun: durable, replay-safe agent graphs.

Build a graph, compile it with a checkpointer, run it; after a crash, run
the same thread again and tool calls that completed are replayed from the
ledger instead of executed twice.

``PgCheckpointer``, ``CachedStore`` and ``SqliteCheckpointer`` are imported on
first use, so a program on SQLite or memory never loads asyncpg or redis, and
one on PostgreSQL never loads sqlite3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .checkpoint import (
    Checkpointer,
    ControlStore,
    InMemoryCheckpointer,
    LedgerStore,
    StateStore,
    open_store,
)
from .config import RunConfig
from .decorator import tool
from .engine import CompiledGraph, Preemption, StateSnapshot, StreamEvent
from .errors import (
    AgentRunError,
    DeterminismError,
    FencedError,
    GraphDefinitionError,
    GraphRecursionError,
    GraphReferenceError,
    ModelError,
    NodeError,
    NodeTimeoutError,
    RunPreempted,
    RunStopped,
    StaleStateError,
    StorageError,
    ThreadNotFoundError,
    ThreadStateError,
)
from .graph import END, START, StateGraph
from .interrupts import Command, Interrupt, interrupt
from .messages import Message, ToolCall, add_messages, assistant, system, tool_message, user
from .state import MessagesState, Replace
from .toolnode import ToolNode, tools_condition
from .tools import Tool

if TYPE_CHECKING:
    from .checkpoint.cached import CachedStore
    from .checkpoint.postgres import PgCheckpointer
    from .checkpoint.sqlite import SqliteCheckpointer


def __getattr__(name: str) -> Any:
    if name in ("PgCheckpointer", "CachedStore", "SqliteCheckpointer"):
        from . import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "END",
    "START",
    "AgentRunError",
    "CachedStore",
    "Checkpointer",
    "Command",
    "CompiledGraph",
    "ControlStore",
    "DeterminismError",
    "FencedError",
    "GraphDefinitionError",
    "GraphRecursionError",
    "GraphReferenceError",
    "InMemoryCheckpointer",
    "Interrupt",
    "LedgerStore",
    "Message",
    "MessagesState",
    "ModelError",
    "NodeError",
    "NodeTimeoutError",
    "PgCheckpointer",
    "Preemption",
    "Replace",
    "RunConfig",
    "RunPreempted",
    "RunStopped",
    "SqliteCheckpointer",
    "StaleStateError",
    "StateGraph",
    "StateSnapshot",
    "StateStore",
    "StorageError",
    "StreamEvent",
    "ThreadNotFoundError",
    "ThreadStateError",
    "Tool",
    "ToolCall",
    "ToolNode",
    "add_messages",
    "assistant",
    "interrupt",
    "open_store",
    "system",
    "tool",
    "tool_message",
    "tools_condition",
    "user",
]
