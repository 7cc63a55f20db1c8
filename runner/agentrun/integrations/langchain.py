"""LangChain tools and messages in agentrun (``pip install 'agentrun[langchain]'``, ``langchain-core``).

- ``ToolNode([...])``, ``tool(...)`` and the model adapters accept a LangChain
  ``BaseTool`` (``@tool`` functions, ``StructuredTool``, ``BaseTool``
  subclasses, sync or async) as they are; ``from_langchain_tool`` does the
  same with the options spelled out. The tool keeps its name, description
  and argument schema; the tool node runs it like a native tool (ledger,
  idempotency key, intents, deadline, stop). Side effects are declared here
  (``tool(lc_tool, side_effects=True, in_doubt="retry")``): a LangChain
  tool cannot declare them.
- The idempotency key reaches a LangChain tool as its ``idempotency_key``
  argument when its schema has one (agentrun fills it and hides it from the
  model), and always as the ``tool_call_id`` of the ``ToolCall`` the tool is
  invoked with (LangChain's ``InjectedToolCallId``).
- A ``ToolException`` (or a ``ToolMessage`` with ``status="error"`` from a
  tool with ``handle_tool_error``) becomes a tool error message.
- ``to_langchain``/``from_langchain`` convert messages both ways (content
  parts, tool calls with their ids, tool results); ``coerce_message``, and
  so a graph's input, accepts LangChain messages.

Limits: a sync LangChain tool runs on a thread of its own, which a deadline
or a stop abandons but cannot kill (see ``agentrun.sync``); prefer async
tools (``coroutine=``) for calls that may hang. A tool's ``artifact`` is not
kept: only the content reaches the model and the ledger.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..messages import Message, from_langchain, text_of
from ..sync import run_sync
from ..tools import InDoubtPolicy, SchemaTool
from . import missing_extra

try:
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        InvalidToolCall,
        SystemMessage,
        ToolCall,
        ToolMessage,
    )
    from langchain_core.tools import BaseTool, StructuredTool
    from langchain_core.utils.function_calling import convert_to_openai_tool
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise missing_extra("langchain", "langchain-core", e) from e

__all__ = ["LangChainToolError", "from_langchain", "from_langchain_tool", "to_langchain"]

IDEMPOTENCY_ARGUMENT = "idempotency_key"


class LangChainToolError(Exception):
    """A LangChain tool handled its own error (``handle_tool_error``) and answered with an error message."""


def to_langchain(message: Message) -> BaseMessage:
    """The LangChain message for an agentrun message (the inverse of ``from_langchain``).

    Tool calls whose arguments are not a JSON object become
    ``invalid_tool_calls`` with the text as the model wrote it.
    """
    content: str | list[str | dict[str, Any]] = (
        message.content if message.parts is None else [dict(p) for p in message.parts]
    )
    common: dict[str, Any] = {"content": content, "id": message.id, "name": message.name}
    if message.role == "user":
        return HumanMessage(**common)
    if message.role == "system":
        return SystemMessage(**common)
    if message.role == "tool":
        return ToolMessage(
            **common, tool_call_id=message.tool_call_id or "", status="error" if message.is_error else "success"
        )
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for call in message.tool_calls:
        try:
            args = call.parsed_arguments()
        except ValueError as e:
            invalid.append(
                InvalidToolCall(name=call.name, args=call.arguments, id=call.id, error=str(e), type="invalid_tool_call")
            )
        else:
            calls.append(ToolCall(name=call.name, args=args, id=call.id, type="tool_call"))
    return AIMessage(**common, tool_calls=calls, invalid_tool_calls=invalid)


def _is_async(t: BaseTool) -> bool:
    if isinstance(t, StructuredTool):
        return t.coroutine is not None
    return type(t)._arun is not BaseTool._arun


def from_langchain_tool(
    t: BaseTool,
    *,
    name: str | None = None,
    description: str | None = None,
    side_effects: bool = False,
    in_doubt: InDoubtPolicy = "interrupt",
    timeout: float | None = None,
) -> SchemaTool:
    """An agentrun tool running the LangChain tool ``t`` (see the module docstring)."""
    if not isinstance(t, BaseTool):
        raise TypeError(f"expected a LangChain BaseTool, got {type(t).__name__}")
    function = convert_to_openai_tool(t)["function"]
    parameters: dict[str, Any] = dict(function.get("parameters") or {"type": "object", "properties": {}})
    properties = dict(parameters.get("properties") or {})
    wants_key = IDEMPOTENCY_ARGUMENT in properties or IDEMPOTENCY_ARGUMENT in (t.args or {})
    if IDEMPOTENCY_ARGUMENT in properties:
        properties.pop(IDEMPOTENCY_ARGUMENT)
        parameters["properties"] = properties
        if "required" in parameters:
            parameters["required"] = [r for r in parameters["required"] if r != IDEMPOTENCY_ARGUMENT]
    is_async = _is_async(t)

    async def call(arguments: dict[str, Any], idempotency_key: str | None) -> Any:
        if wants_key and idempotency_key is not None:
            arguments = {**arguments, IDEMPOTENCY_ARGUMENT: idempotency_key}
        request = ToolCall(name=t.name, args=arguments, id=idempotency_key or "agentrun-call", type="tool_call")
        result = await t.ainvoke(request) if is_async else await run_sync(t.invoke, request)
        return _tool_result(result, t.name)

    return SchemaTool(
        call,
        name=name or t.name,
        parameters=parameters,
        description=description or t.description or function.get("description") or "",
        side_effects=side_effects,
        in_doubt=in_doubt,
        timeout=timeout,
    )


def _tool_result(result: Any, tool_name: str) -> Any:
    if isinstance(result, ToolMessage):
        if result.status == "error":
            raise LangChainToolError(result.text or f"{tool_name} failed")
        result = result.content
    if isinstance(result, list):
        # Content parts: the text if that is all there is, else the parts as they are (JSON for the model).
        if all(isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text") for p in result):
            return text_of(result)
        return json.loads(json.dumps(result, default=str))
    return result


def from_langchain_messages(messages: Sequence[BaseMessage]) -> list[Message]:
    """``from_langchain`` over a list."""
    return [from_langchain(m) for m in messages]
