"""A model node for any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, llama.cpp, Ollama, ...).

``OpenAIChatModel(base_url=..., model=..., tools=[...])`` is a graph node: it
sends the conversation to ``POST {base_url}/chat/completions`` and returns
``{"messages": [assistant reply]}``. Tool-call ``arguments`` are kept as the
raw string the model wrote, so invalid JSON reaches the tool node (which
answers with a tool error message) instead of failing the model step.

Hazards and limits:

- The model call is NOT in the tool ledger. When a process dies while this
  node runs, or after it returns but before the step is checkpointed, the
  resumed run asks the model again: that costs tokens and the answer may
  differ. Nothing is executed twice because of it: the tool calls of a reply
  only run after the reply is checkpointed (the engine makes that write
  durable even with ``durable_checkpoint_every_step: false``).
- The API key is read at request time from an environment variable, a secret
  file or a callable, never stored on the object and never logged; provider
  text that echoes it is redacted before it reaches an error or a log line.
  Passing the key as a literal string is refused.
- ``request_timeout`` (default 600 s) bounds ONE HTTP attempt and is below
  the engine's node deadline (900 s), so a slow model fails with
  ``MODEL_TIMEOUT_001`` rather than an anonymous node timeout. A timeout is
  not retried for the same reason. 429, 5xx and connection failures are
  retried (``max_attempts`` in all, exponential backoff, ``Retry-After``
  honoured); several slow failures in a row can still reach the node
  deadline.
- One aiohttp session per event loop, created on first use. Call
  ``await model.aclose()`` before the loop ends; a session whose loop ended
  first cannot be closed any more and is dropped (aiohttp then warns about
  its unclosed connector). Blocking ``CompiledGraph.invoke()`` runs each call
  on a fresh loop, so prefer ``ainvoke`` with a long-lived model.

Error codes (``ModelError.code``): ``MODEL_HTTP_001`` (an HTTP error status,
with the status and the provider's message), ``MODEL_TIMEOUT_001``,
``MODEL_CONNECTION_001`` (no HTTP response), ``MODEL_RESPONSE_001`` (a body
that is not a chat completion), ``MODEL_CONFIG_001`` (the key file cannot be
read).

Token usage: the ``usage`` block of a completion (``prompt_tokens``,
``completion_tokens``) is added to ``agentrun_model_tokens_total{model,kind}``
and to the turn's checkpointed model usage (``agentrun.usage``), which the
operator exports as ``agentrun_operator_model_tokens_total`` so it survives a
short pod; the ``model`` label is the configured model name (bounded: it
comes from the graph's code). A body without ``usage`` (some local servers)
counts nothing. Each HTTP attempt is one request of the turn's usage, ``ok``
when it answered with a usable completion, else ``error``.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from ..config import parse_timeout
from ..context import current_run
from ..decorator import tool
from ..errors import ModelError
from ..messages import Message, ToolCall, assistant, coerce_message, unicode_text
from ..metrics import MODEL_ERRORS
from ..state import MESSAGES
from ..tools import Tool
from .metering import record_request, record_tokens

# Below config.DEFAULT_NODE_TIMEOUT (900 s) on purpose; see the module docstring.
DEFAULT_REQUEST_TIMEOUT = 600.0

# Keys the adapter owns; extra_body may not replace them (stream=True would break parsing).
_RESERVED = frozenset({"model", "messages", "tools", "stream"})
_RETRYABLE_CONNECTION_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)
_SNIPPET = 500

_module_log = logging.getLogger("agentrun.models.openai")


def _log() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """The run's logger (thread and attempt prefix) inside a run, else the module logger."""
    ctx = current_run.get()
    return ctx.log if ctx is not None else _module_log


