"""LangGraph's own checkpointer conformance suite (``langgraph-checkpoint-conformance``) on ``AgentrunSaver``.

The suite creates a fresh saver per capability; each gets a store of its own
(a new SQLite file, or a new PostgreSQL schema), so no capability sees
another's threads.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import BASE_CAPABILITIES, EXTENDED_CAPABILITIES
from langgraph.checkpoint.conformance.report import CapabilityReport

from agentrun.checkpoint import Checkpointer
from agentrun.integrations.langgraph import AgentrunSaver

BASE = sorted(c.value for c in BASE_CAPABILITIES)
EXTENDED = sorted(c.value for c in EXTENDED_CAPABILITIES)


async def run_conformance(name: str, open_store: Callable[[], Checkpointer]) -> CapabilityReport:
    """Every capability of the suite against savers on stores from ``open_store``; the suite's report."""

    async def factory() -> AsyncIterator[AgentrunSaver]:
        saver = AgentrunSaver(open_store())
        await saver.setup()
        try:
            yield saver
        finally:
            await saver.aclose()

    registered = checkpointer_test(name=f"{name}-{uuid.uuid4().hex[:6]}")(factory)
    return await validate(registered)


def failures(report: CapabilityReport, capabilities: list[str]) -> dict[str, Any]:
    """The capabilities among ``capabilities`` that did not pass, with the suite's failure lines."""
    out: dict[str, Any] = {}
    for capability in capabilities:
        result = report.results.get(capability)
        if result is None or result.passed is not True:
            out[capability] = "not run" if result is None else (result.failures or "not detected")
    return out
