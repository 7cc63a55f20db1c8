"""Run LangGraph graphs on agentrun's store, replay-safe (``pip install 'agentrun[langgraph]'``).

- ``AgentrunSaver``: a LangGraph ``BaseCheckpointSaver`` kept in agentrun's
  PostgreSQL or SQLite store (migrations, fencing, outage retries of the
  store); ``graph.compile(checkpointer=AgentrunSaver(store))``.
- ``LedgerToolNode``: a ``langgraph.prebuilt.ToolNode`` whose completed
  calls are recorded in agentrun's ledger, so a resumed run answers them from
  the ledger instead of calling the tool again (LangGraph alone re-runs every
  call of an interrupted tool node).
- ``LedgerMiddleware``: the same ledger for an agent built by LangChain's
  ``create_agent`` (which builds its own ToolNode):
  ``create_agent(model, tools, middleware=[LedgerMiddleware(...)])``; needs
  ``langchain`` (in the extra), imported only when this name is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrun.integrations import missing_extra

try:
    import langgraph.checkpoint.base
    import langgraph.prebuilt  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise missing_extra("langgraph", "langgraph", e) from e

from .saver import AgentrunSaver, row_store
from .tools import InDoubtPolicy, LedgerToolNode, current_idempotency_key

if TYPE_CHECKING:
    from .middleware import LedgerMiddleware

__all__ = [
    "AgentrunSaver",
    "InDoubtPolicy",
    "LedgerMiddleware",
    "LedgerToolNode",
    "current_idempotency_key",
    "row_store",
]


def __getattr__(name: str) -> Any:
    # LedgerMiddleware imports langchain.agents (about 0.1 s of a runner pod's start): only for who names it.
    if name == "LedgerMiddleware":
        from .middleware import LedgerMiddleware

        return LedgerMiddleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