class OpenAIChatModel:
    """A chat-completions client usable as a graph node.

    ``api_key`` is a callable returning the key (or ``None``), ``api_key_file``
    a file holding it (re-read on every request, so a rotated Secret is
    picked up), else the environment variable ``api_key_env`` is read. With
    no key at all no ``Authorization`` header is sent (local servers often
    need none).
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        api_key_env: str | None = "OPENAI_API_KEY",
        api_key_file: str | os.PathLike[str] | None = None,
        api_key: Callable[[], str | None] | None = None,
        request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
        temperature: float | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_attempts: int = 3,
        retry_backoff: float = 1.0,
        max_retry_delay: float = 60.0,
        name: str = "model",
    ) -> None:
        if api_key is not None and not callable(api_key):
            raise TypeError(
                "api_key must be a callable returning the key; pass the key through an environment "
                "variable (api_key_env=) or a secret file (api_key_file=), never as a literal"
            )
        reserved = _RESERVED.intersection(extra_body or {})
        if reserved:
            raise ValueError(f"extra_body may not set {sorted(reserved)}; the adapter owns these fields")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {max_attempts}")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self.name = name
        self.tools = [t if isinstance(t, Tool) else tool(t) for t in tools]
        self.api_key_env = api_key_env
        self.api_key_file = Path(api_key_file) if api_key_file is not None else None
        self._api_key = api_key
        self.request_timeout = parse_timeout("request_timeout", request_timeout, DEFAULT_REQUEST_TIMEOUT)
        self.temperature = temperature
        self.extra_body = dict(extra_body or {})
        self.max_attempts = max_attempts
        self.retry_backoff = retry_backoff
        self.max_retry_delay = max_retry_delay
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}

    def __repr__(self) -> str:
        return f"OpenAIChatModel(base_url={self.base_url!r}, model={self.model!r}, tools={len(self.tools)})"

    # -- the node ------------------------------------------------------------

    async def __call__(self, state: dict[str, Any]) -> dict[str, Any]:
        """Ask the model for the next message; raises ``ModelError`` (see the module docstring)."""
        messages = [coerce_message(m) for m in state.get(MESSAGES, [])]
        reply = await self.complete(messages)
        return {MESSAGES: [reply]}

    async def complete(self, messages: Sequence[Message]) -> Message:
        """One chat completion: the assistant reply, with a new agentrun message id."""
        try:
            key = self._read_api_key()
            raw, started = await self._post(self.request_body(messages), key)
            try:
                reply = self._parse(self._decode(raw, key))
            except ModelError:
                record_request(self.model, "error", time.perf_counter() - started)
                raise
            record_request(self.model, "ok", time.perf_counter() - started)
            return reply
        except ModelError as e:
            MODEL_ERRORS.labels(e.code).inc()
            raise

    def request_body(self, messages: Sequence[Message]) -> dict[str, Any]:
        """The JSON body sent to the endpoint (public so that tests and debugging can see it)."""
        body: dict[str, Any] = {"model": self.model, "messages": [to_wire(m) for m in messages]}
        if self.tools:
            body["tools"] = [t.spec() for t in self.tools]
        if self.temperature is not None:
            body["temperature"] = self.temperature
        body.update(self.extra_body)
        return body

    async def aclose(self) -> None:
        """Close the session of the running loop and forget sessions of loops that have ended."""
        loop = asyncio.get_running_loop()
        session = self._sessions.pop(loop, None)
        self._forget_dead_loops()
        if session is not None and not session.closed:
            await session.close()

    # -- HTTP ----------------------------------------------------------------

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            self._forget_dead_loops()
            timeout = aiohttp.ClientTimeout(total=self.request_timeout)
            session = aiohttp.ClientSession(timeout=timeout)
            self._sessions[loop] = session
        return session

    def _forget_dead_loops(self) -> None:
        for dead in [loop for loop in self._sessions if loop.is_closed()]:
            self._sessions.pop(dead, None)

    def _read_api_key(self) -> str | None:
        if self._api_key is not None:
            return self._api_key() or None
        if self.api_key_file is not None:
            try:
                return self.api_key_file.read_text().strip() or None
            except OSError as e:
                reason = e.strerror or type(e).__name__
                raise ModelError(
                    f"cannot read the API key file {str(self.api_key_file)!r}: {reason}", code=ModelError.CONFIG
                ) from None
        if self.api_key_env:
            return os.environ.get(self.api_key_env) or None
        return None

    async def _post(self, payload: dict[str, Any], key: str | None) -> tuple[bytes, float]:
        """POST with retries; returns the body of a 2xx answer and when its attempt started (``perf_counter``).

        Every failed attempt is recorded as an ``error`` request here; the caller records the answered one
        once it knows whether the body is a usable completion.
        """
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(payload, ensure_ascii=False).encode()
        session = self._session()
        for attempt in range(1, self.max_attempts + 1):
            started = time.perf_counter()
            try:
                async with session.post(self.url, data=data, headers=headers) as response:
                    status = response.status
                    raw = await response.read()
                    retry_after = _retry_after(response.headers)
            except TimeoutError:
                record_request(self.model, "error", time.perf_counter() - started)
                raise ModelError(
                    f"{self.model} at {self.url} did not answer within {self.request_timeout}s "
                    f"(request_timeout); not retried",
                    code=ModelError.TIMEOUT,
                ) from None
            except aiohttp.ClientError as e:
                record_request(self.model, "error", time.perf_counter() - started)
                reason = _redact(f"{type(e).__name__}: {e}", key)
                if isinstance(e, _RETRYABLE_CONNECTION_ERRORS) and attempt < self.max_attempts:
                    delay = self._backoff(attempt)
                    _log().warning(
                        "model request to %s failed (%s); attempt %d of %d, will retry in %.2fs",
                        self.url,
                        reason,
                        attempt,
                        self.max_attempts,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    continue
                raise ModelError(
                    f"model request to {self.url} failed after {attempt} attempt(s): {reason}",
                    code=ModelError.CONNECTION,
                ) from None
            if 200 <= status < 300:
                return raw, started
            record_request(self.model, "error", time.perf_counter() - started)
            detail = _redact(_provider_message(raw), key)
            retryable = status == 429 or status >= 500
            if retryable and attempt < self.max_attempts:
                delay = retry_after if retry_after is not None else self._backoff(attempt)
                if delay <= self.max_retry_delay:
                    _log().warning(
                        "model endpoint %s answered HTTP %d (%s); attempt %d of %d, will retry in %.2fs",
                        self.url,
                        status,
                        detail,
                        attempt,
                        self.max_attempts,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    continue
                detail += f" (asked to retry after {delay:g}s, over max_retry_delay={self.max_retry_delay:g}s)"
            hint = ""
            if status == 401 and not key:
                hint = f"; no API key was found ({self._key_source()})"
            raise ModelError(
                f"model endpoint {self.url} answered HTTP {status} after {attempt} attempt(s): {detail}{hint}",
                code=ModelError.HTTP,
            )
        raise AssertionError("unreachable: the retry loop returns or raises")

    def _backoff(self, attempt: int) -> float:
        # Jittered so that many runs hitting one rate limit do not retry in lockstep.
        delay: float = min(self.max_retry_delay, self.retry_backoff * 2 ** (attempt - 1))
        return delay * random.uniform(0.5, 1.0)

    def _key_source(self) -> str:
        if self._api_key is not None:
            return "the api_key callable returned nothing"
        if self.api_key_file is not None:
            return f"the file {str(self.api_key_file)!r} is empty"
        if self.api_key_env:
            return f"the environment variable {self.api_key_env} is not set"
        return "no key source is configured"

    # -- response ------------------------------------------------------------

    def _decode(self, raw: bytes, key: str | None) -> Any:
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            snippet = _redact(raw[:_SNIPPET].decode(errors="replace"), key)
            raise ModelError(
                f"model endpoint {self.url} answered with a body that is not JSON: {snippet!r}",
                code=ModelError.RESPONSE,
            ) from None

    def _parse(self, body: Any) -> Message:
        def bad(reason: str) -> ModelError:
            return ModelError(
                f"model endpoint {self.url} sent no usable chat completion: {reason}", code=ModelError.RESPONSE
            )

        if not isinstance(body, dict):
            raise bad(f"the body is a JSON {type(body).__name__}, not an object")
        if "error" in body and not body.get("choices"):
            raise bad(f"it reported an error: {_error_text(body)}")
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices:
            raise bad("'choices' is missing or empty")
        choice = choices[0]
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise bad("choices[0].message is missing")
        content = message.get("content")
        if content is None:
            content = message.get("refusal") or ""
        if not isinstance(content, str):
            raise bad(f"choices[0].message.content is a {type(content).__name__}, not a string")
        raw_calls = message.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise bad("choices[0].message.tool_calls is not a list")
        calls = [_tool_call(raw, i, bad) for i, raw in enumerate(raw_calls)]
        # A reply cut inside a character decodes to an unpaired surrogate ("\ud83d"), which no store and
        # no request body can hold: replaced by U+FFFD here, as an API server's JSON decoder does.
        reply = assistant(unicode_text(content), calls)
        record_usage(self.model, body.get("usage"))
        finish = choice.get("finish_reason")
        if finish == "length":
            _log().warning(
                "model reply %s was cut off at the token limit; its tool arguments may be incomplete", reply.id
            )
        _log().debug(
            "model reply %s (provider id %s, finish_reason %s, %d tool call(s))",
            reply.id,
            body.get("id"),
            finish,
            len(calls),
        )
        return reply


def record_usage(model: str, usage: Any) -> None:
    """Count a chat completion's ``usage`` (OpenAI names); anything malformed or negative is ignored."""
    if not isinstance(usage, dict):
        return
    for kind, field in (("prompt", "prompt_tokens"), ("completion", "completion_tokens")):
        record_tokens(model, kind, usage.get(field))


