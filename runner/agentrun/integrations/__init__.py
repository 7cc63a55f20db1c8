"""Adapters for tools and models users already have: MCP servers and LangChain.

Each adapter is an optional extra and is never imported by agentrun itself
until it is used: ``agentrun.integrations.mcp`` needs ``agentrun[mcp]``,
``agentrun.integrations.langchain`` needs ``agentrun[langchain]``. Importing
one without its extra raises ``ImportError`` naming the extra to install.

What they produce are ordinary agentrun tools (``tools.SchemaTool``) and
model nodes, so the tool node runs MCP and LangChain tools exactly like
native ones: ledger, idempotency key, intents with the in-doubt policy the
user declares per tool, the tool deadline, stop.
"""

from __future__ import annotations


def missing_extra(extra: str, package: str, error: ImportError) -> ImportError:
    """The ``ImportError`` raised when an adapter's optional dependency is not installed."""
    return ImportError(
        f"agentrun.integrations.{extra} needs the {package!r} package: pip install 'agentrun[{extra}]' ({error})"
    )
