"""State schemas and reducers (pure data; no I/O).

A schema is a ``TypedDict`` whose fields are channels. A field annotated as
``Annotated[T, reducer]`` merges updates with ``reducer(old, new)``; any other
field is overwritten by an update. The ``messages`` channel is special only
to storage: it is persisted row by row, so a step writes just the messages it
added, and every other channel must be JSON-serializable.
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from .errors import InvalidUpdateError
from .messages import Message, add_messages

MESSAGES = "messages"

Reducer = Callable[[Any, Any], Any]


class MessagesState(TypedDict, total=False):
    """The default schema: one appending ``messages`` channel."""

    messages: Annotated[list[Message], add_messages]


@dataclass(frozen=True)
class Replace:
    """An update value that bypasses the channel's reducer and overwrites it.

    The tool node uses it for fields a tool mutated in place: the new value is
    already the whole merged value, and reducing it again would duplicate it.
    """

    value: Any


class StateSchema:
    """The channels of a graph's state and how updates merge into them."""

    def __init__(self, schema: type | None = None) -> None:
        self.schema = schema or MessagesState
        hints = typing.get_type_hints(self.schema, include_extras=True)
        self.reducers: dict[str, Reducer | None] = {}
        for name, hint in hints.items():
            reducer = None
            if typing.get_origin(hint) is Annotated:
                for meta in hint.__metadata__:
                    if callable(meta):
                        reducer = meta
            self.reducers[name] = reducer
        if MESSAGES in self.reducers and self.reducers[MESSAGES] is None:
            self.reducers[MESSAGES] = add_messages

    @property
    def channels(self) -> list[str]:
        """The state's channel names."""
        return list(self.reducers)

    def initial(self) -> dict[str, Any]:
        """The state a new thread starts with (an empty message list if it has one)."""
        return {MESSAGES: []} if MESSAGES in self.reducers else {}

    def apply(self, state: dict[str, Any], update: dict[str, Any] | None) -> dict[str, Any]:
        """Merge ``update`` into a new state dict; raises ``InvalidUpdateError`` for unknown keys."""
        if update is None:
            return state
        if not isinstance(update, dict):
            raise InvalidUpdateError(
                f"a node must return a dict of channel updates or None, got {type(update).__name__}"
            )
        merged = dict(state)
        for key, value in update.items():
            if key not in self.reducers:
                raise InvalidUpdateError(
                    f"update key {key!r} is not a channel of {self.schema.__name__} "
                    f"(channels: {', '.join(self.reducers)})"
                )
            if isinstance(value, Replace):
                merged[key] = value.value
                continue
            reducer = self.reducers[key]
            if reducer is not None and key in merged:
                merged[key] = reducer(merged[key], value)
            elif reducer is add_messages:
                merged[key] = add_messages([], value)
            else:
                merged[key] = value
        return merged


# Values that need no copy: immutable, and what JSON holds at the leaves.
_IMMUTABLE = frozenset({str, int, float, bool, type(None), bytes})


def copy_value(value: Any) -> Any:
    """A deep copy of a channel's value, fast for the JSON shapes state holds, ``copy.deepcopy`` for the rest.

    A step copies every channel for its node's input; ``copy.deepcopy`` dispatches on every element
    (about 6 us for a 25-int list, 1.8 us here). Lists and dicts are rebuilt, immutable leaves shared;
    other objects (models, sets, tuples) go to ``deepcopy`` as before. Aliasing inside a value is not
    kept, as JSON, where the value is persisted, does not keep it either.
    """
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    if kind is list:
        if all(type(item) in _IMMUTABLE for item in value):
            return value.copy()
        return [copy_value(item) for item in value]
    if kind is dict:
        return {key: copy_value(item) for key, item in value.items()}
    return copy.deepcopy(value)


def snapshot_fields(state: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of every channel except ``messages`` (the baseline for merging branches)."""
    return {k: copy_value(v) for k, v in state.items() if k != MESSAGES}


def node_input(state: dict[str, Any]) -> dict[str, Any]:
    """The state as a node receives it: channels deep-copied, so in-place changes reach the run only
    through the node's update, and a node that fails, times out or is stopped leaves no trace.

    Messages are shared, not copied: they are immutable records (a change is a new message with the
    same id, through the reducer).
    """
    copied = snapshot_fields(state)
    if MESSAGES in state:
        messages = state[MESSAGES]
        # A slice copies a list's pointers at once; list() of a MessageList walks it as an iterable.
        copied[MESSAGES] = messages[:] if isinstance(messages, list) else list(messages)
    return copied


def last_tool_request(state: dict[str, Any]) -> Message | None:
    """The last message if it is an assistant message asking for tools (a tool node's work), else ``None``."""
    messages = state.get(MESSAGES) or []
    if messages and messages[-1].role == "assistant" and messages[-1].tool_calls:
        return messages[-1]  # type: ignore[no-any-return]
    return None


def changed_fields(baseline: dict[str, Any], branch: dict[str, Any]) -> dict[str, Any]:
    """The non-message channels whose value in ``branch`` differs from ``baseline``."""
    changed: dict[str, Any] = {}
    for key, value in branch.items():
        if key == MESSAGES:
            continue
        if key not in baseline or baseline[key] != value:
            changed[key] = value
    return changed
