"""A pending tool call edited before it runs (issue 32 item 5): LangChain's ``HumanInTheLoopMiddleware``.

``examples/review.yaml`` (``examples.langchain_review:app``: ``create_agent``, ``LedgerMiddleware`` and
``HumanInTheLoopMiddleware`` on ``charge_card``) as AgentRuns on the cluster, real runner pods against the
real PostgreSQL. The customer names order 4812, a typo; the run is Interrupted with the pending call, and a
person corrects it to 4821: once with ``kubectl agentrun approve NAME --edit ARGS`` (the real kubectl finding
the plugin), once through the history server's HTTP API as the run's page posts it (the id and digest from
the page's Edit button). Answers the middleware would fail the run on (a bare ``true``, a decision it does
not allow, an edit that names another tool) are refused before they reach the run. Each run then Succeeds
having charged the card once, for the edited order, never for the one the model named. ``--edit`` on an
interrupt that is not a tool call review is refused with a line saying how to answer it.
"""

from __future__ import annotations

import html
import json
import os
import re
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesim import KUBECTL, EmulatedCluster
from tests.cluster import operator_harness as harness
from tests.cluster.history_people import people
from tests.cluster.history_process import history_server
from tests.cluster.operator_harness import OperatorProcess, agentrun, apply, status, wait_phase

pytestmark = [pytest.mark.timeout(240), pytest.mark.real_server]
store, operator = harness.store, harness.operator

GRAPH = "examples.langchain_review:app"
TYPO = "charge my saved card for order 4812"
EDITED = {"order_id": "4821"}
BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


