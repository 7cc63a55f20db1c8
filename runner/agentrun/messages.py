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

Messages read back from a store (``stored_messages``) are validated when
first used, not when the thread is loaded: a node that reads the last
message of a 10,000-message thread validates one message, not 10,000.
"""

from __future__ import annotations

import copy
import functools
import json
import sys
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .errors import StorageError

Role = Literal["system", "user", "assistant", "tool"]


def new_message_id() -> str:
    """A new message id (``msg_`` and a random hex)."""
    return f"msg_{uuid.uuid4().hex}"


def unicode_text(text: str) -> str:
    """``text`` with each unpaired UTF-16 surrogate replaced by U+FFFD; ``text`` itself when it is valid.

    Python strings may hold surrogates (``json.loads`` of a lone ``\\ud800`` escape, ``surrogateescape``
    decoding); no UTF-8 encoder, and so no store, takes them. A pair written as two code units becomes
    the one character it encodes. The same replacement as Go's ``encoding/json`` (the API server's).
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


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
        """The arguments as a dict; raises ``ValueError`` with a readable reason otherwise.

        Stricter than ``json.loads``, which accepts what no store can keep and
        no JSON encoder writes back: NaN, Infinity and numbers beyond a float's
        range, strings holding an unpaired UTF-16 surrogate (not Unicode), and
        nesting deep enough to exhaust the parser's recursion. A tool handed
        such a value and echoing it would fail the step's checkpoint on every
        attempt; refused here, it is a tool error message for the model.
        """
        try:
            value = (
                json.loads(self.arguments, parse_constant=_not_a_number, parse_float=_finite)
                if self.arguments.strip()
                else {}
            )
        except json.JSONDecodeError as e:
            raise ValueError(f"arguments are not valid JSON ({e.msg} at position {e.pos})") from e
        except RecursionError:
            raise ValueError(f"arguments are nested deeper than {MAX_ARGUMENT_DEPTH} levels") from None
        if not isinstance(value, dict):
            raise ValueError(f"arguments must be a JSON object, got {type(value).__name__}")
        if (problem := _argument_problem(value)) is not None:
            raise ValueError(problem)
        return value


# Levels of nesting in a tool call's arguments (the operator's limit for spec values, too). Real
# arguments stay far below; the JSON encoder, deepcopy and pydantic recurse once per level.
MAX_ARGUMENT_DEPTH = 100


def _not_a_number(constant: str) -> Any:
    raise ValueError(f"arguments are not valid JSON ({constant} is not a JSON number)")


def _finite(text: str) -> float:
    number = float(text)
    if number in (float("inf"), float("-inf")):
        raise ValueError(f"arguments hold a number out of range ({text[:40]})")
    return number


def _argument_problem(value: dict[str, Any]) -> str | None:
    """What makes parsed arguments unusable (too deep, not Unicode), walked without recursion."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list) and depth >= MAX_ARGUMENT_DEPTH:
            return f"arguments are nested deeper than {MAX_ARGUMENT_DEPTH} levels"
        if isinstance(item, dict):
            stack.extend((key, depth) for key in item)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "arguments are not valid JSON (a string holds an unpaired UTF-16 surrogate, not Unicode text)"
    return None


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
        """The message as stored (JSON); ``parts`` only when it has some."""
        data = self.model_dump(mode="json", exclude_defaults=False)
        if data["parts"] is None:
            del data["parts"]  # stored messages stay as they were before parts existed
        return data

    @classmethod
    def from_json(cls, data: Any) -> Message:
        """A message from its stored form; raises pydantic's ``ValidationError`` for a malformed one."""
        return cls.model_validate(data)

    @classmethod
    def many_from_json_texts(cls, bodies: Sequence[str]) -> list[Message]:
        """Messages from their stored JSON texts, validated as ``from_json`` does; ``ValidationError`` if one is not.

        One JSON array parsed and validated by pydantic-core, not a ``json.loads`` and a validation per
        message: loading a 10,000-message thread takes about half the time.
        """
        if not bodies:
            return []
        messages = _message_list().validate_json("[" + ",".join(bodies) + "]")
        if len(messages) != len(bodies):  # a text that is not one JSON value (a store without JSON types)
            return [cls.from_json(json.loads(body)) for body in bodies]  # fails at the culprit
        return messages


@functools.cache
def _message_list() -> TypeAdapter[list[Message]]:
    # Built on first use: a validator built at import would cost every runner's start, threads or not.
    return TypeAdapter(list[Message])


def user(content: str, **kw: Any) -> Message:
    """A user message."""
    return Message(role="user", content=content, **kw)


def system(content: str, **kw: Any) -> Message:
    """A system message."""
    return Message(role="system", content=content, **kw)


def assistant(content: str = "", tool_calls: Sequence[ToolCall] = (), **kw: Any) -> Message:
    """An assistant message, with the tool calls it asks for."""
    return Message(role="assistant", content=content, tool_calls=list(tool_calls), **kw)


