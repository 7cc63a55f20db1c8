"""OpenAIChatModel against a real local HTTP server that speaks the chat-completions wire format.

The server (aiohttp.web on 127.0.0.1, a free port) checks the bearer key,
records every request body, and answers from a per-test script, so each
test states exactly what the "provider" did and what agentrun must make of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import socket
import time
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from agentrun import (
    END,
    START,
    InMemoryCheckpointer,
    Message,
    ModelError,
    StateGraph,
    ToolCall,
    ToolNode,
    assistant,
    system,
    tool,
    tool_message,
    tools_condition,
    user,
)
from agentrun.config import DEFAULT_NODE_TIMEOUT
from agentrun.models import OpenAIChatModel
from agentrun.models.openai import DEFAULT_REQUEST_TIMEOUT

KEY_ENV = "AGENTRUN_TEST_OPENAI_KEY"
PROVIDER_ID = "chatcmpl-provider-0001"


# -- the fake provider --------------------------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict/list -> JSON; bytes -> sent as is
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Received:
    body: dict[str, Any]
    headers: dict[str, str]
    at: float
    peer: Any


Scripted = Reply | Callable[[dict[str, Any]], Reply]


class FakeProvider:
    def __init__(self, key: str) -> None:
        self.key = key
        self.url = ""
        self.script: list[Scripted] = []
        self.requests: list[Received] = []
        # Set at teardown so a reply that is still "thinking" ends and the server can shut down.
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.requests.append(Received(body, dict(request.headers), time.monotonic(), peer))
        presented = request.headers.get("Authorization", "")
        if presented != f"Bearer {self.key}":
            # Like a careless provider, echo what was presented: the adapter must redact it.
            return web.json_response(
                {
                    "error": {
                        "message": f"Incorrect API key provided: {presented.removeprefix('Bearer ')}.",
                        "type": "invalid_request_error",
                        "code": "invalid_api_key",
                    }
                },
                status=401,
            )
        if not self.script:
            return web.json_response({"error": {"message": "the test scripted no reply for this request"}}, status=418)
        step = self.script.pop(0)
        reply = step(body) if callable(step) else step
        if reply.delay:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.release.wait(), reply.delay)
        if isinstance(reply.body, bytes):
            return web.Response(status=reply.status, body=reply.body, headers=reply.headers)
        return web.json_response(reply.body, status=reply.status, headers=reply.headers)


def completion(content: str | None = None, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": PROVIDER_ID,
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "test-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def wire_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def error_body(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "server_error", "code": None}}


@pytest.fixture(autouse=True)
async def _no_tasks_left_behind() -> AsyncIterator[None]:
    """Fails a test that leaves tasks on its loop (sessions and servers closed, handlers ended).

    Set up before, so torn down after, the server and model fixtures. Kept here because the
    conftest guard looks at the policy's loop after pytest-asyncio has already closed it.
    """
    yield
    await asyncio.sleep(0)
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert not pending, f"test leaked asyncio tasks: {pending}"


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = f"sk-test-{secrets.token_hex(16)}"
    monkeypatch.setenv(KEY_ENV, key)
    return key


@pytest.fixture
async def provider(api_key: str) -> AsyncIterator[FakeProvider]:
    fake = FakeProvider(api_key)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.handle)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fake.url = f"http://127.0.0.1:{port}/v1"
    try:
        yield fake
    finally:
        fake.release.set()
        await runner.cleanup()


@pytest.fixture
async def make_model(provider: FakeProvider) -> AsyncIterator[Callable[..., OpenAIChatModel]]:
    models: list[OpenAIChatModel] = []

    def make(**kw: Any) -> OpenAIChatModel:
        kw.setdefault("base_url", provider.url)
        kw.setdefault("model", "test-model")
        kw.setdefault("api_key_env", KEY_ENV)
        kw.setdefault("retry_backoff", 0.01)
        model = OpenAIChatModel(**kw)
        models.append(model)
        return model

    yield make
    for model in models:
        await model.aclose()


def metric(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


# -- replies --------------------------------------------------------------------------------------


async def test_plain_text_reply_is_an_assistant_message_with_a_new_agentrun_id(
    provider: FakeProvider, make_model: Callable[..., OpenAIChatModel]
) -> None:
    provider.script = [Reply(body=completion("Hello there.")), Reply(body=completion("Hello again."))]
    model = make_model()
    first = (await model({"messages": [user("hi")]}))["messages"]
    second = (await model({"messages": [user("hi")]}))["messages"]
    assert len(first) == 1 and isinstance(first[0], Message)
    reply = first[0]
    assert (reply.role, reply.content, reply.tool_calls) == ("assistant", "Hello there.", [])
    assert reply.id and reply.id.startswith("msg_"), "the reply must get an agentrun message id"
    assert PROVIDER_ID not in (reply.id, second[0].id), "the provider's completion id must not become our id"
    assert reply.id != second[0].id, "every reply needs its own id (the ledger keys on it)"


async def test_three_parallel_tool_calls_map_to_tool_calls_with_raw_arguments(
    provider: FakeProvider, make_model: Callable[..., OpenAIChatModel]
) -> None:
    # Odd spacing on purpose: the string must arrive byte for byte, never re-serialized.
    raw = ['{"order_id": "4821"}', '{ "order_id" :"4821" , "amount": 49.99 }', "{}"]
    provider.script = [
        Reply(
            body=completion(
                None,
                [
                    wire_call("call_a", "lookup_order", raw[0]),
                    wire_call("call_b", "charge_card", raw[1]),
                    wire_call("call_c", "send_receipt", raw[2]),
                ],
            )
        )
    ]
    reply = (await make_model()({"messages": [user("charge order 4821")]}))["messages"][0]
    assert reply.role == "assistant" and reply.content == ""
    assert reply.tool_calls == [
        ToolCall(id="call_a", name="lookup_order", arguments=raw[0]),
        ToolCall(id="call_b", name="charge_card", arguments=raw[1]),
        ToolCall(id="call_c", name="send_receipt", arguments=raw[2]),
    ]


async def test_malformed_arguments_reach_the_tool_node_as_a_tool_error_and_the_run_continues(
    provider: FakeProvider, make_model: Callable[..., OpenAIChatModel]
) -> None:
    broken = '{"city": "Par'
    provider.script = [
        Reply(
            body=completion(
                None,
                [
                    wire_call("call_ok", "get_weather", '{"city": "Oslo"}'),
                    wire_call("call_bad", "get_weather", broken),
                ],
            )
        ),
        Reply(body=completion("Oslo is sunny; I could not read the other city.")),
    ]
    graph = StateGraph()
    graph.add_node("model", make_model(tools=[get_weather]))
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    app = graph.compile(InMemoryCheckpointer())

    out = await app.ainvoke("weather in Oslo and Paris?", {"thread_id": "malformed"})

    messages = out["messages"]
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert messages[1].tool_calls[1].arguments == broken, "the adapter must keep invalid JSON raw"
    results = {m.tool_call_id: m for m in messages[2:4]}
    assert not results["call_ok"].is_error and results["call_ok"].content == "sunny in Oslo"
    assert results["call_bad"].is_error and "not valid JSON" in results["call_bad"].content
    assert messages[-1].content.startswith("Oslo is sunny")
    snapshot = await app.aget_state("malformed")
    assert snapshot is not None and snapshot.status == "completed"
    # The model saw the tool error, tied to the call that caused it.
    sent = provider.requests[1].body["messages"]
    bad = next(m for m in sent if m.get("tool_call_id") == "call_bad")
    assert bad["role"] == "tool" and "not valid JSON" in bad["content"]


# -- errors -------------------------------------------------------------------------------------------


async def test_401_is_a_model_error_with_status_and_provider_message_and_never_shows_the_key(
    provider: FakeProvider,
    make_model: Callable[..., OpenAIChatModel],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = f"sk-wrong-{secrets.token_hex(16)}"
    monkeypatch.setenv(KEY_ENV, wrong)
    before = metric("agentrun_model_errors_total", {"code": "MODEL_HTTP_001"})
    with pytest.raises(ModelError) as info:
        await make_model()({"messages": [user("hi")]})
    error = info.value
    assert error.code == "MODEL_HTTP_001"
    assert "401" in str(error) and "Incorrect API key provided" in str(error)
    assert provider.requests[0].headers["Authorization"] == f"Bearer {wrong}", "the key was sent as a bearer token"
    # The provider echoed the key; it must be gone from everything a user or a log can see.
    everything = "".join(traceback.format_exception(error)) + repr(error) + caplog.text
    assert wrong not in everything, "the API key leaked into the error or the logs"
    assert len(provider.requests) == 1, "401 must not be retried"
    assert metric("agentrun_model_errors_total", {"code": "MODEL_HTTP_001"}) == before + 1


async def test_400_is_not_retried_and_carries_the_provider_message(
    provider: FakeProvider, make_model: Callable[..., OpenAIChatModel], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    provider.script = [
        Reply(400, {"error": {"message": "Invalid value for 'temperature': must be <= 2.", "type": "invalid_request"}}),
        Reply(body=completion("should never be fetched")),
    ]
    with pytest.raises(ModelError) as info:
        await make_model(temperature=7)({"messages": [user("hi")]})
    assert info.value.code == "MODEL_HTTP_001"
    assert "HTTP 400" in str(info.value) and "Invalid value for 'temperature'" in str(info.value)
    assert len(provider.requests) == 1, "a 4xx other than 429 must not be retried"
    assert provider.key not in str(info.value) + caplog.text


async def test_500_then_200_is_retried_and_succeeds(
    provider: FakeProvider, make_model: Callable[..., OpenAIChatModel], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    provider.script = [Reply(500, error_body("The server had an error")), Reply(body=completion("recovered"))]
    before = metric("agentrun_model_request_seconds_count")
    reply = (await make_model()({"messages": [user("hi")]}))["messages"][0]
    assert reply.content == "recovered"
    assert len(provider.requests) == 2
    assert provider.requests[0].body == provider.requests[1].body, "a retry must resend the same request"
    assert "will retry" in caplog.text and "HTTP 500" in caplog.text
    assert metric("agentrun_model_request_seconds_count") == before + 2, "each attempt is timed"


async def test_retries_are_bounded_by_max_attempts(
    provider: FakeProvider, make_model: Callable[..., OpenAIChatModel]
) -> None:
    provider.script = [*(Reply(503, error_body("overloaded")) for _ in range(3)), Reply(body=completion("late"))]
    with pytest.raises(ModelError) as info:
        await make_model(max_attempts=3)({"messages": [user("hi")]})
    assert info.value.code == "MODEL_HTTP_001"
    assert "HTTP 503" in str(info.value) and "overloaded" in str(info.value) and "3 attempt" in str(info.value)
    assert len(provider.requests) == 3


@pytest.mark.parametrize(("header", "value", "at_least"), [("Retry-After", "1", 0.95), ("retry-after-ms", "600", 0.55)])
async def test_429_waits_as_long_as_retry_after_says(
    provider: FakeProvider, make_model: Callable[..., OpenAIChatModel], header: str, value: str, at_least: float
) -> None:
    provider.script = [Reply(429, error_body("Rate limit reached"), {header: value}), Reply(body=completion("ok"))]
    # Backoff alone would wait about 10 ms; only honouring the header explains the gap.
    reply = (await make_model(retry_backoff=0.01)({"messages": [user("hi")]}))["messages"][0]
    assert reply.content == "ok"
    assert len(provider.requests) == 2
    gap = provider.requests[1].at - provider.requests[0].at
    assert gap >= at_least, f"retried after {gap:.3f}s, before the {header}: {value} the provider asked for"


async def test_429_asking_for_more_than_max_retry_delay_fails_at_once(
    provider: FakeProvider, make_model: Callable[..., OpenAIChatModel]
) -> None:
    provider.script = [Reply(429, error_body("Rate limit reached"), {"Retry-After": "120"}), Reply(body=completion())]
    started = time.monotonic()
    with pytest.raises(ModelError) as info:
        await make_model(max_retry_delay=30)({"messages": [user("hi")]})
    # At once, not after waiting max_retry_delay (30 s) or the 120 s asked for: a generous bound between them.
    assert time.monotonic() - started < 15
    assert info.value.code == "MODEL_HTTP_001" and "HTTP 429" in str(info.value) and "120" in str(info.value)
    assert len(provider.requests) == 1


async def test_a_slow_model_fails_with_model_timeout_and_is_not_retried(
    provider: FakeProvider, make_model: Callable[..., OpenAIChatModel]
) -> None:
    provider.script = [Reply(body=completion("too late"), delay=30), Reply(body=completion("retried"))]
    before = metric("agentrun_model_errors_total", {"code": "MODEL_TIMEOUT_001"})
    started = time.monotonic()
    with pytest.raises(ModelError) as info:
        await make_model(request_timeout=0.3)({"messages": [user("hi")]})
    assert info.value.code == "MODEL_TIMEOUT_001"
    assert time.monotonic() - started < 15, "request_timeout did not bound the request (the reply takes 30 s)"
    assert len(provider.requests) == 1, "a timed-out request must not be retried (it would outlive the node deadline)"
    assert metric("agentrun_model_errors_total", {"code": "MODEL_TIMEOUT_001"}) == before + 1


def test_the_default_request_timeout_sits_below_the_node_deadline() -> None:
    model = OpenAIChatModel(base_url="http://127.0.0.1:9/v1", model="m")
    assert model.request_timeout == DEFAULT_REQUEST_TIMEOUT == 600
    assert DEFAULT_REQUEST_TIMEOUT < DEFAULT_NODE_TIMEOUT, "a slow model must fail with its own error first"


async def test_connection_refused_is_retried_then_fails_with_a_connection_error(
    make_model: Callable[..., OpenAIChatModel], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ModelError) as info:
        await make_model(base_url=f"http://127.0.0.1:{port}/v1", max_attempts=2)({"messages": [user("hi")]})
    assert info.value.code == "MODEL_CONNECTION_001" and "2 attempt" in str(info.value)
    assert caplog.text.count("will retry") == 1


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"id": PROVIDER_ID, "choices": []}, "'choices' is missing or empty"),
        ({"error": {"message": "upstream overloaded"}}, "upstream overloaded"),
        (b"<html>502 Bad Gateway</html>", "not JSON"),
        (completion(None, [{"id": "call_1", "type": "function", "function": {"arguments": "{}"}}]), "no function name"),
        ({"choices": [{"index": 0, "message": {"role": "assistant", "content": {"text": "x"}}}]}, "not a string"),
    ],
    ids=["no-choices", "error-in-200", "not-json", "call-without-name", "content-not-text"],
)
async def test_a_malformed_completion_is_a_model_response_error(
    provider: FakeProvider, make_model: Callable[..., OpenAIChatModel], body: Any, reason: str
) -> None:
    provider.script = [Reply(body=body)]
    with pytest.raises(ModelError) as info:
        await make_model()({"messages": [user("hi")]})
    assert info.value.code == "MODEL_RESPONSE_001"
    assert reason in str(info.value)


# -- the request ----------------------------------------------------------------------------------


async def test_the_request_body_is_the_chat_completions_wire_format(
    provider: FakeProvider, make_model: Callable[..., OpenAIChatModel], api_key: str
) -> None:
    provider.script = [Reply(body=completion("It is sunny in both."))]
    history = [
        system("You are terse."),
        user("Weather in Oslo and Paris?", name="ada"),
        assistant(
            tool_calls=[
                ToolCall(id="call_1", name="get_weather", arguments='{"city": "Oslo"}'),
                ToolCall(id="call_2", name="get_weather", arguments='{"city": "Par'),
            ]
        ),
        tool_message("sunny in Oslo", tool_call_id="call_1", name="get_weather"),
        tool_message("Error: arguments are not valid JSON", tool_call_id="call_2", name="get_weather", is_error=True),
        assistant("Paris failed; retrying."),
        user("thanks"),
    ]
    model = make_model(tools=[get_weather], temperature=0.2, extra_body={"max_tokens": 64, "tool_choice": "auto"})
    await model({"messages": history})

    received = provider.requests[0]
    assert received.headers["Authorization"] == f"Bearer {api_key}"
    assert received.headers["Content-Type"].startswith("application/json")
    assert received.body == {
        "model": "test-model",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Oslo and Paris?", "name": "ada"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Par'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny in Oslo"},
            {"role": "tool", "tool_call_id": "call_2", "content": "Error: arguments are not valid JSON"},
            {"role": "assistant", "content": "Paris failed; retrying."},
            {"role": "user", "content": "thanks"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "The weather in a city.",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                        "additionalProperties": False,
                    },
                },
            }
        ],
        "temperature": 0.2,
        "max_tokens": 64,
        "tool_choice": "auto",
    }


async def test_the_key_can_come_from_a_secret_file_or_a_callable_but_not_a_literal(
    provider: FakeProvider, make_model: Callable[..., OpenAIChatModel], api_key: str, tmp_path: Path
) -> None:
    secret = tmp_path / "api-key"
    secret.write_text(api_key + "\n")  # mounted Secrets often end with a newline
    provider.script = [Reply(body=completion("from file")), Reply(body=completion("from callable"))]
    by_file = make_model(api_key_env=None, api_key_file=secret)
    by_callable = make_model(api_key_env=None, api_key=lambda: api_key)
    assert (await by_file({"messages": [user("hi")]}))["messages"][0].content == "from file"
    assert (await by_callable({"messages": [user("hi")]}))["messages"][0].content == "from callable"
    with pytest.raises(TypeError, match="never as a literal"):
        OpenAIChatModel(base_url=provider.url, model="m", api_key=api_key)  # type: ignore[arg-type]
    missing = make_model(api_key_env=None, api_key_file=tmp_path / "absent")
    with pytest.raises(ModelError) as info:
        await missing({"messages": [user("hi")]})
    assert info.value.code == "MODEL_CONFIG_001"
    assert len(provider.requests) == 2, "no request may be sent without the configured key"


async def test_without_a_key_no_authorization_header_is_sent_and_the_401_says_where_to_put_one(
    provider: FakeProvider, make_model: Callable[..., OpenAIChatModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ModelError) as info:
        await make_model()({"messages": [user("hi")]})
    assert "Authorization" not in provider.requests[0].headers
    assert info.value.code == "MODEL_HTTP_001" and f"{KEY_ENV} is not set" in str(info.value)


async def test_one_session_per_loop_reuses_its_connection_and_aclose_ends_it(
    provider: FakeProvider, make_model: Callable[..., OpenAIChatModel]
) -> None:
    provider.script = [Reply(body=completion(str(i))) for i in range(3)]
    model = make_model()
    await model({"messages": [user("1")]})
    await model({"messages": [user("2")]})
    assert provider.requests[0].peer == provider.requests[1].peer, "the session should keep its connection alive"
    session = model._session()
    await model.aclose()
    assert session.closed
    assert (await model({"messages": [user("3")]}))["messages"][0].content == "2", "a new session after aclose"
    assert model._session() is not session


# -- end to end -----------------------------------------------------------------------------------


async def test_support_agent_loop_against_the_local_server(
    provider: FakeProvider,
    make_model: Callable[..., OpenAIChatModel],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The example's loop (model -> tools -> model -> END) with the model behind real HTTP."""
    effects = tmp_path / "effects.db"
    monkeypatch.setenv("SUPPORT_EFFECTS_DB", str(effects))
    from examples.support_agent import charge_card, count_effects, lookup_order, send_receipt

    def llm(body: dict[str, Any]) -> Reply:
        """What a tool-calling model answers: three parallel calls, then a summary of their results."""
        last = body["messages"][-1]
        if last["role"] == "user":
            args = json.dumps({"order_id": "4821"})
            return Reply(
                body=completion(
                    None,
                    [
                        wire_call("call_1", "lookup_order", args),
                        wire_call("call_2", "charge_card", args),
                        wire_call("call_3", "send_receipt", args),
                    ],
                )
            )
        results = [m for m in body["messages"] if m["role"] == "tool"]
        return Reply(body=completion("Done. " + " | ".join(m["content"] for m in results)))

    provider.script = [llm, llm]
    tools = [lookup_order, charge_card, send_receipt]
    graph = StateGraph()
    graph.add_node("model", make_model(tools=tools))
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    app = graph.compile(InMemoryCheckpointer())

    out = await app.ainvoke("charge my saved card for order 4821 and email me the receipt", {"thread_id": "e2e"})

    assert [m.role for m in out["messages"]] == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    assert not any(m.is_error for m in out["messages"])
    assert out["messages"][-1].content.startswith("Done. ")
    assert count_effects(str(effects))["charges"] == 1
    assert len(provider.requests) == 2
    first, second = (r.body for r in provider.requests)
    assert [t["function"]["name"] for t in first["tools"]] == ["lookup_order", "charge_card", "send_receipt"]
    sent_ids = {m["tool_call_id"] for m in second["messages"] if m["role"] == "tool"}
    assert sent_ids == {"call_1", "call_2", "call_3"}, "every tool result goes back tied to its call"