def _tool_call(raw: Any, index: int, bad: Callable[[str], ModelError]) -> ToolCall:
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise bad(f"tool_calls[{index}] has no function name")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):
        # Some servers send an object instead of the JSON text; keep its content, as text.
        arguments = json.dumps(arguments, ensure_ascii=False)
    call_id = raw.get("id")
    return ToolCall(
        id=unicode_text(call_id) if isinstance(call_id, str) and call_id else None,
        name=unicode_text(function["name"]),
        arguments=unicode_text(arguments),  # an escaped surrogate stays escaped: the tool node refuses it
    )


def to_wire(message: Message) -> dict[str, Any]:
    """An agentrun message in the chat-completions format."""
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.parts is not None and message.role in ("user", "system"):
        wire["content"] = message.parts  # images and other parts, in the chat-completions shape
    if message.name:
        wire["name"] = message.name
    if message.role == "assistant" and message.tool_calls:
        if not message.content:
            wire["content"] = None
        wire["tool_calls"] = [
            {
                **({"id": call.id} if call.id else {}),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    return wire


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` (OpenAI) or ``Retry-After`` (seconds or an HTTP date)."""
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _provider_message(raw: bytes) -> str:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        text = raw[:_SNIPPET].decode(errors="replace").strip()
        return text or "(empty body)"
    return _error_text(body)


def _error_text(body: Any) -> str:
    """The provider's error message: OpenAI's ``{"error": {"message"}}`` and the common variants."""
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            for field in ("message", "detail", "msg"):
                if isinstance(error.get(field), str):
                    return str(error[field])[:_SNIPPET]
        if isinstance(error, str):
            return error[:_SNIPPET]
    return json.dumps(body, ensure_ascii=False)[:_SNIPPET]


def _redact(text: str, key: str | None) -> str:
    return text.replace(key, "***") if key else text
