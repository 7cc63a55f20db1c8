"""Adapters for what users already have: MCP servers, LangChain tools and models, LangGraph graphs.

Each adapter is an optional extra and is never imported by agentrun itself
until it is used: ``agentrun.integrations.mcp`` needs ``agentrun[mcp]``,
``agentrun.integrations.langchain`` needs ``agentrun[langchain]``,
``agentrun.integrations.langgraph`` needs ``agentrun[langgraph]``. Importing
one without its extra raises ``ImportError`` naming the extra to install.

``mcp`` and ``langchain`` produce ordinary agentrun tools (``tools.SchemaTool``)
and model nodes, so the tool node runs MCP and LangChain tools exactly like
native ones: ledger, idempotency key, intents with the in-doubt policy the
user declares per tool, the tool deadline, stop. ``langgraph/`` goes the other
way: a LangGraph graph keeps LangGraph's engine and gets agentrun's store
(``AgentrunSaver``) and ledger (``LedgerToolNode``; ``LedgerMiddleware`` for LangChain's
``create_agent``); see its package docstring.
"""

from __future__ import annotations


def missing_extra(extra: str, package: str, error: ImportError) -> ImportError:
    """The ``ImportError`` raised when an adapter's optional dependency is not installed."""
    return ImportError(
        f"agentrun.integrations.{extra} needs the {package!r} package: pip install 'agentrun[{extra}]' ({error})"
    )
