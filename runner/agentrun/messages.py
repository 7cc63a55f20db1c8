"""Messages: the pure data that flows through the ``messages`` channel.

A message's ``id`` is assigned once, when it is created, and persisted with
it. The tool ledger keys on ``<message id>:<tool call id>``, so the id of the
assistant message that asked for a tool must never change between a crash
and the replay; that is why it is generated here and never recomputed.

``content`` is always the message's text. A message with structured content
(images, files, provider blocks) keeps its parts, in the chat-completions /
LangChain shape (``{"type": "text", "text": ...}``, ``{"type": "image_url",
...}``), in ``parts``; ``content`` then holds the text parts joined.

LangChain messages are accepted wherever a message is (``coerce_message``)
without this module importing LangChain: a LangChain message is recognised
only if ``langchain_core`` is already loaded, which it must be for such an
object to exist. The other direction needs ``agentrun[langchain]``
(``agentrun.integrations.langchain.to_langchain``).
"""

from __future__ import annotations

import json
import sys
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
    # Structured content, when there is more than text; None for plain text (the usual case).
    parts: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        data = self.model_dump(mode="json", exclude_defaults=False)
        if data["parts"] is None:
            del data["parts"]  # stored messages stay as they were before parts existed
        return data

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


_LANGCHAIN_ROLES: dict[str, Role] = {
    "human": "user",
    "ai": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "chat": "user",
}


def is_langchain_message(value: Any) -> bool:
    module = sys.modules.get("langchain_core.messages")
    return module is not None and isinstance(value, module.BaseMessage)


def text_of(parts: Sequence[Any]) -> str:
    """The text of structured content: its text parts (and bare strings), joined."""
    texts: list[str] = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return "".join(texts)


def from_langchain(value: Any) -> Message:
    """An agentrun message from a LangChain message (``HumanMessage``, ``AIMessage``, ...).

    Keeps the id (a new one if it has none), the content (list content in
    ``parts``), the name, tool calls with their ids (valid ones and
    ``invalid_tool_calls`` alike, arguments as JSON text), a tool message's
    ``tool_call_id`` and its ``status == "error"`` as ``is_error``.
    Raises ``ValueError`` for a message type agentrun has no role for.
    """
    kind = getattr(value, "type", None)
    role = _LANGCHAIN_ROLES.get(kind) if isinstance(kind, str) else None
    if role is None:
        raise ValueError(f"cannot make an agentrun message from a LangChain message of type {kind!r}")
    raw = value.content
    if isinstance(raw, str):
        content, parts = raw, None
    else:
        parts = [p if isinstance(p, dict) else {"type": "text", "text": str(p)} for p in raw]
        content = text_of(parts)
    calls: list[ToolCall] = []
    for call in getattr(value, "tool_calls", None) or ():
        arguments = json.dumps(call.get("args") or {}, ensure_ascii=False)
        calls.append(ToolCall(id=call.get("id") or None, name=call["name"], arguments=arguments))
    for call in getattr(value, "invalid_tool_calls", None) or ():
        # Kept as the model wrote them, so the tool node answers with a tool error message.
        calls.append(ToolCall(id=call.get("id") or None, name=call.get("name") or "", arguments=call.get("args") or ""))
    return Message(
        id=value.id or new_message_id(),
        role=role,
        content=content,
        parts=parts,
        name=value.name,
        tool_calls=calls if role == "assistant" else [],
        tool_call_id=getattr(value, "tool_call_id", None) if role == "tool" else None,
        is_error=role == "tool" and getattr(value, "status", None) == "error",
    )


def coerce_message(value: Any) -> Message:
    """Accept a Message, a ``{"role", "content", ...}`` dict, a ``(role, content)`` pair or a LangChain message."""
    if isinstance(value, Message):
        return value
    if is_langchain_message(value):
        return from_langchain(value)
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
