"""examples/mcp_agent.py and examples/langchain_agent.py run as a user runs them (issue 24 item 5).

Each is run as a real process (``python -m examples.<name>``, from a fresh folder): the MCP example against
the real ``examples.billing_mcp`` server, started by the graph over stdio and, with ``BILLING_MCP_URL``, as a
server of its own over streamable HTTP; the LangChain example with its LangChain tools and chat model. Each
charges the card once, with agentrun's idempotency key. Their AgentRun manifests are checked against the
CRD in tests/cluster/test_crd.py and run on the cluster tier in tests/cluster/test_example_agents.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest

from examples.support_agent import count_effects
from tests.support.billing import billing_over_http

pytestmark = pytest.mark.timeout(120)


def run(module: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module], env=env, cwd=cwd, capture_output=True, text=True, timeout=90, check=False
    )


def charges(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_mcp_example_charges_once_through_a_real_mcp_server(
    transport: str, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    charged = tmp_path / "charges.jsonl"
    env = {**subprocess_env, "BILLING_CHARGES_FILE": str(charged)}
    with billing_over_http(env, tmp_path / "billing.log") if transport == "http" else nullcontext() as url:
        if url:
            env["BILLING_MCP_URL"] = url
        ran = run("examples.mcp_agent", env, tmp_path)
    assert ran.returncode == 0, f"examples/mcp_agent.py does not run over {transport}:\n{ran.stderr[-3000:]}"
    assert ran.stdout.startswith("Done. lookup_order: ") and '"status": "succeeded"' in ran.stdout, ran.stdout
    (charge,) = charges(charged)
    assert str(charge["idempotency_key"]).startswith("ar-") and charge["repeat"] is False, charge
    assert (tmp_path / "agentrun.db").exists(), "the example's own run goes to ./agentrun.db"


def test_the_langchain_example_runs_its_tools_and_model(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    ran = run("examples.langchain_agent", subprocess_env, tmp_path)
    assert ran.returncode == 0, f"examples/langchain_agent.py does not run:\n{ran.stderr[-3000:]}"
    assert ran.stdout.startswith("Done: order 4821: 4999 cents") and "charged 4999 cents" in ran.stdout, ran.stdout
    assert count_effects(subprocess_env["SUPPORT_EFFECTS_DB"])["charges"] == 1
