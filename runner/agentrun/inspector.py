"""The run inspector's model: what a run was given, what it saw and said, and what each step changed.

Built from ``checkpoint.pg_inspect``'s rows (pure, like ``agentrun.history``), for the history server's
JSON, its web view and ``kubectl agentrun history``:

- ``Conversation``: the turn's input and the thread's messages as a conversation (role, content, the tool
  calls an assistant asked for with their arguments, a tool's answer with its call id and whether it was an
  error), each with the version of the checkpoint that appended it; the newest ``CONVERSATION_LIMIT`` only,
  ``total`` saying how many there are;
- ``StepDetail``: one checkpoint (state version): the state as of it, key by key, what its step changed
  against the version before (keys ``added``, ``changed`` (another digest), ``removed``) and the messages it
  appended (for a messages state, that is what the step said or heard).

Every value is a ``Digest`` (SHA-256, size, preview): never read whole, plain text to be escaped by whoever
shows it. ``messages`` is not a key of the state here: its messages are the conversation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from .checkpoint.pg_inspect import CONVERSATION_LIMIT, STEP_MESSAGES_LIMIT
from .history import Digest, _digest_of, _loads

__all__ = ["CONVERSATION_LIMIT", "STEP_MESSAGES_LIMIT", "Conversation", "StepDetail", "conversation", "step"]


class ChatToolCall(BaseModel):
    """A tool call an assistant message asked for: its id, tool and arguments."""

    id: str | None = None
    name: str
    arguments: Digest | None = None


class ChatMessage(BaseModel):
    """One message of the conversation, as content (never a framework's serialized object)."""

    index: int
    role: str
    name: str | None = None
    content: Digest | None = None
    tool_calls: list[ChatToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None  # a tool's answer: the call it answers
    is_error: bool = False
    version: int | None = None  # the checkpoint that appended it (None: not known)


class Conversation(BaseModel):
    """The turn's input and the thread's newest messages, oldest first."""

    input: Digest | None = None
    input_attempt: int | None = None
    messages: list[ChatMessage] = Field(default_factory=list)
    total: int = 0  # messages in the thread; only the newest CONVERSATION_LIMIT are in ``messages``
    graph: GraphShape | None = None  # the run's graph structure, as its runner recorded it


class GraphShape(BaseModel):
    """A graph's structure (``agentrun.structure``): its nodes, edges (source, target, conditional), engine."""

    engine: str = "agentrun"
    nodes: list[str] = Field(default_factory=list)
    edges: list[tuple[str, str, bool]] = Field(default_factory=list)
    cut: bool = False


class StateChange(BaseModel):
    """A key of the state a step added, changed or removed, with its value before and after."""

    key: str
    change: Literal["added", "changed", "removed"]
    before: Digest | None = None
    after: Digest | None = None


class StepDetail(BaseModel):
    """One checkpoint: where the run was, its state by key, what its step changed, the messages it appended."""

    version: int
    step: int
    node: str | None = None
    status: str
    attempt: int | None = None
    at: float
    previous_version: int | None = None
    state: dict[str, Digest] = Field(default_factory=dict)
    changes: list[StateChange] = Field(default_factory=list)
    messages: list[ChatMessage] = Field(default_factory=list)
    appended: int = 0  # messages the step appended; at most STEP_MESSAGES_LIMIT are in ``messages``


def _message(row: Mapping[str, Any], version: int | None) -> ChatMessage:
    raw = _loads(row.get("tool_calls"))
    calls = [
        ChatToolCall(id=c.get("id"), name=str(c.get("name") or "?"), arguments=_digest_of(c.get("arguments")))
        for c in (raw if isinstance(raw, list) else [])
        if isinstance(c, dict)
    ]
    return ChatMessage(
        index=int(row["idx"]),
        role=str(row.get("role") or "?"),
        name=row.get("name"),
        content=_digest_of(row.get("content")),
        tool_calls=calls,
        tool_call_id=row.get("tool_call_id"),
        is_error=bool(row.get("is_error")),
        version=version,
    )


def conversation(
    found: Mapping[str, Any] | None, rows: Sequence[Mapping[str, Any]], total: int, graph: str | None = None
) -> Conversation:
    """The conversation from ``PgCheckpointer.thread_conversation``'s input row, messages, total and graph."""
    return Conversation(
        input=_digest_of(found.get("input")) if found else None,
        input_attempt=found.get("attempt") if found else None,
        messages=[_message(r, r.get("at_version")) for r in rows],
        total=total,
        graph=_shape(graph),
    )


def _shape(text: str | None) -> GraphShape | None:
    """A recorded structure, or None when there is none or it does not read as one (never an error)."""
    found = _loads(text)
    if not isinstance(found, dict):
        return None
    try:
        return GraphShape.model_validate(found)
    except ValueError:
        return None


def _changes(before: Mapping[str, Digest], after: Mapping[str, Digest]) -> list[StateChange]:
    changes: list[StateChange] = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old is None and new is not None:
            changes.append(StateChange(key=key, change="added", after=new))
        elif new is None and old is not None:
            changes.append(StateChange(key=key, change="removed", before=old))
        elif old is not None and new is not None and (old.sha256, old.bytes) != (new.sha256, new.bytes):
            changes.append(StateChange(key=key, change="changed", before=old, after=new))
    return changes


def _state(values: Mapping[str, Any]) -> dict[str, Digest]:
    return {key: shown for key, text in values.items() if (shown := _digest_of(text)) is not None}


def step(found: Mapping[str, Any], version: int) -> StepDetail:
    """Version ``version``'s detail from ``PgCheckpointer.thread_step``'s answer (not None)."""
    row = found["rows"][version]
    previous = version - 1 if version - 1 in found["rows"] else None
    after = _state(found["state"].get(version, {}))
    before = _state(found["state"].get(previous, {})) if previous is not None else {}
    return StepDetail(
        version=version,
        step=int(row["step"]),
        node=row.get("current_node"),
        status=str(row["status"]),
        attempt=row.get("attempt"),
        at=float(row["at"]),
        previous_version=previous,
        state=after,
        changes=_changes(before, after),
        messages=[_message(m, version) for m in found["messages"]],
        appended=int(found["appended"]),
    )
