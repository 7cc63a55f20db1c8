"""A plain LangGraph graph on our SQLite store charges the card once across a real SIGKILL (issue 23).

Guarantee protected: the seed scenario written in plain LangGraph
(``StateGraph``, a tool node, three tool calls in one assistant message),
compiled with ``AgentrunSaver`` and ``LedgerToolNode``, SIGKILLed right after
``charge_card`` returned and was recorded, then resumed in a new process:
every tool executed exactly once (LangGraph alone re-runs the whole tool
node), each with agentrun's idempotency key, and the run completes, with
``invoke`` and with ``stream``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.langgraph_crash import FINAL_ANSWER, TOOLS, crash_then_resume


@pytest.mark.parametrize("mode", ["invoke", "stream"])
def test_langgraph_graph_on_sqlite_charges_once_across_sigkill_after_charge_card(
    mode: str, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    executions, lines, final = crash_then_resume(
        subprocess_env,
        tmp_path / "effects.jsonl",
        "agentrun",
        f"sqlite:///{tmp_path / 'agentrun.db'}",
        "order-4821",
        mode=mode,
        fault="after_ledger_record:charge_card",
    )
    assert executions["charge_card"] == 1, f"GUARANTEE BROKEN: the card was charged {executions['charge_card']} times"
    assert executions == dict.fromkeys(TOOLS, 1), f"GUARANTEE BROKEN: a recorded tool ran again: {executions}"
    assert all(line["key"] and line["key"].startswith("ar-") for line in lines), f"no idempotency key: {lines}"
    assert final[-1]["content"] == FINAL_ANSWER
