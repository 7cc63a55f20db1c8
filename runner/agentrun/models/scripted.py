"""A deterministic model for examples and tests: a function from the conversation to a reply.

It behaves like a model node (returns ``{"messages": [reply]}``) so a graph
written against it runs unchanged with a real model adapter.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..messages import Message, assistant, new_message_id
from ..state import MESSAGES

Respond = Callable[[Sequence[Message]], Message | str | Awaitable[Message | str]]


class ScriptedModel:
    """``ScriptedModel(lambda messages: assistant("hi"))``, or ``ScriptedModel.replies([...])``."""

    def __init__(self, respond: Respond, *, name: str = "model") -> None:
        self.respond = respond
        self.name = name
        self.calls = 0

    @classmethod
    def replies(cls, replies: Sequence[Message | str], *, name: str = "model") -> ScriptedModel:
        """Answer the n-th call with the n-th reply (by the number of assistant messages so far)."""

        def respond(messages: Sequence[Message]) -> Message | str:
            turn = sum(1 for m in messages if m.role == "assistant")
            if turn >= len(replies):
                raise IndexError(f"scripted model has {len(replies)} replies, asked for reply {turn + 1}")
            reply = replies[turn]
            # A fresh copy each time: the same script must not reuse one message id across threads.
            if isinstance(reply, Message):
                return reply.model_copy(update={"id": new_message_id()})
            return reply

        return cls(respond, name=name)

    async def __call__(self, state: dict[str, Any]) -> dict[str, Any]:
        """Answer the conversation with the script's next reply (the node a test graph runs)."""
        self.calls += 1
        reply = self.respond(list(state.get(MESSAGES, [])))
        if inspect.isawaitable(reply):
            reply = await reply
        if isinstance(reply, str):
            reply = assistant(reply)
        return {MESSAGES: [reply]}
