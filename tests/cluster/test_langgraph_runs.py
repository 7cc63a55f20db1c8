"""A plain LangGraph graph as an AgentRun on the emulated cluster (issue 23): the operator treats it like any run.

``examples.langgraph_support_agent:app`` (``StateGraph``, ``LedgerToolNode``, compiled without a
checkpointer), run by real runner pods against the real PostgreSQL: to Succeeded with the status mirroring
the store; a pod SIGKILLed mid-tool is rescheduled and the card is charged once; a LangGraph ``interrupt()``
is phase Interrupted and ``spec.resume`` (what ``kubectl agentrun approve`` patches) completes it; a
``spec.stop`` ends a run hung in a tool.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.support_agent import count_effects
from kubesim import EmulatedCluster, KubeletThread
from tests.cluster.operator_harness import (
    OperatorProcess,
    agentrun,
    apply,
    progress,
    start_operator,
    wait_node,
    wait_phase,
)

pytestmark = pytest.mark.timeout(180)
GRAPH = "examples.langgraph_support_agent:app"


@pytest.fixture
def store(cluster: EmulatedCluster, dsn: str) -> str:
    result = cluster.kubectl(
        "create", "secret", "generic", "agentrun-store", "-n", "default", f"--from-literal=postgresDsn={dsn}"
    )
    assert result.returncode == 0, result.stderr
    return dsn


@pytest.fixture
def operator(cluster: EmulatedCluster, kubelet: KubeletThread, store: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    process = start_operator(cluster, tmp_path)
    try:
        yield process
    finally:
        process.stop()


@pytest.mark.real_server
def test_a_langgraph_agentrun_survives_sigkill_mid_tool_and_charges_once(
    cluster: EmulatedCluster, kubelet: KubeletThread, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    apply(
        cluster,
        agentrun(
            "lg-kill",
            thread="lg-kill",
            graph=GRAPH,
            effects=effects,
            env={"SUPPORT_TOOL_DELAY": "1.5"},
            restartPolicy={"maxRestarts": 3, "backoffSeconds": 1},
        ),
    )
    wait_node(store, "default/lg-kill", "tools")
    time.sleep(0.5)  # inside the tools now
    kubelet.kill("lg-kill-1")
    final = wait_phase(cluster, operator, "lg-kill", "Succeeded", timeout=90)
    assert final["podName"] == "lg-kill-2" and final["attempt"] == 2 and final["restarts"] == 1
    stored = progress(store, "default/lg-kill")
    assert stored is not None and stored.status == "completed"
    assert final["stateVersion"] == stored.version, "status.stateVersion must mirror the store's version"
    assert count_effects(str(effects))["charges"] == 1, "GUARANTEE BROKEN: charged twice after SIGKILL"
    assert final["toolCalls"]["replayed"] >= 1, f"the ledger's replays do not reach the status: {final['toolCalls']}"
    # Every call counted once across both attempts (issue 24): lookup_order executed in attempt 1 (recorded, then
    # the kill came before the step's checkpoint) and replayed in attempt 2; each call in flight at the kill ran
    # again in attempt 2 (in doubt, retried with its key).
    calls = final["toolCalls"]
    assert calls["executed"] == 3 and calls["executed"] == calls["replayed"] + calls.get("inDoubt", 0), calls


@pytest.mark.real_server
def test_a_langgraph_interrupt_is_phase_interrupted_and_spec_resume_completes_it(
    cluster: EmulatedCluster, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    apply(cluster, agentrun("lg-refund", thread="lg-refund", graph=GRAPH, effects=effects, text="refund order 4821"))
    paused = wait_phase(cluster, operator, "lg-refund", "Interrupted", timeout=90)
    assert "refund 4999 cents" in json.dumps(paused["interrupt"]), paused["interrupt"]
    assert count_effects(str(effects))["refunds"] == 0
    patch = {"spec": {"resume": {"values": {paused["interrupt"]["id"]: True}}}}
    patched = cluster.kubectl("patch", "ar", "lg-refund", "--type", "merge", "-p", json.dumps(patch))
    assert patched.returncode == 0, patched.stderr
    wait_phase(cluster, operator, "lg-refund", "Succeeded", timeout=90)
    assert count_effects(str(effects))["refunds"] == 1


@pytest.mark.real_server
def test_spec_stop_ends_a_langgraph_run_hung_in_a_tool(
    cluster: EmulatedCluster, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    apply(
        cluster, agentrun("lg-hung", thread="lg-hung", graph=GRAPH, effects=effects, env={"SUPPORT_TOOL_DELAY": "3600"})
    )
    wait_node(store, "default/lg-hung", "tools")
    time.sleep(0.5)
    patched = cluster.kubectl("patch", "ar", "lg-hung", "--type", "merge", "-p", '{"spec":{"stop":true}}')
    assert patched.returncode == 0, patched.stderr
    final = wait_phase(cluster, operator, "lg-hung", "Stopped", timeout=30)
    assert final["reason"] == "Stopped", "the runner should have stopped by itself, not been force-deleted"
    assert progress(store, "default/lg-hung").status == "stopped"  # type: ignore[union-attr]
