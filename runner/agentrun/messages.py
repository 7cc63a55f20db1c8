"""Messages: the pure data that flows through the ``messages`` channel.

A message's ``id`` is assigned once, when it is created, and persisted with
it. The tool ledger keys on ``<message id>:<tool call id>``, so the id of the
assistant message that asked for a tool must never change between a crash
and the replay; that is why it is generated here and never recomputed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant", "tool"]


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


class ToolCall(BaseModel):
    """One call the model asked for. ``arguments`` is the raw JSON text the model wrote.

    Kept raw on purpose: a model can write invalid JSON, and that must reach
    the tool node (which answers with a tool error message) instead of failing
    while the model's reply is parsed.
    """

    model_config = ConfigDict(frozen=True)

    id: str | None
    name: str
    arguments: str = "{}"

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as a dict; raises ``ValueError`` with a readable reason otherwise."""
        try:
            value = json.loads(self.arguments) if self.arguments.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"arguments are not valid JSON ({e.msg} at position {e.pos})") from e
        if not isinstance(value, dict):
            raise ValueError(f"arguments must be a JSON object, got {type(value).__name__}")
        return value


class Message(BaseModel):
    """A chat message with a stable id. Tool messages carry ``tool_call_id``."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default_factory=new_message_id)
    role: Role
    content: str = ""
    name: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    # True on a tool message that reports a failure (bad arguments, timeout, exception).
    is_error: bool = False

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_defaults=False)

    @classmethod
    def from_json(cls, data: Any) -> Message:
        return cls.model_validate(data)


def user(content: str, **kw: Any) -> Message:
    return Message(role="user", content=content, **kw)


def system(content: str, **kw: Any) -> Message:
    return Message(role="system", content=content, **kw)


def assistant(content: str = "", tool_calls: Sequence[ToolCall] = (), **kw: Any) -> Message:
    return Message(role="assistant", content=content, tool_calls=list(tool_calls), **kw)


def tool_message(content: str, *, tool_call_id: str | None, name: str, is_error: bool = False) -> Message:
    return Message(role="tool", content=content, tool_call_id=tool_call_id, name=name, is_error=is_error)


def coerce_message(value: Any) -> Message:
    """Accept a Message, a ``{"role", "content", ...}`` dict, or a ``(role, content)`` pair."""
    if isinstance(value, Message):
        return value
    if isinstance(value, dict):
        return Message.model_validate(value)
    if isinstance(value, tuple) and len(value) == 2:
        return Message(role=value[0], content=value[1])
    if isinstance(value, str):
        return Message(role="user", content=value)
    raise TypeError(f"cannot make a message from {type(value).__name__}")


def add_messages(left: Sequence[Message], right: Any) -> list[Message]:
    """The ``messages`` reducer: append; a message whose id is already present replaces it."""
    items: Iterable[Any] = right if isinstance(right, list | tuple) else [right]
    merged = list(left)
    index = {m.id: i for i, m in enumerate(merged) if m.id is not None}
    for item in items:
        message = coerce_message(item)
        if message.id is not None and message.id in index:
            merged[index[message.id]] = message
        else:
            if message.id is not None:
                index[message.id] = len(merged)
            merged.append(message)
    return merged
