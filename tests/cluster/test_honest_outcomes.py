"""Honest outcomes (issue 32 item 3), where people look: ``kubectl get ar``, ``kubectl agentrun watch``, the
history server's list and run page (its JSON too).

Real operator process, real runner pods, real PostgreSQL, real ``kubectl`` (and the plugin it finds on
PATH) and the real history server process, as in tests/cluster/test_operator.py and test_history_values.py:

- every tool call of a run fails (an unknown order) and the run Succeeds: ``kubectl get ar`` shows
  ``3 failed`` in its Tools column, ``watch`` counts them and says "Succeeded with 3 failed tool calls",
  the list and the page carry that warning (they showed a plain green Succeeded and ``0 / 0``);
- a run stopped while two of its tools hang: those show "running" while the runner runs them, then
  "cancelled" (they stayed "running" forever); the attempt's reason is Stopped (the kubelet's was
  Error); its pod start is shown apart and step 0 (the opening checkpoint) has no duration of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kubesim import KUBECTL, EmulatedCluster
from tests.cluster.history_process import BIN, history_server
from tests.cluster.operator_harness import NO_SUCH_ORDER, OperatorProcess, agentrun, apply, table, wait_node, wait_phase

pytestmark = [pytest.mark.cluster, pytest.mark.real_server, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
NS = "default"


def plugin(cluster: EmulatedCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl agentrun ARGS`` as the cluster's admin: the real kubectl finds the plugin on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
    env.update(KUBECONFIG=str(cluster.kubeconfig), PATH=os.pathsep.join([str(BIN), env.get("PATH", "/usr/bin")]))
    return subprocess.run([KUBECTL, "agentrun", *args], capture_output=True, text=True, env=env, timeout=60)


def test_a_run_whose_tools_all_fail_says_so_in_get_watch_the_list_and_the_page(
    cluster: EmulatedCluster, operator: OperatorProcess, dsn: str, tmp_path: Path
) -> None:
    apply(cluster, agentrun("all-fail", thread="all-fail", effects=tmp_path / "effects.db", text=NO_SUCH_ORDER))
    final = wait_phase(cluster, operator, "all-fail", "Succeeded")
    assert final["toolCalls"] == {"executed": 0, "replayed": 0, "failed": 3}, final["toolCalls"]

    listed = cluster.kubectl("get", "ar", "all-fail")
    assert listed.returncode == 0, listed.stderr
    header, row = table(listed.stdout)
    assert dict(zip(header, row, strict=True))["TOOLS"] == "3 failed", (
        f"GUARANTEE BROKEN: kubectl get ar must show the failed tool calls of a Succeeded run:\n{listed.stdout}"
    )
    watched = plugin(cluster, "watch", "all-fail")
    assert watched.returncode == 0, f"a Succeeded run is still a success for watch: {watched.stderr}"
    assert "Succeeded with 3 failed tool calls" in watched.stdout, watched.stdout
    assert "tools=0 run/0 replayed/3 failed" in watched.stdout, watched.stdout

    with history_server(cluster, dsn, tmp_path) as server:
        runs = server.get(f"/runs?namespace={NS}")
        page = server.get(f"/runs/{NS}/all-fail")
        brief = json.loads(server.get(f"/api/v1/namespaces/{NS}/agentruns"))
    assert "with 3 failed tool calls" in runs and "3 failed" in runs, "the list must show the warning"
    assert "Succeeded with 3 failed tool calls." in page and "no order 9999" in page, "the page: the warning and why"
    (item,) = [i for i in brief["items"] if i["name"] == "all-fail"]
    assert (item["tools"], item["warning"]) == ("3 failed", "3 failed tool calls"), item


def test_a_stopped_runs_calls_are_cancelled_its_attempt_stopped_and_its_pod_start_apart(
    cluster: EmulatedCluster, operator: OperatorProcess, dsn: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    apply(cluster, agentrun("hangs", thread="hangs", effects=effects, env={"SUPPORT_TOOL_DELAY": "3600"}))
    wait_node(dsn, f"{NS}/hangs", "tools")
    with history_server(cluster, dsn, tmp_path) as server:

        def started() -> dict[str, Any] | None:
            found = server.history("hangs")
            outcomes = sorted(c["outcome"] for c in found["tool_calls"])
            return found if outcomes == ["executed", "running", "running"] else None

        # lookup_order returned at once; charge_card and send_receipt (side effects: their intents recorded) hang.
        cluster.wait_for(started, timeout=30, message="the two calls with side effects running")
        patched = cluster.kubectl("patch", "ar", "hangs", "--type", "merge", "-p", '{"spec":{"stop":true}}')
        assert patched.returncode == 0, patched.stderr
        final = wait_phase(cluster, operator, "hangs", "Stopped", timeout=60)
        found = server.history("hangs")
    assert final["reason"] == "Stopped", f"the runner stopped by itself (exit 4), not ForcedStop: {final}"
    calls = {c["name"]: c["outcome"] for c in found["tool_calls"]}
    assert calls == {"lookup_order": "executed", "charge_card": "cancelled", "send_receipt": "cancelled"}, (
        f"GUARANTEE BROKEN: a stopped run's calls in flight must show cancelled, not running forever: {calls}"
    )
    (attempt,) = found["attempts"]
    assert (attempt["outcome"], attempt["exit_code"], attempt["reason"]) == ("Stopped", 4, "Stopped"), attempt
    first = found["steps"][0]
    assert attempt["pod_start_seconds"] is not None and attempt["pod_start_seconds"] > 0, attempt
    assert first["pod_start_seconds"] == attempt["pod_start_seconds"], found["steps"]
    assert first["duration_seconds"] is None or first["duration_seconds"] < attempt["pod_start_seconds"], (
        f"GUARANTEE BROKEN: step 0's duration counts the pod's start: {found['steps']}"
    )
