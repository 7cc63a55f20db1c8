"""Any LangChain chat model as a model node (``pip install 'agentrun[langchain]'``).

    from langchain_openai import ChatOpenAI
    graph.add_node("model", LangChainChatModel(ChatOpenAI(model="gpt-4o-mini"), tools=[charge, lookup]))

The node converts the conversation to LangChain messages, calls the model
(bound to the graph's tools with ``bind_tools`` when the model supports it),
and returns the reply as an agentrun assistant message with a NEW agentrun
id: the tool ledger keys on that id, so it must be unique per reply and
thread, which a provider's response id does not promise.

Token usage (``usage_metadata``: input and output tokens) is added to
``agentrun_model_tokens_total{model,kind}`` and to the turn's checkpointed
model usage (``agentrun.usage``; the operator exports it); the ``model``
label is ``model_label`` or the model's configured name, both from the
graph's code. One call of the model is one request there (``ok`` or
``error``), timed in ``agentrun_model_request_seconds``.

Errors: whatever the model raises becomes a ``ModelError`` with the code the
OpenAI-compatible adapter uses for the same failure: ``MODEL_TIMEOUT_001``
(a timeout), ``MODEL_CONNECTION_001`` (no connection), ``MODEL_HTTP_001``
(an HTTP error status, as provider SDKs report it in ``status_code``), else
``MODEL_ERROR_001`` with the provider's message. Retries are the model's
own (``max_retries`` of the provider class); this node does not add any.
The hazards of the OpenAI adapter apply: the model call is not in the
ledger, so a crash mid-call asks the model again on resume.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ..decorator import tool
from ..errors import ModelError
from ..integrations import missing_extra
from ..messages import Message, coerce_message, new_message_id
from ..metrics import MODEL_ERRORS
from ..state import MESSAGES
from ..tools import Tool
from .metering import record_request, record_tokens

try:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage

    from ..integrations.langchain import from_langchain, to_langchain
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise missing_extra("langchain", "langchain-core", e) from e

_SNIPPET = 500


class LangChainChatModel:
    """A graph node around a LangChain ``BaseChatModel``; ``tools`` are bound to it (see the module docstring)."""

    def __init__(
        self,
        chat_model: BaseChatModel,
        *,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        model_label: str | None = None,
        name: str = "model",
    ) -> None:
        self.chat_model = chat_model
        self.name = name
        self.tools = [t if isinstance(t, Tool) else tool(t) for t in tools]
        self.model_label = model_label or _configured_name(chat_model)
        self.runnable: Any = chat_model
        if self.tools:
            try:
                self.runnable = chat_model.bind_tools([t.spec() for t in self.tools])
            except NotImplementedError:
                # Models without native tool calling (and the fake test models): the graph still runs,
                # the model just is not told about the tools.
                self.runnable = chat_model

    def __repr__(self) -> str:
        return f"LangChainChatModel({self.model_label!r}, tools={len(self.tools)})"

    async def __call__(self, state: dict[str, Any]) -> dict[str, Any]:
        """Ask the model for the next message; raises ``ModelError`` (see the module docstring)."""
        messages = [coerce_message(m) for m in state.get(MESSAGES, [])]
        reply = await self.complete(messages)
        return {MESSAGES: [reply]}

    async def complete(self, messages: Sequence[Message]) -> Message:
        """One model call: the assistant reply, with a new agentrun message id."""
        started = time.perf_counter()
        try:
            raw = await self.runnable.ainvoke([to_langchain(m) for m in messages])
        except ModelError as e:
            record_request(self.model_label, "error", time.perf_counter() - started)
            MODEL_ERRORS.labels(e.code).inc()
            raise
        except Exception as e:
            record_request(self.model_label, "error", time.perf_counter() - started)
            error = model_error(e, self.model_label)
            MODEL_ERRORS.labels(error.code).inc()
            raise error from e
        if not isinstance(raw, BaseMessage):
            record_request(self.model_label, "error", time.perf_counter() - started)
            error = ModelError(
                f"{self.model_label} answered with a {type(raw).__name__}, not a message", code=ModelError.RESPONSE
            )
            MODEL_ERRORS.labels(error.code).inc()
            raise error
        record_request(self.model_label, "ok", time.perf_counter() - started)
        if isinstance(raw, AIMessage):
            record_usage(self.model_label, raw)
        reply = from_langchain(raw)
        return reply.model_copy(update={"id": new_message_id(), "role": "assistant"})


def record_usage(model: str, message: AIMessage) -> None:
    """Count a LangChain reply's tokens in the model metrics (nothing if it reports no usage)."""
    usage = message.usage_metadata
    if not usage:
        return
    for kind, field in (("prompt", "input_tokens"), ("completion", "output_tokens")):
        record_tokens(model, kind, usage.get(field))


def model_error(error: Exception, model: str) -> ModelError:
    """A provider's exception as a ``ModelError`` with the adapter's code for that kind of failure."""
    names = {cls.__name__ for cls in type(error).__mro__}
    text = f"{type(error).__name__}: {error}"[:_SNIPPET]
    if isinstance(error, TimeoutError) or any("Timeout" in n for n in names):
        return ModelError(f"{model} did not answer in time ({text})", code=ModelError.TIMEOUT)
    if isinstance(error, ConnectionError) or any("Connection" in n or "Connect" in n for n in names):
        return ModelError(f"could not reach {model} ({text})", code=ModelError.CONNECTION)
    status = getattr(error, "status_code", None)
    if not isinstance(status, int):
        status = getattr(getattr(error, "response", None), "status_code", None)
    if isinstance(status, int):
        return ModelError(f"{model} answered HTTP {status} ({text})", code=ModelError.HTTP)
    return ModelError(f"{model} failed ({text})", code=ModelError.code)


def _configured_name(chat_model: BaseChatModel) -> str:
    for attribute in ("model_name", "model", "model_id"):
        value = getattr(chat_model, attribute, None)
        if isinstance(value, str) and value:
            return value
    return chat_model._llm_type
