"""Run LangGraph graphs on agentrun's store, replay-safe (``pip install 'agentrun[langgraph]'``).

- ``AgentrunSaver``: a LangGraph ``BaseCheckpointSaver`` kept in agentrun's
  PostgreSQL or SQLite store (migrations, fencing, outage retries of the
  store); ``graph.compile(checkpointer=AgentrunSaver(store))``.
- ``LedgerToolNode``: a ``langgraph.prebuilt.ToolNode`` whose completed
  calls are recorded in agentrun's ledger, so a resumed run answers them from
  the ledger instead of calling the tool again (LangGraph alone re-runs every
  call of an interrupted tool node).
"""

from __future__ import annotations

from agentrun.integrations import missing_extra

try:
    import langgraph.checkpoint.base
    import langgraph.prebuilt  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise missing_extra("langgraph", "langgraph", e) from e

from .saver import AgentrunSaver, row_store
from .tools import InDoubtPolicy, LedgerToolNode, current_idempotency_key

__all__ = ["AgentrunSaver", "InDoubtPolicy", "LedgerToolNode", "current_idempotency_key", "row_store"]
