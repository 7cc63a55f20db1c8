"""A tool call that lost its answer (``ToolOutcomeUnknown``, issue 22): in doubt at once, never a plain failure.

The MCP adapter raises it when the connection breaks under a call; here native
tools raise it, so the policy is checked without a server. looptime: the pauses
between retries take no real time.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentrun import Command, InMemoryCheckpointer
from agentrun.decorator import tool
from agentrun.ledger import idempotency_key
from agentrun.toolnode import LOST_RETRIES
from agentrun.tools import InDoubtPolicy, ToolOutcomeUnknown

from .helpers import app_for, call, tool_messages

pytestmark = pytest.mark.looptime


def charging(policy: InDoubtPolicy, *, lose: int, side_effects: bool = True, then: Exception | None = None) -> Any:
    """A charge tool that loses its first ``lose`` answers (the charge happened), then answers (or raises ``then``)."""
    keys: list[str | None] = []

    @tool(name="charge", side_effects=side_effects, in_doubt=policy)
    async def charge(idempotency_key: str | None = None) -> str:
        keys.append(idempotency_key)
        if len(keys) <= lose:
            raise ToolOutcomeUnknown("the connection broke after the request went out")
        if then is not None:
            raise then
        return "charged"

    return charge, keys


async def counts_of(checkpointer: InMemoryCheckpointer, thread: str) -> dict[str, int]:
    state = await checkpointer.aget(thread)
    assert state is not None
    return dict(state.meta["tool_calls"])


async def test_retry_runs_a_lost_call_again_with_the_same_key_and_records_it() -> None:
    charge, keys = charging("retry", lose=1)
    checkpointer = InMemoryCheckpointer()
    values = await app_for([charge], [call("call_1", "charge")], checkpointer).ainvoke("go", {"thread_id": "t"})
    assert tool_messages(values)["call_1"].content == "charged"
    assert len(keys) == 2 and len(set(keys)) == 1, f"GUARANTEE BROKEN: the retry used another key: {keys}"
    counts = await counts_of(checkpointer, "t")
    assert counts["failed"] == 0 and counts["in_doubt"] == 1 and counts["executed"] == 1, counts
    request = next(m for m in values["messages"] if m.tool_calls)
    assert await checkpointer.ledger_get("t", f"{request.id}:call_1") is not None


async def test_retry_that_never_gets_an_answer_pauses_for_a_human_whose_result_is_recorded() -> None:
    charge, keys = charging("retry", lose=100)
    checkpointer = InMemoryCheckpointer()
    app = app_for([charge], [call("call_1", "charge")], checkpointer)
    values = await app.ainvoke("go", {"thread_id": "t"})
    (pending,) = values["__interrupt__"]
    assert pending.payload["reason"] == "in_doubt" and pending.payload["idempotency_key"] == keys[0]
    assert "connection broke" in pending.payload["error"]
    assert len(keys) == 1 + LOST_RETRIES and len(set(keys)) == 1, keys
    values = await app.ainvoke(Command(resume={"result": "charged (seen at the provider)"}), {"thread_id": "t"})
    assert tool_messages(values)["call_1"].content == "charged (seen at the provider)"
    assert len(keys) == 1 + LOST_RETRIES, "a human's result must not run the call again"
    assert (await counts_of(checkpointer, "t"))["failed"] == 0


async def test_interrupt_pauses_at_once_and_a_retry_answer_uses_the_same_key() -> None:
    charge, keys = charging("interrupt", lose=1)
    checkpointer = InMemoryCheckpointer()
    app = app_for([charge], [call("call_1", "charge")], checkpointer)
    values = await app.ainvoke("go", {"thread_id": "t"})
    assert values["__interrupt__"][0].payload["reason"] == "in_doubt" and len(keys) == 1
    values = await app.ainvoke(Command(resume="retry"), {"thread_id": "t"})
    assert tool_messages(values)["call_1"].content == "charged"
    assert len(keys) == 2 and len(set(keys)) == 1, keys


async def test_interrupt_retry_that_loses_its_answer_again_pauses_again_and_takes_the_latest_answer() -> None:
    charge, keys = charging("interrupt", lose=2)
    app = app_for([charge], [call("call_1", "charge")], InMemoryCheckpointer())
    values = await app.ainvoke("go", {"thread_id": "t"})
    values = await app.ainvoke(Command(resume="retry"), {"thread_id": "t"})
    assert "__interrupt__" in values and len(keys) == 2, "a retried call that lost its answer again must pause again"
    values = await app.ainvoke(Command(resume={"result": "ok by hand"}), {"thread_id": "t"})
    assert tool_messages(values)["call_1"].content == "ok by hand" and len(keys) == 2


async def test_report_tells_the_model_the_outcome_is_unknown_with_the_key() -> None:
    charge, keys = charging("report", lose=1)
    checkpointer = InMemoryCheckpointer()
    values = await app_for([charge], [call("call_1", "charge")], checkpointer).ainvoke("go", {"thread_id": "t"})
    result = tool_messages(values)["call_1"]
    assert result.is_error and "outcome is unknown" in result.content and str(keys[0]) in result.content
    request = next(m for m in values["messages"] if m.tool_calls)
    assert keys[0] == idempotency_key("t", f"{request.id}:call_1")
    assert len(keys) == 1
    counts = await counts_of(checkpointer, "t")
    assert counts["failed"] == 0 and counts["in_doubt"] == 1, counts


async def test_a_retry_answered_with_an_error_is_that_calls_outcome() -> None:
    charge, keys = charging("retry", lose=1, then=ValueError("card declined"))
    checkpointer = InMemoryCheckpointer()
    values = await app_for([charge], [call("call_1", "charge")], checkpointer).ainvoke("go", {"thread_id": "t"})
    result = tool_messages(values)["call_1"]
    assert result.is_error and "card declined" in result.content and len(keys) == 2
    counts = await counts_of(checkpointer, "t")
    assert counts["failed"] == 1 and counts["in_doubt"] == 1, counts


async def test_a_lost_answer_of_a_tool_without_side_effects_is_an_ordinary_tool_error() -> None:
    charge, keys = charging("retry", lose=1, side_effects=False)
    checkpointer = InMemoryCheckpointer()
    values = await app_for([charge], [call("call_1", "charge")], checkpointer).ainvoke("go", {"thread_id": "t"})
    assert tool_messages(values)["call_1"].is_error and len(keys) == 1
    counts = await counts_of(checkpointer, "t")
    assert counts["failed"] == 1 and counts["in_doubt"] == 0, counts
