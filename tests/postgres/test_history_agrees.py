"""Status, history, page and CLI tell one story after a crash, for both engines (issue 32 item 2).

Real runner processes (``python -m agentrun.runner``) on the real PostgreSQL store: the support agent,
once on our engine and once as a plain LangGraph graph (``LedgerToolNode``), is SIGKILLed right after
``charge_card`` was recorded (the ``after_ledger_record`` fault point: a real SIGKILL), and a second
attempt completes it. Then what the operator would put in ``status.toolCalls`` (the store's counters,
``tool_call_counts``), the history the server builds (per call and per attempt), the run page and
``kubectl agentrun history``'s tables must agree:

- charge_card is "replayed" in attempt 2 (it ran in attempt 1) wherever a call is shown; LangGraph's
  showed "executed" with "Replayed in -", and its attempts "2 / 0" and "1 / 0", beside a status saying
  "replayed 2";
- the history's counts equal ``status.toolCalls``, and the attempts' counts add up to them;
- arguments and results are content: the call's arguments (not "-") and the tool message's text (not a
  LangChain ``ToolMessage`` as JSON);
- the node is ``__end__`` for both (LangGraph's was empty: "-" in ``kubectl get ar``).
"""

from __future__ import annotations

import html as html_lib
import json
import re
import signal
import subprocess
import sys
from typing import Any

import pytest

from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.history import RunHistory, build
from agentrun_history import pages
from agentrun_history.store import HistoryStore
from agentrun_operator import kubectl_plugin
from agentrun_operator.decide.toolerrors import tool_call_counts
from tests.conftest import ROOT

pytestmark = pytest.mark.postgres

CHARGE = {"messages": [{"role": "user", "content": "charge my saved card for order 4821 and email me the receipt"}]}
ENGINES = {"ours": "examples.support_agent:app", "langgraph": "examples.langgraph_support_agent:app"}
# What charge_card answered the model: our tool's dict as JSON, the LangGraph tool's ToolMessage's text.
CHARGED = {
    "ours": '{"card": "visa-4242", "status": "succeeded", "amount_cents": 4999}',
    "langgraph": "charged 4999 cents to visa-4242",
}


def runner(env: dict[str, str], attempt: int, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    """One runner pod's process: attempt ``attempt``, SIGKILLed at ``fault`` when given."""
    child = dict(env, AGENTRUN_ATTEMPT=str(attempt))
    if fault:
        child["AGENTRUN_FAULT_POINT"] = fault
    return subprocess.run(
        [sys.executable, "-m", "agentrun.runner"], env=child, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


async def crashed_then_resumed(engine: str, dsn: str, env: dict[str, str]) -> tuple[RunHistory, dict[str, Any]]:
    """The run's history and ``status.toolCalls`` after a SIGKILL right after charge_card was recorded."""
    thread = f"default/agree-{engine}"
    env = dict(
        env,
        AGENTRUN_GRAPH=ENGINES[engine],
        AGENTRUN_THREAD_ID=thread,
        AGENTRUN_RUN_NAME=f"agree-{engine}",
        AGENTRUN_RUN_UID=f"uid-{engine}",
        AGENTRUN_INPUT=json.dumps(CHARGE),
        AGENTRUN_STORE=dsn,
        AGENTRUN_METRICS_PORT="0",
    )
    killed = runner(env, 1, fault="after_ledger_record:charge_card")
    assert killed.returncode == -signal.SIGKILL, f"attempt 1 should die after charge_card:\n{killed.stderr[-3000:]}"
    done = runner(env, 2)
    assert done.returncode == 0, f"attempt 2 failed:\n{done.stderr[-3000:]}"
    assert "(charge_card)" in done.stderr and "replayed" in done.stderr, done.stderr[-3000:]
    store = PgCheckpointer(dsn)
    try:
        progress = await store.aget_progress(thread)
    finally:
        await store.aclose()
    assert progress is not None and progress.status == "completed"
    counts = dict(tool_call_counts(progress.tool_calls))  # what the operator writes into status.toolCalls
    reader = HistoryStore(dsn)
    try:
        rows = await reader.rows(thread, f"uid-{engine}")
    finally:
        await reader.aclose()
    status = {"phase": "Succeeded", "toolCalls": counts, "currentNode": progress.current_node}
    history = build(
        rows, namespace="default", name=f"agree-{engine}", thread_id=thread, uid=f"uid-{engine}", status=status
    )
    return history, status


@pytest.mark.parametrize("engine", list(ENGINES))
async def test_status_history_page_and_cli_agree_after_a_sigkill_after_charge_card(
    engine: str, pg_dsn: str, subprocess_env: dict[str, str]
) -> None:
    history, status = await crashed_then_resumed(engine, pg_dsn, subprocess_env)
    calls = {c.name: c for c in history.tool_calls}
    assert list(calls) == ["lookup_order", "charge_card", "send_receipt"], [c.name for c in history.tool_calls]
    charge = calls["charge_card"]
    assert (charge.outcome, charge.attempt, charge.replayed_in) == ("replayed", 1, [2]), (
        f"{engine}: the status says replayed {status['toolCalls']}, the call shows {charge.outcome} in "
        f"{charge.attempt}, replayed in {charge.replayed_in}"
    )
    # One count: the history's totals are the status's, and its attempts add up to them.
    assert history.tool_counts == status["toolCalls"], (engine, history.tool_counts, status["toolCalls"])
    assert sum(a.tool_calls_executed for a in history.attempts) == status["toolCalls"]["executed"]
    assert sum(a.tool_calls_replayed for a in history.attempts) == status["toolCalls"]["replayed"]
    assert [a.attempt for a in history.attempts] == [1, 2]
    assert history.attempts[1].tool_calls_replayed >= 2, history.attempts  # lookup_order and charge_card
    # Content, not "-" nor a LangChain ToolMessage's JSON.
    assert charge.arguments is not None and json.loads(charge.arguments.preview) == {"order_id": "4821"}
    assert charge.result is not None and charge.result.preview == CHARGED[engine], charge.result
    assert history.current_node == "__end__" == status["currentNode"], (history.current_node, status)

    # The page: the summary's counts, the call's row and the attempts' columns, from the same model.
    counts = status["toolCalls"]
    page = html_lib.unescape(pages.timeline(history, {"status": status, "spec": {}}))
    assert f"executed {counts['executed']}, replayed {counts['replayed']}, in doubt {counts.get('inDoubt', 0)}" in page
    row = next(r for r in re.findall(r'<tr class="call[^"]*">(.*?)</tr>', page, re.S) if ">charge_card</td>" in r)
    assert ">replayed</span>" in row and "<td>1</td><td>2</td>" in row, row  # ran in attempt 1, replayed in 2
    assert CHARGED[engine] in row and "4821" in row, row  # its result and arguments as content
    assert "__end__" in page
    # kubectl agentrun history: the same JSON the server sends, as tables.
    found = json.loads(history.model_dump_json())
    (_, *shown) = kubectl_plugin._history_tool_call_rows(found)
    assert [r[2:5] for r in shown if r[0] == "charge_card"] == [["replayed", "1", "2"]], shown
    (_, *attempts) = kubectl_plugin._history_attempt_rows(found)
    run, replayed = zip(*(map(int, r[-1].split()[0].split("/")) for r in attempts), strict=True)
    assert (sum(run), sum(replayed)) == (counts["executed"], counts["replayed"]), attempts
    words = f"executed {counts['executed']}, replayed {counts['replayed']}, in doubt {counts.get('inDoubt', 0)}"
    assert kubectl_plugin._history_counts(found).startswith(words), kubectl_plugin._history_counts(found)
