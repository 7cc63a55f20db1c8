"""An edited fork of a LangGraph thread on the PostgreSQL store runs the edited call (issue 31).

Guarantee protected: after ``update_state`` on a past checkpoint replaces
``charge_card(order 4821)`` by ``charge_card(order 9999)`` under the same message
id and call id (how LangGraph's docs edit a tool call), ``LedgerToolNode`` on
``AgentrunSaver`` charges 9999 once, with its own idempotency key, instead of
answering with the recorded 4821 result; replaying each branch answers its own
result from the ledger. With ``ainvoke`` and with a sync graph (``invoke``).
"""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.integrations.langgraph import AgentrunSaver, LedgerToolNode
from tests.support.langgraph_fork import CHARGES, afork, build, check, fork, tools


@pytest.fixture(autouse=True)
def _reset_charges() -> None:
    CHARGES.clear()


async def test_an_edited_fork_on_postgres_charges_the_edited_order_and_each_branch_replays_its_own(
    pg_dsn: str,
) -> None:
    saver = AgentrunSaver.from_url(pg_dsn)
    try:
        node = LedgerToolNode(tools(sync=False), side_effects={"charge_card"})
        result = await afork(build(node).compile(checkpointer=saver))
    finally:
        await saver.aclose()
    check(result, "PostgreSQL")


def test_an_edited_fork_of_a_sync_graph_on_postgres_charges_the_edited_order(pg_dsn: str) -> None:
    app: Any
    with AgentrunSaver.from_url(pg_dsn) as saver:
        app = build(LedgerToolNode(tools(sync=True), side_effects={"charge_card"})).compile(checkpointer=saver)
        result = fork(app)
    check(result, "PostgreSQL, sync graph")
