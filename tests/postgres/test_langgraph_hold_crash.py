"""SIGKILL at the super-step hold of ``AgentrunSaver``: the card is charged once, whichever side of the commit.

Guarantee protected (issue 34 item 1): a task's pending writes wait in the
saver for the checkpoint that follows them and go in its statement
(``integrations/langgraph/hold.py``). A real SIGKILL

- while the tool node's writes are held (``after_lg_writes_held``: its three
  calls returned and were recorded in the ledger, its writes not stored):
  the writes are lost, LangGraph runs the tool node again on resume, and
  every call answers from the ledger: each tool executed ONCE;
- right after the statement carrying them committed
  (``after_lg_step_commit``): the resume starts after the tool node, which
  does not run again: each tool executed ONCE.

On PostgreSQL (``invoke`` and ``stream``) and SQLite, in new processes. The
child holds writes for 5 s, so a loaded machine cannot let them go alone
before their checkpoint (the fault points would then not fire).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import ToolMessage

from agentrun.integrations.langgraph import AgentrunSaver
from tests.support.langgraph_crash import FINAL_ANSWER, TOOLS, drive

THREAD = "order-4821-hold"
HOLD = ["--hold", "5"]


async def _after_the_kill(store: str) -> tuple[bool, bool]:
    """What the kill left: (the tool node's writes stored, a checkpoint after the tool node stored)."""
    saver = AgentrunSaver.from_url(store)
    try:
        config: Any = {"configurable": {"thread_id": THREAD}}
        latest = await saver.aget_tuple(config)
        assert latest is not None, "nothing was stored before the kill"
        parent = None if latest.parent_config is None else await saver.aget_tuple(latest.parent_config)

        def tool_writes(pending: Any) -> bool:
            return any(
                isinstance(v, ToolMessage) or (isinstance(v, list) and any(isinstance(m, ToolMessage) for m in v))
                for _, _, v in pending or []
            )

        after_tools = parent is not None and tool_writes(parent.pending_writes)
        return tool_writes(latest.pending_writes) or after_tools, after_tools
    finally:
        await saver.aclose()


@pytest.mark.parametrize("point", ["after_lg_writes_held", "after_lg_step_commit"])
@pytest.mark.parametrize(("backend", "mode"), [("postgres", "invoke"), ("postgres", "stream"), ("sqlite", "invoke")])
async def test_a_kill_at_the_super_step_hold_charges_the_card_once(
    point: str, backend: str, mode: str, pg_dsn: str, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    store = pg_dsn if backend == "postgres" else f"sqlite:///{tmp_path / 'agentrun.db'}"
    effects = tmp_path / "effects.jsonl"
    env = dict(subprocess_env, LG_EFFECTS_FILE=str(effects))
    crashed = drive(
        env, "agentrun", store, THREAD, text="charge order 4821", mode=mode, fault=f"{point}:tools", extra=HOLD
    )
    assert crashed.returncode == -signal.SIGKILL, f"the run was supposed to die at {point}:\n{crashed.stderr[-3000:]}"
    stored, after_tools = await _after_the_kill(store)
    if point == "after_lg_writes_held":
        assert not stored, "the tool node's held writes were stored before the kill: the fault point is not at the hold"
    else:
        assert stored and after_tools, "the kill after the step's commit found the tool node's writes missing"

    resumed = drive(env, "agentrun", store, THREAD, text=None, mode=mode, fault=None, extra=HOLD)
    assert resumed.returncode == 0, f"the resume failed:\n{resumed.stderr[-3000:]}"
    executions: dict[str, int] = {}
    for line in effects.read_text().splitlines():
        tool = line.split('"tool": "')[1].split('"')[0]
        executions[tool] = executions.get(tool, 0) + 1
    assert executions.get("charge_card") == 1, f"GUARANTEE BROKEN: the card was charged {executions} times"
    assert executions == dict.fromkeys(TOOLS, 1), f"GUARANTEE BROKEN: a tool ran again: {executions}"
    replays = resumed.stderr.count("replayed from ledger")
    # Held writes lost: the tool node runs again and every call answers from the ledger. Committed: it does not run.
    assert replays == (3 if point == "after_lg_writes_held" else 0), f"{replays} calls replayed:\n{resumed.stderr}"
    final = next(line for line in resumed.stdout.splitlines() if line.startswith("FINAL "))
    assert FINAL_ANSWER in final