def tool_message(content: str, *, tool_call_id: str | None, name: str, is_error: bool = False) -> Message:
    """A tool's answer to the call ``tool_call_id`` (``is_error``: a tool error the model sees)."""
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
    """Whether ``value`` is a LangChain message; never imports LangChain (if it is not loaded, it is not)."""
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


class MessageList(list[Message]):
    """What ``add_messages`` returns: a list that also carries its id -> position index.

    The next ``add_messages`` on it takes the index over instead of rebuilding
    it from the whole history, and notes which positions it replaced, so that
    appending to a thread costs the same at 10,000 messages as at 10. Copies
    (``list(...)``, ``copy``, pickling) are plain lists and rebuild the index
    once when reduced into.
    """

    __slots__ = ("_base", "_index", "_length", "_replaced")

    def __init__(self, items: Iterable[Message] = ()) -> None:
        super().__init__(items)
        self._index: dict[str, int] | None = None
        self._length = -1  # len() when the index was made; a list changed in place since has none
        self._base: list[Message] | None = None  # the list this one was reduced from
        self._replaced: list[int] = []

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))

    def __copy__(self) -> list[Message]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Message]:
        return copy.deepcopy(list(self), memo)


def _take_index(left: Sequence[Message]) -> dict[str, int]:
    """``left``'s id -> position index: taken over from a ``MessageList`` that still matches, else built."""
    if isinstance(left, MessageList) and left._index is not None and left._length == len(left):
        index, left._index, left._base = left._index, None, None
        return index
    return {m.id: i for i, m in enumerate(left) if m.id is not None}


def add_messages(left: Sequence[Message], right: Any) -> list[Message]:
    """The ``messages`` reducer: append; a message whose id is already present replaces it.

    Costs what ``right`` holds, not what ``left`` holds, when ``left`` is what
    the previous ``add_messages`` returned (a copy of the pointers aside).
    ``left`` itself is never changed (``append_messages`` is the in-place form).
    """
    items = coerce_messages(right)  # before anything changes: a message that cannot be made changes nothing
    merged = MessageList(left)
    index = _take_index(left)
    _merge(merged, index, items, merged._replaced)
    merged._base = left if isinstance(left, list) else None
    return merged


def append_messages(messages: MessageList, items: Iterable[Message]) -> list[int]:
    """``add_messages`` done in ``messages`` itself, for ``items`` already made messages (``coerce_messages``);
    returns the positions it replaced.

    For the engine's own list (``Run.owned``), which nothing else references: a step then copies no list of
    10,000 references. It cannot fail once ``items`` are messages, so a caller that made them first changes
    the list all or nothing.
    """
    replaced: list[int] = []
    _merge(messages, _take_index(messages), items, replaced)
    return replaced


def coerce_messages(right: Any) -> list[Message]:
    """A reducer update's messages (one, or a list or tuple of them, in any form ``coerce_message`` takes)."""
    return [coerce_message(item) for item in (right if isinstance(right, list | tuple) else [right])]


def _merge(merged: MessageList, index: dict[str, int], items: Iterable[Message], replaced: list[int]) -> None:
    """Append ``items`` to ``merged`` (whose id index is ``index``), replacing those whose id it holds."""
    for message in items:
        position = None if message.id is None else index.get(message.id)
        if position is not None and position < len(merged) and merged[position].id == message.id:
            merged[position] = message
            replaced.append(position)
        else:
            if message.id is not None:
                index[message.id] = len(merged)
            merged.append(message)
    merged._index, merged._length = index, len(merged)


def copy_messages(messages: Sequence[Message]) -> MessageList:
    """A copy of ``messages`` for a run's state that takes their id index over when they carry one.

    ``stored_messages`` builds the index from the store's id column; taking it over saves the first
    ``add_messages`` a walk that reads every message's id. ``messages`` is left without an index (rebuilt if
    reduced into again).
    """
    copied = MessageList(messages[:])
    if isinstance(messages, MessageList) and messages._index is not None and messages._length == len(messages):
        copied._index, copied._length = _take_index(messages), len(copied)
    return copied


def replaced_positions(before: Sequence[Message], after: Sequence[Message]) -> list[int] | None:
    """Positions of ``before`` that ``add_messages`` replaced to make ``after``; ``None`` if unknown."""
    if isinstance(after, MessageList) and after._base is not None and after._base is before:
        return after._replaced
    return None


