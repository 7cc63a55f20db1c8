"""An edited fork of a LangGraph thread on the SQLite store runs the edited call (issue 31).

Guarantee protected: after ``update_state`` on a past checkpoint replaces
``charge_card(order 4821)`` by ``charge_card(order 9999)`` under the same message
id and call id (how LangGraph's docs edit a tool call), ``LedgerToolNode`` does
not answer the fork from the ledger with the 4821 result: it charges 9999,
once, with an idempotency key of its own; replaying the fork answers 9999 and
replaying the original branch answers 4821, both from the ledger. The same for
a sync graph. An intent recorded with the original arguments (the original call
in doubt) does not make the edited call in doubt; an intent recorded before
digests existed still does (it cannot be told apart). LangGraph's own
``InMemorySaver`` with plain ``ToolNode`` runs the edited call too: the reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolNode

from agentrun.checkpoint import SqliteCheckpointer
from agentrun.integrations.langgraph import AgentrunSaver, LedgerToolNode
from agentrun.ledger import args_digest, edited_key
from tests.support.langgraph_fork import CHARGES, EDITED, ORIGINAL, afork, build, check, fork, request, tools

KEY = "ai-1:c1"  # <assistant message id>:<tool call id>, the same before and after the edit


@pytest.fixture(autouse=True)
def _reset_charges() -> None:
    CHARGES.clear()


async def test_an_edited_fork_charges_the_edited_order_with_its_own_key_and_each_branch_replays_its_own(
    tmp_path: Path,
) -> None:
    saver = AgentrunSaver(SqliteCheckpointer(tmp_path / "agentrun.db"))
    try:
        node = LedgerToolNode(tools(sync=False), side_effects={"charge_card"})
        result = await afork(build(node).compile(checkpointer=saver))
        entries = {e.key: e for e in await saver.store.ledger_list("order-4821")}
    finally:
        await saver.aclose()
    check(result, "SQLite")
    edited = edited_key(KEY, args_digest({"order_id": EDITED}))
    assert set(entries) == {KEY, edited}, f"the edited call must have its own ledger entry: {sorted(entries)}"
    assert entries[KEY].result["args"] == args_digest({"order_id": ORIGINAL})
    assert entries[edited].result["args"] == args_digest({"order_id": EDITED})


def test_an_edited_fork_of_a_sync_graph_charges_the_edited_order(tmp_path: Path) -> None:
    with AgentrunSaver(SqliteCheckpointer(tmp_path / "agentrun.db")) as saver:
        node = LedgerToolNode(tools(sync=True), side_effects={"charge_card"})
        result = fork(build(node).compile(checkpointer=saver))
    check(result, "SQLite, sync graph")


async def test_langgraph_alone_charges_the_edited_order_the_behaviour_the_ledger_keeps() -> None:
    # Not a guarantee of ours: what the fork means in LangGraph, which the ledger must not change.
    result = await afork(build(ToolNode(tools(sync=False))).compile(checkpointer=InMemorySaver()), replays=False)
    assert result.fork == f"charged order {EDITED}" and [o for o, _ in CHARGES] == [ORIGINAL, EDITED]


@pytest.mark.parametrize("digested", [True, False], ids=["intent-with-digest", "intent-before-digests"])
async def test_an_edited_fork_of_a_call_left_in_doubt_is_a_new_call_unless_its_intent_has_no_digest(
    digested: bool, tmp_path: Path
) -> None:
    saver = AgentrunSaver(SqliteCheckpointer(tmp_path / "agentrun.db"))
    try:
        await saver.setup()  # before the store is written directly
        # The original call started and its process died before the result was recorded.
        digest = args_digest({"order_id": ORIGINAL}) if digested else None
        await saver.store.intent_put("order-4821", KEY, "charge_card", "ar-original", args_digest=digest)
        node = LedgerToolNode(tools(sync=False), side_effects={"charge_card"})  # in doubt: interrupt
        app = build(node).compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": "order-4821"}}
        first = await app.ainvoke({"messages": [HumanMessage("charge order 4821")]}, config)
        assert CHARGES == [] and first["__interrupt__"][0].value["kind"] == "tool_in_doubt"
        before = [s async for s in app.aget_state_history(config) if s.next == ("tools",)][-1]
        forked = await app.aupdate_state(before.config, {"messages": [request(EDITED)]})
        values = await app.ainvoke(None, forked)
    finally:
        await saver.aclose()
    if digested:
        assert [o for o, _ in CHARGES] == [EDITED], (
            "GUARANTEE BROKEN: the edited call was taken for the original call in doubt, not run as a new call"
        )
        assert CHARGES[0][1] != "ar-original" and "__interrupt__" not in values
    else:
        # Backward compatible: an intent without a digest is taken as this call's, in doubt as before.
        assert CHARGES == [] and values["__interrupt__"][0].value["kind"] == "tool_in_doubt"
