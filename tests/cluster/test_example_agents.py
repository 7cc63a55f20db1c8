"""The MCP and LangChain examples as AgentRuns (issue 24 item 5), on the emulated cluster and the real control plane.

Real operator process, real runner pods (local processes), real PostgreSQL, the manifests of examples/ as
a user applies them. ``examples/mcp_agent.yaml``: the graph lists a real MCP server's tools at import with
``mcp_tools()`` (inside the runner's event loop), the server being ``examples.billing_mcp`` started by the
runner over stdio, or a server process of its own reached over streamable HTTP. The runner is SIGKILLed
right after the MCP ``charge_card`` returned and was recorded (fault point ``after_ledger_record``, attempt 1
only); the operator reschedules, attempt 2 replays the call from the ledger, the run Succeeds and the
server's own record shows ONE execution of ``charge_card``. ``examples/langchain_agent.yaml`` runs to
Succeeded with one charge.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import yaml

from examples.support_agent import count_effects
from kubesim import EmulatedCluster
from tests.cluster import operator_harness as harness
from tests.cluster.operator_harness import ROOT, OperatorProcess, apply, wait_phase
from tests.support.billing import billing_over_http

store, operator = harness.store, harness.operator

pytestmark = pytest.mark.timeout(180)


def example(name: str, **env: str) -> dict[str, Any]:
    """examples/<name>.yaml with ``env`` set in its pod template (replacing a variable of the same name)."""
    manifest: dict[str, Any] = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    template = manifest["spec"].setdefault("podTemplate", {})
    kept = [v for v in template.get("env", []) if v["name"] not in env]
    template["env"] = kept + [{"name": k, "value": v} for k, v in env.items()]
    return manifest


@pytest.mark.real_server
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_an_mcp_charge_killed_after_it_returned_is_replayed_and_charged_once(
    transport: str,
    cluster: EmulatedCluster,
    operator: OperatorProcess,
    store: str,
    tmp_path: Path,
    subprocess_env: dict[str, str],
) -> None:
    charged = tmp_path / "charges.jsonl"
    # charge_card takes a second, so lookup_order is recorded before it and the kill ends the step's attempt.
    settings = {"BILLING_CHARGES_FILE": str(charged), "BILLING_CHARGE_SECONDS": "1"}
    server_env = {**subprocess_env, **settings}
    with billing_over_http(server_env, tmp_path / "billing.log") if transport == "http" else nullcontext() as url:
        env = {**settings, "AGENTRUN_FAULT_POINT": "after_ledger_record:charge_card@1"}
        if url:
            env["BILLING_MCP_URL"] = url
        manifest = example("mcp_agent", **env)
        name = manifest["metadata"]["name"] = manifest["spec"]["threadId"] = f"mcp-{transport}"  # a thread each
        manifest["spec"]["restartPolicy"] = {"maxRestarts": 3, "backoffSeconds": 1}
        apply(cluster, manifest)
        final = wait_phase(cluster, operator, name, "Succeeded", timeout=120)
    first = (final.get("attempts") or [{}])[0]
    assert first.get("exitCode") == 137 and final["attempt"] == 2 and final["restarts"] == 1, (
        f"the runner was not killed at the fault point and rescheduled: {json.dumps(final)}"
    )
    executions = [json.loads(line) for line in charged.read_text().splitlines()]
    assert len(executions) == 1, f"GUARANTEE BROKEN: the MCP charge_card ran {len(executions)} times: {executions}"
    assert str(executions[0]["idempotency_key"]).startswith("ar-"), executions
    # Attempt 1 executed both calls, attempt 2 replayed both from the ledger: the status counts all four.
    assert final["toolCalls"] == {"executed": 2, "replayed": 2}, final["toolCalls"]
    assert "charge_card" in final["result"]["message"] and '"status": "succeeded"' in final["result"]["message"]


@pytest.mark.real_server
def test_the_langchain_example_runs_to_succeeded(
    cluster: EmulatedCluster, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.db"
    apply(cluster, example("langchain_agent", SUPPORT_EFFECTS_DB=str(effects)))
    final = wait_phase(cluster, operator, "langchain-order-4821", "Succeeded", timeout=90)
    assert final["toolCalls"] == {"executed": 2, "replayed": 0}, final["toolCalls"]
    assert count_effects(str(effects))["charges"] == 1
    assert final["modelUsage"][0]["model"] == "support-scripted", final.get("modelUsage")
