"""Tools: plain (async) functions the model can call, with their arguments validated.

A tool may ask for two injected parameters by name, which the model never
sees: ``state`` (the run's state dict; mutate it to change channels) and
``idempotency_key`` (a stable key for this call, the same on every replay,
to hand to downstream APIs such as a payment provider).

Tools with side effects declare ``side_effects=True``. Before such a tool
starts, an *intent* is recorded; if the process dies after the intent but
before the result is recorded, the replay knows the outcome is in doubt and
applies ``in_doubt``:

- ``"retry"``: run it again with the same idempotency key (right when the
  downstream API deduplicates on that key);
- ``"report"``: do not run it; the model gets a tool error saying the outcome
  is unknown;
- ``"interrupt"`` (default): pause the run and let a human decide; resume with
  ``"retry"`` to run it again or ``{"result": ...}`` to record what happened.

Tools described by a JSON schema rather than a Python signature (an MCP
server's tools, LangChain tools: see ``agentrun.integrations``) are
``SchemaTool``s; the tool node runs them exactly like the others (ledger,
idempotency key, intents, deadline, stop). ``tool()`` (``decorator``) and
``ToolNode`` accept a LangChain ``BaseTool`` directly (needs ``agentrun[langchain]``).

A tool (or an adapter such as the MCP one) that lost its answer, not its
call, raises ``ToolOutcomeUnknown``: the call may have taken effect (the
connection to the server broke after the request went out). For a
side-effect tool the tool node then treats the call as in doubt at once and
applies ``in_doubt`` in the same run, as a replay would: ``"retry"`` runs it
again with the SAME idempotency key (a few times, a second apart; if it still
gets no answer the run pauses for a human), ``"report"`` tells the model the
outcome is unknown, ``"interrupt"`` pauses the run. It is never counted as a
plain failure, which would let the model call again under a new key. For a
tool without side effects it is an ordinary tool error.

A side-effect tool may itself call ``interrupt()`` (e.g. to ask for approval):
a pause there is a known point, not an unknown outcome, so the resumed call
runs on (code before ``interrupt()`` must have no side effects). A crash after
the resume, before the result is recorded, is in doubt again.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from typing_extensions import override

from .sync import run_sync

InDoubtPolicy = Literal["retry", "report", "interrupt"]
INJECTED = frozenset({"state", "idempotency_key"})


class ToolArgumentError(ValueError):
    """The model's arguments do not fit the tool's signature."""


class ToolOutcomeUnknown(Exception):
    """Raised by a tool whose call went out but whose answer was lost: it may have taken effect.

    The tool node applies the tool's in-doubt policy to it (see the module docstring).
    """


class Tool:
    """A plain function made a tool (``tool()``): its name, description, argument model and failure policy."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        side_effects: bool = False,
        in_doubt: InDoubtPolicy = "interrupt",
        timeout: float | None = None,
    ) -> None:
        self.fn = fn
        self._set_policy(
            name=name or fn.__name__,
            description=description or inspect.getdoc(fn) or "",
            side_effects=side_effects,
            in_doubt=in_doubt,
            timeout=timeout,
        )
        signature = inspect.signature(fn)
        self.injected = {p for p in signature.parameters if p in INJECTED}
        fields: dict[str, Any] = {}
        for param in signature.parameters.values():
            if param.name in INJECTED or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            annotation = Any if param.annotation is inspect.Parameter.empty else param.annotation
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[param.name] = (annotation, default)
        self.args_model: type[BaseModel] = create_model(
            f"{self.name}_args", __config__=ConfigDict(extra="forbid"), **fields
        )

    def _set_policy(
        self, *, name: str, description: str, side_effects: bool, in_doubt: InDoubtPolicy, timeout: float | None
    ) -> None:
        if in_doubt not in ("retry", "report", "interrupt"):
            raise ValueError(f"in_doubt must be 'retry', 'report' or 'interrupt', not {in_doubt!r}")
        self.name = name
        self.description = description.strip()
        self.side_effects = side_effects
        self.in_doubt: InDoubtPolicy = in_doubt
        # Per-tool deadline; overrides the run's tool_timeout when set.
        self.timeout = timeout

    def validate_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments checked against the tool's argument model; raises ``ToolArgumentError`` with every problem."""
        try:
            model = self.args_model.model_validate(arguments)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'arguments'}: {err['msg']}" for err in e.errors())
            raise ToolArgumentError(f"invalid arguments for {self.name}: {problems}") from None
        return {name: getattr(model, name) for name in type(model).model_fields}

    async def ainvoke(
        self, arguments: dict[str, Any], *, state: dict[str, Any] | None = None, idempotency_key: str | None = None
    ) -> Any:
        """Call the tool with checked ``arguments``, and ``state`` and ``idempotency_key`` if it asks for them."""
        kwargs = self.validate_arguments(arguments)
        if "state" in self.injected:
            kwargs["state"] = state if state is not None else {}
        if "idempotency_key" in self.injected:
            kwargs["idempotency_key"] = idempotency_key
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**kwargs)
        result = await run_sync(self.fn, **kwargs)
        if inspect.isawaitable(result):
            return await result
        return result

    def spec(self) -> dict[str, Any]:
        """The OpenAI-style function spec the model sees (injected parameters hidden)."""
        schema = self.args_model.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": schema},
        }

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, side_effects={self.side_effects}, in_doubt={self.in_doubt!r})"


SchemaCall = Callable[[dict[str, Any], str | None], Awaitable[Any]]


class SchemaTool(Tool):
    """A tool described by a JSON schema (``parameters``) and an async ``call(arguments, idempotency_key)``.

    The base of the MCP and LangChain adapters. Arguments are checked
    against the schema's shape only (an object, required properties present,
    no unknown ones when ``additionalProperties`` is false); the tool itself
    (the MCP server, the LangChain tool) validates the values and reports a
    mismatch as an error, which becomes a tool error message. Tools of this
    kind never receive ``state``.
    """

    def __init__(
        self,
        call: SchemaCall,
        *,
        name: str,
        parameters: Mapping[str, Any],
        description: str = "",
        side_effects: bool = False,
        in_doubt: InDoubtPolicy = "interrupt",
        timeout: float | None = None,
    ) -> None:
        self.fn = call
        self._set_policy(
            name=name, description=description, side_effects=side_effects, in_doubt=in_doubt, timeout=timeout
        )
        self.parameters: dict[str, Any] = {"type": "object", "properties": {}, **dict(parameters)}
        self.injected = set()

    @override
    def validate_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise ToolArgumentError(f"invalid arguments for {self.name}: arguments must be an object")
        properties = self.parameters.get("properties") or {}
        missing = [p for p in self.parameters.get("required") or () if p not in arguments]
        problems = [f"{p}: Field required" for p in missing]
        if self.parameters.get("additionalProperties") is False:
            problems += [f"{p}: Extra inputs are not permitted" for p in arguments if p not in properties]
        if problems:
            raise ToolArgumentError(f"invalid arguments for {self.name}: {'; '.join(problems)}")
        return dict(arguments)

    @override
    async def ainvoke(
        self, arguments: dict[str, Any], *, state: dict[str, Any] | None = None, idempotency_key: str | None = None
    ) -> Any:
        return await self.fn(self.validate_arguments(arguments), idempotency_key)

    @override
    def spec(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def __repr__(self) -> str:
        return f"SchemaTool({self.name!r}, side_effects={self.side_effects}, in_doubt={self.in_doubt!r})"