# -- messages read back from a store ---------------------------------------------------------------------------
#
# A thread's history is loaded for every call on it, and most nodes read only its end: validating 10,000 stored
# messages costs more than the rest of a 50-step invoke (issue 34 item 3). So each stored message is validated
# when it is first used. The list stays a plain ``list`` of ``Message`` objects, which is what C code reads
# (``json``'s encoder, pydantic-core, ``==`` of lists, SDKs): a lazy *list* cannot be one, since C code reads a
# list's items without calling any method of it. What is deferred is each message's content: a
# ``_StoredMessage`` is a ``Message`` holding only its id (from the store's id column) and its stored form, and
# the first access to anything else validates it and turns it into an ordinary ``Message`` in place (same
# object, ``type()`` becomes ``Message``), so it is validated once wherever it is shared.
#
# Until then the pair (id, stored form) sits in pydantic's ``__pydantic_private__`` slot (``Message`` has no
# private attributes; validation sets the slot to what pydantic puts there): a slot set from C for the whole
# list, about half the cost of an instance dict per message, and the message's ``__dict__`` never holds
# anything but its fields.
#
# What changes: a stored message the schema rejects (written by hand, or by another version of agentrun) no
# longer fails the load; it raises ``StorageError`` naming it where it is first read, in the node or the engine
# (``turn_result`` reads the newest assistant message), which fails the run there as loudly. A message no one
# reads is never rewritten (a checkpoint writes only new and replaced messages), so it stays as it was stored.

_new = object.__new__
_set = object.__setattr__
_get = object.__getattribute__
_STORED = BaseModel.__dict__["__pydantic_private__"]  # the slot's descriptor: .__get__(m) / .__set__(m, v)
_STATE_SLOTS = ("__pydantic_fields_set__", "__pydantic_extra__")


class _StoredMessage(Message):
    """A message as read from a store, validated (and made a plain ``Message``) on first use; see above."""

    model_config = ConfigDict(defer_build=True)  # never validated as itself: no schema built at import

    def __getattribute__(self, name: str) -> Any:
        # Every attribute, pydantic's own included (``__dict__`` for model_dump and pydantic-core's serializer,
        # ``__eq__``'s reads, ``__reduce_ex__`` for pickle): whatever reads the message sees it validated.
        # Only its id (the reducer's index reads it) and its class are answered without.
        if name == "id":
            stored = _STORED.__get__(self)
            if type(stored) is tuple:
                return stored[0]
        elif name != "__class__":
            _validate_stored(self)
        return _get(self, name)

    # ``copy.copy`` and ``deepcopy`` look these up on the class and build ``type(self)``: validate first so
    # that the copy is a plain ``Message``.
    def __copy__(self) -> Any:  # a Message, not Self
        _validate_stored(self)
        return self.__copy__()

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Any:
        _validate_stored(self)
        return self.__deepcopy__(memo)


def _validate_stored(message: Message) -> None:
    """Validate a ``_StoredMessage`` from its stored form and make it a plain ``Message`` in place.

    Raises ``StorageError`` when the stored form is not a valid message, or its id is not the one the store's
    id column gave (the reducer's index was built from those); the message then stays unvalidated and raises
    again on its next use.
    """
    stored = _STORED.__get__(message)
    if type(stored) is tuple:  # else another thread validated it meanwhile (a sync node's worker thread)
        mid, body = stored
        try:
            valid = Message.model_validate_json(body) if isinstance(body, str) else Message.model_validate(body)
        except ValidationError as e:
            raise StorageError(f"stored message {mid!r} is not a valid message: {e}") from None
        if valid.id != mid:
            raise StorageError(f"stored message {mid!r} holds the id {valid.id!r}: the row is inconsistent")
        _set(message, "__dict__", _get(valid, "__dict__"))
        for slot in _STATE_SLOTS:
            _set(message, slot, _get(valid, slot))
        _STORED.__set__(message, _STORED.__get__(valid))
    # The class last: a thread reading the message meanwhile validates it too, or finds the fields in place,
    # never a plain ``Message`` without them.
    _set(message, "__class__", Message)


def stored_text(message: Message) -> str | None:
    """The JSON text a store gave for ``message``, if it is still unvalidated (``stored_messages``); else ``None``.

    For copying a loaded thread elsewhere (the Redis cache's fill) without validating every message.
    """
    if type(message) is not _StoredMessage:
        return None
    stored = _STORED.__get__(message)
    return stored[1] if type(stored) is tuple and isinstance(stored[1], str) else None


def stored_messages(ids: Sequence[str | None], bodies: Sequence[str | dict[str, Any]]) -> MessageList:
    """A thread's messages read back from a store, each validated when first used (``StorageError`` if invalid).

    ``ids[i]`` is the id the store recorded beside ``bodies[i]``, the message's stored form: its JSON text, or
    the JSON value itself (the memory store). The list carries the id index ``add_messages`` takes over, so the
    first step reads no message either.
    """
    messages = MessageList(map(_new, repeat(_StoredMessage, len(bodies))))
    deque(map(_STORED.__set__, messages, zip(ids, bodies, strict=True)), maxlen=0)  # from C: no loop in Python
    messages._index = {mid: i for i, mid in enumerate(ids) if mid is not None}
    messages._length = len(messages)
    return messages
