"""agentrun: durable, replay-safe agent graphs.

Build a graph, compile it with a checkpointer, run it; after a crash, run
the same thread again and tool calls that completed are replayed from the
ledger instead of executed twice.

Every name is imported on first use, so a program on SQLite or memory never
loads asyncpg or redis, one on PostgreSQL never loads sqlite3, and a process that
reads only ``agentrun.contract`` loads neither the engine nor the messages.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .ahead import pure
    from .checkpoint import (
        CachedStore,
        Checkpointer,
        ControlStore,
        InMemoryCheckpointer,
        LedgerStore,
        PgCheckpointer,
        SqliteCheckpointer,
        StateStore,
        open_store,
    )
    from .config import (
        RunConfig,
    )
    from .decorator import (
        tool,
    )
    from .engine import (
        CompiledGraph,
        Preemption,
        StateSnapshot,
        StreamEvent,
    )
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
    from .graph import (
        END,
        START,
        StateGraph,
    )
    from .interrupts import (
        Command,
        Interrupt,
        interrupt,
    )
    from .messages import (
        Message,
        ToolCall,
        add_messages,
        assistant,
        system,
        tool_message,
        user,
    )
    from .state import (
        MessagesState,
        Replace,
    )
    from .toolnode import (
        ToolNode,
        tools_condition,
    )
    from .tools import (
        Tool,
    )

# Each public name and the module that defines it. Nothing is imported until a name is first used: a process
# that needs one corner of the package (the operator and ``kubectl agentrun`` read ``agentrun.contract``) does
# not pay for the engine, the messages' pydantic models and the stores (about 0.3 s of CPU per process).
_EXPORTS: dict[str, str] = {
    "pure": ".ahead",
    "Checkpointer": ".checkpoint",
    "ControlStore": ".checkpoint",
    "InMemoryCheckpointer": ".checkpoint",
    "LedgerStore": ".checkpoint",
    "StateStore": ".checkpoint",
    "open_store": ".checkpoint",
    "PgCheckpointer": ".checkpoint",
    "CachedStore": ".checkpoint",
    "SqliteCheckpointer": ".checkpoint",
    "RunConfig": ".config",
    "tool": ".decorator",
    "CompiledGraph": ".engine",
    "Preemption": ".engine",
    "StateSnapshot": ".engine",
    "StreamEvent": ".engine",
    "AgentRunError": ".errors",
    "DeterminismError": ".errors",
    "FencedError": ".errors",
    "GraphDefinitionError": ".errors",
    "GraphRecursionError": ".errors",
    "GraphReferenceError": ".errors",
    "ModelError": ".errors",
    "NodeError": ".errors",
    "NodeTimeoutError": ".errors",
    "RunPreempted": ".errors",
    "RunStopped": ".errors",
    "StaleStateError": ".errors",
    "StorageError": ".errors",
    "ThreadNotFoundError": ".errors",
    "ThreadStateError": ".errors",
    "END": ".graph",
    "START": ".graph",
    "StateGraph": ".graph",
    "Command": ".interrupts",
    "Interrupt": ".interrupts",
    "interrupt": ".interrupts",
    "Message": ".messages",
    "ToolCall": ".messages",
    "add_messages": ".messages",
    "assistant": ".messages",
    "system": ".messages",
    "tool_message": ".messages",
    "user": ".messages",
    "MessagesState": ".state",
    "Replace": ".state",
    "ToolNode": ".toolnode",
    "tools_condition": ".toolnode",
    "Tool": ".tools",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


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
    "pure",
    "system",
    "tool",
    "tool_message",
    "tools_condition",
    "user",
]
