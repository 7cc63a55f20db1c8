"""A plain LangGraph graph as an AgentRun on the emulated cluster (issue 23): the operator treats it like any run.

``examples.langgraph_support_agent:app`` (``StateGraph``, ``LedgerToolNode``, compiled without a
checkpointer), run by real runner pods against the real PostgreSQL: to Succeeded with the status mirroring
the store; a pod SIGKILLed mid-tool is rescheduled and the card is charged once; a LangGraph ``interrupt()``
is phase Interrupted and ``spec.resume`` (what ``kubectl agentrun approve`` patches) completes it; a
``spec.stop`` ends a run hung in a tool.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from examples.support_agent import count_effects
from kubesim import KUBECTL, EmulatedCluster, KubeletThread
from tests.cluster import operator_harness as harness
from tests.cluster.history_people import people
from tests.cluster.history_process import BIN, history_server
from tests.cluster.operator_harness import (
    OperatorProcess,
    agentrun,
    apply,
    progress,
    table,
    wait_node,
    wait_phase,
)

pytestmark = pytest.mark.timeout(180)
GRAPH = "examples.langgraph_support_agent:app"


store, operator = harness.store, harness.operator


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


# -- one story after a crash, for both engines (issue 32 item 2) ------------------------------------------------------

ENGINES = {"ours": "examples.support_agent:app", "lg": GRAPH}
# What charge_card answered the model: our tool's dict as JSON, the LangGraph tool's ToolMessage's text.
CHARGED = {
    "ours": '{"card": "visa-4242", "status": "succeeded", "amount_cents": 4999}',
    "lg": "charged 4999 cents to visa-4242",
}


def _watch(cluster: EmulatedCluster, name: str) -> subprocess.Popen[str]:
    """``kubectl agentrun watch NAME`` as the cluster's admin (the real kubectl finds the plugin on PATH)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
    env.update(KUBECONFIG=str(cluster.kubeconfig), PATH=os.pathsep.join([str(BIN), env.get("PATH", "/usr/bin")]))
    argv = [KUBECTL, "agentrun", "watch", name]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _history_cli(cluster: EmulatedCluster, token: str, url: str, name: str, tmp_path: Path) -> str:
    """``kubectl agentrun history NAME`` as alice (view rights), through the history server at ``url``."""
    tls: dict[str, str] = (
        {} if isinstance(cluster, EmulatedCluster) else {"certificate-authority": str(cluster.plane.ca.pair.cert)}
    )
    config = tmp_path / "alice.kubeconfig"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": cluster.url, **tls}}],
                "users": [{"name": "alice", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "alice", "namespace": "default"}}],
                "current-context": "c",
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
    env.update(KUBECONFIG=str(config), PATH=os.pathsep.join([str(BIN), env.get("PATH", "/usr/bin")]))
    shown = subprocess.run(
        [KUBECTL, "agentrun", "history", name, "--server", url], capture_output=True, text=True, env=env, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


@pytest.mark.real_server
def test_status_watch_get_history_page_and_cli_agree_after_a_sigkill_after_charge_card_on_both_engines(
    cluster: EmulatedCluster, kubelet: KubeletThread, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    """Both engines, SIGKILLed right after charge_card was recorded (the fault point's real SIGKILL, attempt 1
    only): status.toolCalls, ``kubectl get ar`` and ``watch`` (node names), the history JSON (per call, per
    attempt), the run page and ``kubectl agentrun history`` tell one story. A LangGraph run showed charge_card
    "executed", "Replayed in -", attempts "2 / 0" and "1 / 0", node "-" and its results as ToolMessage JSON."""
    watches = {}
    for engine, graph in ENGINES.items():
        name = f"agree-{engine}"
        apply(
            cluster,
            agentrun(
                name,
                thread=name,
                graph=graph,
                effects=tmp_path / f"{engine}.db",
                env={"AGENTRUN_FAULT_POINT": "after_ledger_record:charge_card@1", "SUPPORT_TOOL_DELAY": "1"},
                restartPolicy={"maxRestarts": 3, "backoffSeconds": 1},
            ),
        )
        watches[engine] = _watch(cluster, name)
    finals = {e: wait_phase(cluster, operator, f"agree-{e}", "Succeeded", timeout=120) for e in ENGINES}
    watched = {e: w.communicate(timeout=60)[0] for e, w in watches.items()}
    tokens = people(cluster, "default", [("alice", "default", "agentrun-view")])
    with history_server(cluster, store, tmp_path) as server:
        for engine in ENGINES:
            name = f"agree-{engine}"
            final, calls = finals[engine], finals[engine]["toolCalls"]
            assert (final["attempt"], final["restarts"]) == (2, 1), final
            assert count_effects(str(tmp_path / f"{engine}.db"))["charges"] == 1, f"{engine}: charged twice"
            # Node names: kubectl get ar and watch, as for our engine.
            header, row = table(cluster.kubectl("get", "ar", name).stdout)
            assert dict(zip(header, row, strict=True))["NODE"] == "__end__", f"{engine}: {row}"
            assert "node=tools" in watched[engine] and "node=__end__" in watched[engine], watched[engine]
            # The history JSON: charge_card replayed in attempt 2, the counts the status's, the attempts adding up.
            found = server.history(name)
            charge = next(c for c in found["tool_calls"] if c["name"] == "charge_card")
            assert (charge["outcome"], charge["attempt"], charge["replayed_in"]) == ("replayed", 1, [2]), (
                f"{engine}: status.toolCalls {calls} but charge_card {charge['outcome']}, {charge['replayed_in']}"
            )
            assert found["tool_counts"] == calls, (engine, found["tool_counts"], calls)
            attempts = found["attempts"]
            assert sum(a["tool_calls_executed"] for a in attempts) == calls["executed"], (engine, attempts)
            assert sum(a["tool_calls_replayed"] for a in attempts) == calls["replayed"], (engine, attempts)
            assert json.loads(charge["arguments"]["preview"]) == {"order_id": "4821"}, charge["arguments"]
            assert charge["result"]["preview"] == CHARGED[engine], charge["result"]
            assert found["current_node"] == "__end__"
            # The page and the CLI: the same counts and the call replayed.
            page = html.unescape(server.get(f"/runs/default/{name}"))
            words = f"executed {calls['executed']}, replayed {calls['replayed']}, in doubt {calls.get('inDoubt', 0)}"
            assert words in page, f"{engine}: the page's counts are not the status's {calls}"
            rows = re.findall(r'<tr class="call[^"]*">(.*?)</tr>', page, re.S)
            row = next(r for r in rows if ">charge_card</td>" in r)
            assert ">replayed</span>" in row and "<td>1</td><td>2</td>" in row and CHARGED[engine] in row, row
            printed = _history_cli(cluster, tokens["alice"], server.url, name, tmp_path)
            assert f"Tool calls: {words}" in printed, printed
            line = next(ln for ln in printed.splitlines() if ln.strip().startswith("charge_card"))
            assert line.split()[2:5] == ["replayed", "1", "2"], line