def agentrun_cli(cluster: EmulatedCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl agentrun ARGS`` as the cluster's admin: the real kubectl, which finds the plugin on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
    env.update(KUBECONFIG=str(cluster.kubeconfig), PATH=os.pathsep.join([str(BIN), env.get("PATH", "/usr/bin")]))
    return subprocess.run([KUBECTL, "agentrun", *args], capture_output=True, text=True, env=env, timeout=60)


def charges(effects: Path) -> list[tuple[str, int]]:
    """What the payment provider charged (order, cents), and every charge_card invocation's order."""
    conn = sqlite3.connect(effects)
    try:
        charged = conn.execute("SELECT order_id, amount_cents FROM charges").fetchall()
        ran = conn.execute("SELECT order_id FROM tool_invocations WHERE tool = 'charge_card'").fetchall()
    finally:
        conn.close()
    return [*charged, *[(order, -1) for (order,) in ran]]


def post(url: str, token: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """A POST as the page's buttons send it (the action header, JSON)."""
    headers = {"Authorization": f"Bearer {token}", "X-Agentrun-Action": "1", "Content-Type": "application/json"}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def review_run(name: str, effects: Path) -> dict[str, Any]:
    """examples/review.yaml as written, with its own name and thread and the effects file in the test's folder."""
    manifest = yaml.safe_load((ROOT / "examples" / "review.yaml").read_text())
    assert manifest["spec"]["graph"] == GRAPH and TYPO in json.dumps(manifest["spec"]["input"]), manifest
    manifest["metadata"]["name"] = manifest["spec"]["threadId"] = name
    manifest["spec"]["podTemplate"]["env"] = agentrun(name, thread=name, effects=effects)["spec"]["podTemplate"]["env"]
    return dict(manifest)


def assert_charged_once_as_edited(effects: Path) -> None:
    found = charges(effects)
    assert found == [("4821", 4999), ("4821", -1)], (
        f"GUARANTEE BROKEN: charge_card must run once, with the edited order 4821 (charges, then invocations): {found}"
    )


def test_an_edit_from_the_cli_and_one_from_the_page_run_the_tool_once_with_the_edited_arguments(
    cluster: EmulatedCluster, operator: OperatorProcess, store: str, tmp_path: Path
) -> None:
    cli_effects, page_effects = tmp_path / "cli.db", tmp_path / "page.db"
    apply(cluster, review_run("review-cli", cli_effects))
    apply(cluster, review_run("review-page", page_effects))
    paused = wait_phase(cluster, operator, "review-cli", "Interrupted", timeout=120)
    request = paused["interrupt"]["payload"]
    assert request["action_requests"][0]["args"] == {"order_id": "4812"}, request
    assert request["review_configs"][0]["allowed_decisions"] == ["approve", "edit", "reject"], request
    assert not cli_effects.exists() or charges(cli_effects) == [], "nothing runs before the review"

    # The CLI: what describe shows, answers the middleware would fail on, then the edit.
    described = agentrun_cli(cluster, "describe", "review-cli").stdout
    assert 'tool call:  charge_card {"order_id": "4812"} (allowed: approve, edit, reject)' in described, described
    assert "--edit ARGS" in described, described
    for args, says in (
        (("--value", "true"), "this interrupt is a tool call review (LangChain HumanInTheLoopMiddleware): send"),
        (("--value", '{"decisions": [{"type": "respond", "message": "ok"}]}'), '"respond" is not allowed'),
        (("--edit", '["4821"]'), "the edited arguments are a JSON object"),
        (("--edit", "{order_id: 4821}"), "--edit is not JSON"),
        (("--edit", "{}", "--value", "true"), "--value and --edit are two answers"),
    ):
        refused = agentrun_cli(cluster, "approve", "review-cli", *args)
        assert refused.returncode == 1 and says in refused.stderr, (args, refused.stderr)
    assert status(cluster, "review-cli")["phase"] == "Interrupted", "a refused answer must not resume the run"
    said = agentrun_cli(cluster, "approve", "review-cli", "--edit", json.dumps(EDITED))
    assert said.returncode == 0, said.stderr
    assert '"edited_action": {"name": "charge_card", "args": {"order_id": "4821"}}' in said.stdout, said.stdout

    # The page: the pending call shown with its arguments and the buttons its allowed decisions give.
    wait_phase(cluster, operator, "review-page", "Interrupted", timeout=120)
    alice = people(cluster, "default", [("alice", "default", "agentrun-view"), ("alice", "default", "agentrun-edit")])
    with history_server(cluster, store, tmp_path) as server:
        page = server.get("/runs/default/review-page")
        edit_button = re.search(r'<button class="act edit"[^>]*data-interrupt="([^"]*)" data-digest="([^"]*)"', page)
        assert edit_button, page[:4000]
        shown = html.unescape(page)
        assert "<code class=tool>charge_card</code> <span class=allowed>allowed: approve, edit, reject</span>" in shown
        assert re.search(r'<textarea id=edit-args[^>]*>\{\s*"order_id": "4812"\s*\}</textarea>', shown), shown[:4000]
        for verb in ("approve", "reject"):
            assert f'class="act {verb}"' in page, f"{verb} is allowed: the page offers it"
        seen = {"interrupt": edit_button.group(1), "digest": edit_button.group(2)}
        approve = f"{server.url}/runs/default/review-page/approve"
        for value, says in (
            (True, "this interrupt is a tool call review"),
            ({"decisions": []}, "1 tool call(s) wait for review (charge_card) and the answer has 0 decision(s)"),
            (
                {"decisions": [{"type": "edit", "edited_action": {"name": "refund_payment", "args": EDITED}}]},
                'an edit keeps the tool ("name": "charge_card")',
            ),
        ):
            code, answer = post(approve, alice["alice"], {**seen, "value": value})
            assert code == 400 and says in answer["message"], (code, answer)
        assert "resume" not in (cluster.get("agentruns", "review-page", "default") or {}).get("spec", {})
        edit = {"decisions": [{"type": "edit", "edited_action": {"name": "charge_card", "args": EDITED}}]}
        code, answer = post(approve, alice["alice"], {**seen, "value": edit})
        assert code == 200, answer
        for name, effects in (("review-cli", cli_effects), ("review-page", page_effects)):
            final = wait_phase(cluster, operator, name, "Succeeded", timeout=120)
            assert "charged 4999 cents" in final["result"]["message"], final["result"]
            assert_charged_once_as_edited(effects)
        code, moved_on = post(approve, alice["alice"], {**seen, "value": edit})
        assert code == 409 and "not waiting for an answer (phase Succeeded)" in moved_on["message"], moved_on


def test_edit_is_refused_when_the_interrupt_is_not_a_tool_call_review(cluster: EmulatedCluster) -> None:
    made = cluster.kubectl("apply", "-f", "-", input=json.dumps(review_run("plain", Path("/nonexistent"))))
    assert made.returncode == 0, made.stderr
    interrupt = {"id": "i-1", "ids": ["i-1"], "message": "refund 49.99?", "payload": {"amount": "49.99"}}
    patched = cluster.kubectl(
        "patch", "ar", "plain", "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"phase": "Interrupted", "interrupt": interrupt}}),
    )  # fmt: skip
    assert patched.returncode == 0, patched.stderr
    refused = agentrun_cli(cluster, "approve", "plain", "--edit", json.dumps(EDITED))
    assert refused.returncode == 1, refused.stdout
    assert (
        "--edit answers a tool call review (LangChain HumanInTheLoopMiddleware) and this interrupt is not one"
        in (refused.stderr)
        and "answer it with --value JSON" in refused.stderr
    ), refused.stderr
    assert "resume" not in (cluster.get("agentruns", "plain", "default") or {}).get("spec", {}), "nothing answered"
