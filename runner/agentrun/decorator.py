"""``tool``: the decorator that makes a function, or a LangChain tool, an agentrun ``Tool``.

Apart from ``tools`` (what a tool is) because a LangChain ``BaseTool`` becomes a ``SchemaTool``
through ``integrations.langchain``, which builds on ``tools``: here both are below, and no import
goes round in a circle.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any, overload

from .tools import InDoubtPolicy, Tool


def _langchain_tool(value: Any) -> bool:
    """Whether ``value`` is a LangChain ``BaseTool``; never imports LangChain (if it is not loaded, it is not)."""
    module = sys.modules.get("langchain_core.tools")
    return module is not None and isinstance(value, module.BaseTool)


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
    """Make a function a tool: ``@tool`` or ``@tool(side_effects=True, in_doubt="retry")``.

    A LangChain ``BaseTool`` is accepted too (``tool(lc_tool, ...)``, or
    ``tool(side_effects=True)(lc_tool)``): it keeps its name, description
    and argument schema unless given here; needs ``agentrun[langchain]``.
    """

    def wrap(f: ToolFn) -> Tool:
        if _langchain_tool(f):
            from .integrations.langchain import from_langchain_tool

            langchain_tool: Any = f  # a BaseTool, which this module does not import
            return from_langchain_tool(
                langchain_tool,
                name=name,
                description=description,
                side_effects=side_effects,
                in_doubt=in_doubt,
                timeout=timeout,
            )
        return Tool(
            f, name=name, description=description, side_effects=side_effects, in_doubt=in_doubt, timeout=timeout
        )

    return wrap(fn) if fn is not None else wrap
