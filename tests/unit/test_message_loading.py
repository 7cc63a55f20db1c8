"""Loading a thread's stored messages in one validation (``Message.many_from_json_texts``)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from agentrun.messages import Message, ToolCall, assistant, tool_message, user


def stored(*messages: Message) -> list[str]:
    return [json.dumps(m.to_json()) for m in messages]


def test_many_texts_decode_as_each_one_does() -> None:
    messages = [
        user("hi"),
        assistant("", [ToolCall(id="call_1", name="charge", arguments='{"amount": 5}')]),
        tool_message("ok", tool_call_id="call_1", name="charge"),
        Message(role="user", content="a picture", parts=[{"type": "image_url", "image_url": {"url": "x"}}]),
    ]
    texts = stored(*messages)
    assert Message.many_from_json_texts(texts) == [Message.from_json(json.loads(t)) for t in texts] == messages
    assert Message.many_from_json_texts([]) == []


def test_a_malformed_stored_message_fails_the_load() -> None:
    texts = stored(user("hi"))
    with pytest.raises(ValidationError):
        Message.many_from_json_texts([*texts, '{"role": "robot", "content": "x"}'])


def test_a_text_holding_two_values_is_not_taken_for_two_messages() -> None:
    # A store without a JSON column type could hold such a text; joined into one array it would parse as
    # two messages and shift every later one. It must fail like the one-by-one decode.
    two = '{"role": "user", "content": "a"},{"role": "user", "content": "b"}'
    with pytest.raises(json.JSONDecodeError):
        Message.many_from_json_texts([two])
