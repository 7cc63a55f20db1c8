"""``LedgerMiddleware``: the tool calls of a LangChain ``create_agent`` agent through agentrun's ledger.

Why: ``langchain.agents.create_agent`` (LangChain 1.x, where LangGraph's
``create_react_agent`` deprecation points) builds its own ``ToolNode`` from
``tools=``, so a ``LedgerToolNode`` cannot be passed in (LangChain iterates it
as a list of tools: ``TypeError: 'LedgerToolNode' object is not iterable``).
What it offers instead is middleware: every tool call passes through each
middleware's ``awrap_tool_call`` (``wrap_tool_call`` for ``invoke``). This one
applies exactly ``LedgerToolNode``'s per-call policy there (one
implementation, ``tools._Ledger``): the ledger lookup and replay (same key
``<assistant message id>:<tool call id>``, same envelope, the arguments
digest), the intent and in-doubt policy of side-effect tools, the tool
deadline, the result recorded the moment the tool returns, the call's
idempotency key for the tool (``current_idempotency_key()``), and the
turn's tool-call counts the AgentRun status shows::

    agent = create_agent(
        model,
        tools=[lookup_order, charge_card],
        middleware=[LedgerMiddleware(side_effects={"charge_card"}, in_doubt={"charge_card": "retry"})],
    )  # as an AgentRun: no checkpointer (the runner gives it AgentrunSaver); locally: checkpointer=AgentrunSaver(...)

HAZARDS
- Order: middleware compose first-listed outermost. List ``LedgerMiddleware``
  FIRST so the other tool wrappers run inside it: a replayed call then reaches
  none of them, and a retry middleware's attempts are one recorded call. A
  wrapper listed before it sees every call, replays included, and whatever it
  returns without calling the next handler is never recorded.
- The limits of ``LedgerToolNode`` hold (``tools`` module docstring): the
  window between a tool's return and its record (give side-effect tools the
  idempotency key), error results and ``Command`` results are not recorded
  (a replay runs them again), the agent must run on ``AgentrunSaver``
  (another checkpointer raises ``TypeError`` at the first call).
- ``create_agent``'s ``ToolNode`` keeps LangChain's default error handling: a
  tool that raises (other than invalid arguments) fails the run, as it does
  without agentrun; it is not recorded, so the next attempt runs it again.
  Turn expected failures into results with ``ToolException`` and
  ``handle_tool_error=True`` on the tool: an error result, counted as failed.
- The agent's state must keep its messages under ``messages`` (every
  ``create_agent`` state schema does): the ledger key needs the assistant
  message's id.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command
from typing_extensions import override

from agentrun.integrations import missing_extra

from .tools import DEFAULT_TOOL_TIMEOUT, InDoubtPolicy, _Ledger

try:
    from langchain.agents.middleware import AgentMiddleware
except ImportError as e:  # pragma: no cover - depends on the environment
    raise missing_extra("langgraph", "langchain", e) from e

__all__ = ["LedgerMiddleware"]


class LedgerMiddleware(AgentMiddleware):  # any agent state, context and response (the defaults)
    """Middleware for ``create_agent(..., middleware=[LedgerMiddleware(...)])``: its tool calls go through the ledger.

    Each completed call is recorded in agentrun's ledger and a replay answers it
    from there, exactly as ``LedgerToolNode`` does for a hand-built graph.
    ``side_effects``: names of tools with side effects (an intent is recorded
    before each call; ``in_doubt`` — a policy per tool name, default
    ``"interrupt"`` — applies when one started but never returned).
    ``timeouts``: seconds per tool name (``None`` or <= 0: none), default
    ``tool_timeout`` (300; async execution only). List it first among the
    middleware (module docstring). Raises what ``LedgerToolNode`` raises:
    ``FencedError``/``StoreUnavailableError`` end the attempt, a ledger entry
    of another tool is a ``DeterminismError``, another checkpointer a
    ``TypeError``.
    """

    def __init__(
        self,
        *,
        side_effects: Collection[str] = (),
        in_doubt: Mapping[str, InDoubtPolicy] | None = None,
        timeouts: Mapping[str, float | None] | None = None,
        tool_timeout: float | None = DEFAULT_TOOL_TIMEOUT,
    ) -> None:
        super().__init__()
        self.ledger = _Ledger(
            side_effects=side_effects,
            in_doubt=in_doubt or {},
            timeouts=timeouts or {},
            tool_timeout=tool_timeout,
            messages_key="messages",  # create_agent's AgentState
            owner="LedgerMiddleware",
        )

    @override
    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """The call answered from the ledger, or run through ``handler`` (the inner middleware, then the tool)."""
        return await self.ledger.awrap(request, handler)

    @override
    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """``awrap_tool_call`` for ``invoke``/``stream``: the store is reached on agentrun's blocking loop."""
        return self.ledger.wrap(request, handler)
