"""SIGKILL right after a LangGraph run's progress row rode in its next super-step's statement: charged once.

Guarantee protected (issue 34 item 1): run as an AgentRun on PostgreSQL, the
mirror's progress row goes in the statement of the next LangGraph
checkpoint (``run._Mirror``, migration 19). A real SIGKILL right after the
statement that carried the model's next checkpoint, its writes and the row
staged after the tool node's step (``after_progress_ride:model:2``, the ride
after the charge): the row and the checkpoint are one commit (same
transaction id), the card was charged once, and the next attempt continues
after the tool node, which does not run again: the card is still charged
ONCE, and the run completes with its progress row at ``__end__``. (The row
naming the tool node itself goes before its calls start, beside its ledger
prefetch, so the progress shows the node a crash during a side effect hit.)
"""

from __future__ import annotations

import signal
import subprocess
import sys

from examples.support_agent import count_effects
from tests.conftest import ROOT

from .helpers import fetch

THREAD = "default/lg-ride"


def _turn(env: dict[str, str], dsn: str, attempt: int, fault: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.support.drive_langgraph_turn", dsn, THREAD, str(attempt)],
        env={**env, "AGENTRUN_FAULT_POINT": fault} if fault else env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_a_sigkill_after_a_ridden_statement_charges_once(pg_dsn: str, subprocess_env: dict[str, str]) -> None:
    first = _turn(subprocess_env, pg_dsn, 1, "after_progress_ride:model:2")
    assert first.returncode == -signal.SIGKILL, f"the turn was supposed to die after the ride:\n{first.stderr[-3000:]}"
    assert "AGENTRUN-FAULT after_progress_ride:model:2" in first.stderr
    assert count_effects(subprocess_env["SUPPORT_EFFECTS_DB"])["charges"] == 1, "the kill came before the charge"
    rows = await fetch(
        pg_dsn,
        """
        SELECT s.current_node, s.xmin::text AS x,
               (SELECT count(*) FROM lg_checkpoints c WHERE c.thread_id = s.thread_id AND c.xmin = s.xmin) AS with_it
        FROM states s WHERE s.thread_id = $1 ORDER BY s.version DESC LIMIT 1
        """,
        THREAD,
    )
    assert rows[0]["current_node"] == "model" and rows[0]["with_it"] == 1, (
        f"GUARANTEE BROKEN: the last progress row and its checkpoint were not one commit: {dict(rows[0])}"
    )

    second = _turn(subprocess_env, pg_dsn, 2)
    assert second.returncode == 0 and "DONE completed" in second.stdout, second.stderr[-3000:]
    effects = count_effects(subprocess_env["SUPPORT_EFFECTS_DB"])
    assert effects["charges"] == 1, f"GUARANTEE BROKEN: charged {effects['charges']} times"
    last = await fetch(
        pg_dsn,
        "SELECT status, current_node FROM states WHERE thread_id = $1 ORDER BY version DESC LIMIT 1",
        THREAD,
    )
    assert (last[0]["status"], last[0]["current_node"]) == ("completed", "__end__")
