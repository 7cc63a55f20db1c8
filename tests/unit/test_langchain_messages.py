"""Message converters between agentrun and LangChain (issue 12): round trips, as properties (hypothesis).

Guarantee protected: a conversation crosses the boundary both ways without
losing what the ledger and the model depend on: ids, roles, text and content
parts, tool calls with their ids and arguments, tool results with their call
id and error status.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from agentrun.integrations.langchain import from_langchain, to_langchain
from agentrun.messages import Message, ToolCall, coerce_message

text = st.text(max_size=40)
ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=20)
json_scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=10)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
)
arguments = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
parts = st.lists(
    st.one_of(
        st.builds(lambda t: {"type": "text", "text": t}, text),
        st.builds(lambda u: {"type": "image_url", "image_url": {"url": f"https://example.com/{u}.png"}}, ids),
    ),
    min_size=1,
    max_size=4,
)


@st.composite
def messages(draw: Any) -> Message:
    role = draw(st.sampled_from(["user", "system", "assistant", "tool"]))
    structured = draw(parts) if role in ("user", "system") and draw(st.booleans()) else None
    content = "".join(p["text"] for p in structured if p["type"] == "text") if structured else draw(text)
    fields: dict[str, Any] = {"id": "msg_" + draw(ids), "role": role, "content": content, "parts": structured}
    if role == "assistant":
        call_ids = draw(st.lists(ids, max_size=3, unique=True))
        fields["tool_calls"] = [
            ToolCall(id=cid, name=draw(ids), arguments=json.dumps(draw(arguments), ensure_ascii=False))
            for cid in call_ids
        ]
    if role == "tool":
        fields.update(tool_call_id=draw(ids), name=draw(ids), is_error=draw(st.booleans()))
    elif draw(st.booleans()):
        fields["name"] = draw(ids)
    return Message(**fields)


@settings(max_examples=200, deadline=None)
@given(messages())
def test_agentrun_to_langchain_and_back_is_the_same_message(message: Message) -> None:
    back = from_langchain(to_langchain(message))
    assert back == message, "the round trip through LangChain changed the message"
    assert coerce_message(to_langchain(message)) == message, "coerce_message does not accept LangChain messages"


@st.composite
def langchain_messages(draw: Any) -> Any:
    kind = draw(st.sampled_from(["human", "system", "ai", "tool"]))
    content: Any = draw(parts) if kind in ("human", "system") and draw(st.booleans()) else draw(text)
    common = {"content": content, "id": "msg_" + draw(ids)}
    if kind == "human":
        return HumanMessage(**common)
    if kind == "system":
        return SystemMessage(**common)
    if kind == "tool":
        status = draw(st.sampled_from(["success", "error"]))
        return ToolMessage(**common, tool_call_id=draw(ids), name=draw(ids), status=status)
    calls = [
        {"name": draw(ids), "args": draw(arguments), "id": cid, "type": "tool_call"}
        for cid in draw(st.lists(ids, max_size=3, unique=True))
    ]
    return AIMessage(**common, tool_calls=calls)


@settings(max_examples=200, deadline=None)
@given(langchain_messages())
def test_langchain_to_agentrun_and_back_is_the_same_message(message: Any) -> None:
    back = to_langchain(from_langchain(message))
    assert type(back) is type(message)
    assert (back.id, back.content, back.name) == (message.id, message.content, message.name)
    if isinstance(message, AIMessage):
        assert back.tool_calls == message.tool_calls, "tool calls (ids, names, arguments) did not survive"
    if isinstance(message, ToolMessage):
        assert (back.tool_call_id, back.status) == (message.tool_call_id, message.status)


def test_invalid_tool_arguments_survive_as_written() -> None:
    """The model's invalid JSON must reach the tool node as written, which answers with a tool error."""
    message = Message(role="assistant", tool_calls=[ToolCall(id="call_1", name="charge", arguments='{"order": ')])
    converted = to_langchain(message)
    assert isinstance(converted, AIMessage) and not converted.tool_calls
    assert converted.invalid_tool_calls[0]["args"] == '{"order": '
    assert from_langchain(converted).tool_calls == message.tool_calls


def test_a_message_without_parts_is_stored_as_before() -> None:
    assert "parts" not in Message(role="user", content="hi").to_json()
    assert Message.from_json(Message(role="user", content="x", parts=[{"type": "text", "text": "x"}]).to_json()).parts
