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

A side-effect tool may itself call ``interrupt()`` (e.g. to ask for approval):
a pause there is a known point, not an unknown outcome, so the resumed call
runs on (code before ``interrupt()`` must have no side effects). A crash after
the resume, before the result is recorded, is in doubt again.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Literal, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from .sync import run_sync

InDoubtPolicy = Literal["retry", "report", "interrupt"]
INJECTED = frozenset({"state", "idempotency_key"})


class ToolArgumentError(ValueError):
    """The model's arguments do not fit the tool's signature."""


class Tool:
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
        if in_doubt not in ("retry", "report", "interrupt"):
            raise ValueError(f"in_doubt must be 'retry', 'report' or 'interrupt', not {in_doubt!r}")
        self.fn = fn
        self.name = name or fn.__name__
        self.description = (description or inspect.getdoc(fn) or "").strip()
        self.side_effects = side_effects
        self.in_doubt: InDoubtPolicy = in_doubt
        # Per-tool deadline; overrides the run's tool_timeout when set.
        self.timeout = timeout
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

    def validate_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        try:
            model = self.args_model.model_validate(arguments)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'arguments'}: {err['msg']}" for err in e.errors())
            raise ToolArgumentError(f"invalid arguments for {self.name}: {problems}") from None
        return {name: getattr(model, name) for name in type(model).model_fields}

    async def ainvoke(
        self, arguments: dict[str, Any], *, state: dict[str, Any] | None = None, idempotency_key: str | None = None
    ) -> Any:
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


ToolFn = Callable[..., Awaitable[Any]] | Callable[..., Any]


@overload
def tool(fn: ToolFn, /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    side_effects: bool = False,
    in_doubt: InDoubtPolicy = "interrupt",
    timeout: float | None = None,
) -> Callable[[ToolFn], Tool]: ...


def tool(
    fn: ToolFn | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    side_effects: bool = False,
    in_doubt: InDoubtPolicy = "interrupt",
    timeout: float | None = None,
) -> Tool | Callable[[ToolFn], Tool]:
    """Make a function a tool: ``@tool`` or ``@tool(side_effects=True, in_doubt="retry")``."""

    def wrap(f: ToolFn) -> Tool:
        return Tool(
            f, name=name, description=description, side_effects=side_effects, in_doubt=in_doubt, timeout=timeout
        )

    return wrap(fn) if fn is not None else wrap