# -- the turn's model usage (issue 9: what the operator exports, so it outlives a short pod) ------------


async def test_each_attempt_is_a_request_of_the_turn_s_usage_with_its_status_and_the_tokens_of_the_answer(
    provider: FakeProvider, make_model: Callable[..., OpenAIChatModel]
) -> None:
    provider.script = [Reply(503, error_body("overloaded")), Reply(200, completion("hi"))]
    graph = StateGraph()
    graph.add_node("model", make_model(model="usage-model"))
    graph.add_edge(START, "model")
    graph.add_edge("model", END)
    checkpointer = InMemoryCheckpointer()
    await graph.compile(checkpointer).ainvoke("hello", {"thread_id": "usage"})
    state = await checkpointer.aget("usage")
    assert state is not None
    usage = state.meta["model_usage"]["usage-model"]
    assert usage["requests"] == {"ok": 1, "error": 1}, "the retried 503 and the answer are two requests"
    assert usage["tokens"] == {"prompt": 10, "completion": 5}, "the completion's usage block must be read"
    assert usage["seconds"]["ok"] > 0 and usage["seconds"]["error"] > 0


async def test_a_2xx_body_that_is_no_completion_is_an_error_request(
    provider: FakeProvider, make_model: Callable[..., OpenAIChatModel]
) -> None:
    provider.script = [Reply(200, {"choices": []})]
    graph = StateGraph()
    graph.add_node("model", make_model(model="usage-bad-body"))
    graph.add_edge(START, "model")
    graph.add_edge("model", END)
    checkpointer = InMemoryCheckpointer()
    with pytest.raises(ModelError):
        await graph.compile(checkpointer).ainvoke("hello", {"thread_id": "usage-bad"})
    state = await checkpointer.aget("usage-bad")
    assert state is not None and state.status == "failed"
    assert state.meta["model_usage"]["usage-bad-body"]["requests"] == {"ok": 0, "error": 1}
