"""agentrun: durable, replay-safe agent graphs.

Build a graph, compile it with a checkpointer, run it; after a crash, run
the same thread again and tool calls that completed are replayed from the
ledger instead of executed twice.
"""

from .checkpoint import Checkpointer, InMemoryCheckpointer, SqliteCheckpointer
from .config import RunConfig
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
from .tools import Tool, tool

__all__ = [
    "END",
    "START",
    "AgentRunError",
    "Checkpointer",
    "Command",
    "CompiledGraph",
    "DeterminismError",
    "FencedError",
    "GraphDefinitionError",
    "GraphRecursionError",
    "GraphReferenceError",
    "InMemoryCheckpointer",
    "Interrupt",
    "Message",
    "MessagesState",
    "ModelError",
    "NodeError",
    "NodeTimeoutError",
    "Preemption",
    "Replace",
    "RunConfig",
    "RunPreempted",
    "RunStopped",
    "SqliteCheckpointer",
    "StaleStateError",
    "StateGraph",
    "StateSnapshot",
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
    "system",
    "tool",
    "tool_message",
    "tools_condition",
    "user",
]
