"""A model endpoint answering text that is not Unicode: the run goes on (issue 13, tool arguments).

Providers escape text as JSON; a reply cut inside an emoji (``"\\ud83d"``)
decodes to an unpaired surrogate, which no store takes: the step's
checkpoint failed, and the run crashed on every attempt. Here a real local
HTTP server (aiohttp) answers the real ``OpenAIChatModel`` with such text in
the content, in a tool call's arguments (escaped inside the arguments text,
and raw in it) and in its id; the run completes on a real store, with U+FFFD
in place of each unpaired surrogate.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from agentrun import END, START, StateGraph, ToolNode, tool, tools_condition
from agentrun.models import OpenAIChatModel
from tests.badinput.conftest import Store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

got: list[str] = []


@tool
async def lookup_order(order_id: str) -> str:
    got.append(order_id)
    return f"order {order_id}"


def _body(message: str) -> bytes:
    """A chat completion whose ``message`` object is given as raw JSON text (escapes kept as written)."""
    return (
        '{"id": "c1", "object": "chat.completion", "model": "m", "choices": [{"index": 0, "finish_reason": "stop", '
        f'"message": {message}}}], "usage": {{"prompt_tokens": 1, "completion_tokens": 1}}}}'
    ).encode()


# The first reply: half an emoji in the content; calls whose arguments hold a lone surrogate escaped in the
# arguments text, raw in it (the outer JSON decodes \ud83d), and in the call id.
FIRST = _body(
    '{"role": "assistant", "content": "let me look \\ud83d", "tool_calls": ['
    '{"id": "call_1", "type": "function", "function": {"name": "lookup_order", '
    '"arguments": "{\\"order_id\\": \\"\\\\ud83d\\"}"}}, '
    '{"id": "call_2", "type": "function", "function": {"name": "lookup_order", '
    '"arguments": "{\\"order_id\\": \\"x\\ud83dy\\"}"}}, '
    '{"id": "call_\\udc00", "type": "function", "function": {"name": "lookup_order", '
    '"arguments": "{\\"order_id\\": \\"4821\\"}"}}]}'
)
SECOND = _body('{"role": "assistant", "content": "done \\udfff"}')


@pytest.fixture
async def provider() -> AsyncIterator[str]:
    replies = [FIRST, SECOND]

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=replies.pop(0), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


async def test_a_reply_holding_unpaired_surrogates_is_stored_with_replacement_characters(
    store: Store, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "\ud83d" in json.loads(FIRST)["choices"][0]["message"]["content"], "the test's body is not what it says"
    monkeypatch.setenv("BADINPUT_KEY", "k")
    model = OpenAIChatModel(base_url=provider, model="m", tools=[lookup_order], api_key_env="BADINPUT_KEY")
    graph = StateGraph()
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([lookup_order]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    got.clear()
    try:
        values = await graph.compile(await store.open()).ainvoke("where is my order?", {"thread_id": "t"})
    finally:
        await model.aclose()
    messages: list[Any] = values["messages"]
    assert messages[1].content == "let me look \ufffd" and messages[-1].content == "done \ufffd"
    results = {m.tool_call_id: m for m in messages if m.role == "tool"}
    assert results["call_1"].is_error and "surrogate" in results["call_1"].content  # escaped: refused
    assert got == ["x\ufffdy", "4821"], got  # raw in the text: replaced, as an API server's JSON decoder does
    assert "call_\ufffd" in results
    state = await (await store.open()).aget("t")
    assert state is not None and state.status == "completed"
    assert [m.content for m in state.messages] == [m.content for m in messages]
