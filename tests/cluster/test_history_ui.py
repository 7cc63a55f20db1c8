"""The run history server as people use it: Debian's chromium on its web view, ``kubectl agentrun ui`` and ``history``.

kubesim enforces RBAC (``kubesim.rbac``) for two token users, bound to the chart's own user ClusterRoles
(``templates/userroles.yaml``): alice may view and edit AgentRuns in ``default``, bob may only view them in
``team-b``. The history server (``python -m agentrun_history``) holds no identity of its own: it is started
with the cluster's address and CA only, and reads the real store. Each person reaches it through their own
``kubectl agentrun ui`` (a local proxy that carries the kubeconfig's token; alice's comes from an exec
credential plugin), and the browser is the real chromium, driven by Playwright.

What it proves, in one cluster (the runs take most of the time):
- the list shows the runs the person may list;
- a run SIGKILLed after ``charge_card`` was recorded and rescheduled shows two attempts and ``charge_card``
  replayed from the ledger in attempt 2 (charged once);
- a LangGraph run SIGKILLed the same way (the fault point after ``charge_card`` was recorded) shows its
  calls as our engine's do (issue 32 item 2): ``charge_card`` replayed in attempt 2, its arguments and its
  answer as content (not a LangChain ``ToolMessage`` as JSON), two attempts, the node names;
- approving a waiting run with a JSON value (invalid JSON is said in the page and nothing is sent; a
  confirmation shows the interrupt, its question and the value before anything is sent) resumes it with that
  value, and the page follows it to Succeeded live (server-sent events), without a reload;
- a ``create_agent`` run whose ``charge_card`` waits for a review (LangChain's HumanInTheLoopMiddleware)
  shows the pending call with its arguments; Edit (the arguments corrected, confirmed with the exact decision
  sent) runs it once with them (issue 32 item 5);
- retrying a Failed run with the button (a confirmation, then ``spec.retry`` as the person's patch) re-opens
  it, and the page follows it to Succeeded live;
- stopping a run with the button (``spec.stop``, alice's patch) is followed live to Stopped;
- bob gets 403 for a run in ``default`` (the API server's answer to his own token), and his approve of a run
  he may only view is refused by the API server: the server never acts with rights of its own;
- a shared install's token login (a pasted token in an HttpOnly cookie) authorizes as that person;
- a deleted run's history stays readable (from the store) for whoever may list AgentRuns there, and the list
  shows it, marked Deleted (found by a search of its name); bob, who may not list there, sees neither;
- an unknown run is a 404 page; a 300 kB tool result is shown as a cut preview with its size; ``<script>``
  and ``onerror`` in tool output are text, never run;
- the run inspector (issue 32 item 1): the crashed run's input, conversation (roles, tool calls with their
  arguments, answers by call id: content, not JSON), graph picture and a step opened on demand (the messages it
  appended); a graph whose state is not messages Succeeds with ``status.result`` its final values, shown in the
  page with the step that added ``greeting``, and in ``history -o json``;
- ``kubectl agentrun history`` prints the same history (table and ``-o json``).

Screenshots go to the test's tmp dir, and to ``$AGENTRUN_SCREENSHOTS`` when set (the README's come from
``AGENTRUN_SCREENSHOTS=docs/history pytest tests/cluster/test_history_ui.py``). Skipped, saying so, when
chromium or Playwright is missing (``make chromium`` installs Debian's chromium).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_dev.databases import throwaway_database
from agentrun_dev.servers import free_port
from kubesim import KUBECTL, EmulatedCluster, KubeletThread
from tests.cluster.history_people import people
from tests.cluster.kubeconfigs import exec_user, kubeconfig_doc, write_plugin, write_yaml
from tests.cluster.operator_harness import (
    agentrun,
    apply,
    executions,
    start_operator,
    store_secret,
    wait_phase,
)

pytestmark = [pytest.mark.cluster, pytest.mark.real_server, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CHROMIUM = Path("/usr/bin/chromium")

playwright_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is not installed")
if not CHROMIUM.exists():
    pytest.skip("Debian's chromium is not installed (make chromium / scripts/chromium.sh)", allow_module_level=True)


def call(url: str, token: str | None = None, method: str = "GET", headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, method=method, headers=dict(headers or {}))
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        with e:
            return e.code
    except urllib.error.URLError:
        return 0  # not listening (yet)


class Process:
    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = log.open("w")
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=ROOT)

    def stop(self) -> None:
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text()


def user_env(kubeconfig: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
    env.update(KUBECONFIG=str(kubeconfig), KUBECTL=KUBECTL, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "/usr/bin:/bin")])
    return env


def start_ui(kubeconfig: Path, server: str, log: Path, started: list[Any]) -> tuple[Process, str]:
    """``kubectl agentrun ui`` for the kubeconfig's identity; returns it and its 127.0.0.1 address."""
    ui = Process(
        [KUBECTL, "agentrun", "ui", "--server", server, "--port", "0", "--no-browser"], user_env(kubeconfig), log
    )
    started.append(ui)
    assert ui.proc.stdout is not None
    line = ui.proc.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+", line)
    assert found, f"kubectl agentrun ui printed no address: {line!r}\n{ui.log()}"
    return ui, found.group(0)


@pytest.fixture
def dsn() -> Iterator[str]:
    """A fresh database per test (the runs' thread ids repeat on each API server)."""
    with throwaway_database() as database:
        yield database


@pytest.fixture
def world(cluster: Any, kubelet: KubeletThread, dsn: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The cluster with RBAC enforced, the operator, the history server and each person's ``kubectl agentrun ui``.

    The one thing that differs by server, and why: how a person gets a token. kubesim maps static tokens to
    users (``token_users``); the real kube-apiserver issues ServiceAccount tokens (TokenRequest).
    """
    real = not isinstance(cluster, EmulatedCluster)
    ns, other_ns = "default", "team-b"
    made = cluster.kubectl("create", "namespace", other_ns)
    assert made.returncode == 0, made.stderr
    store_secret(cluster, dsn, namespace=ns)
    store_secret(cluster, dsn, namespace=other_ns)
    grants = [("alice", ns, "agentrun-view"), ("alice", ns, "agentrun-edit"), ("bob", other_ns, "agentrun-view")]
    tokens = people(cluster, ns, grants)
    tls = {"certificate-authority": str(cluster.plane.ca.pair.cert)} if real else {}
    started: list[Any] = []
    try:
        operator = start_operator(cluster, tmp_path)
        started.append(operator)
        port = free_port()
        # The server gets the cluster's address (and CA) from a kubeconfig, and drops its user: no identity.
        server_env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
        server_env.update(
            KUBECONFIG=str(cluster.kubeconfig),
            PYTHONPATH=str(ROOT),
            AGENTRUN_HISTORY_POSTGRES_DSN=dsn,
            AGENTRUN_HISTORY_HOST="127.0.0.1",
            AGENTRUN_HISTORY_PORT=str(port),
            AGENTRUN_HISTORY_TOKEN_LOGIN="true",  # for the shared-install scenario; the proxies send headers
        )
        server = Process([sys.executable, "-m", "agentrun_history"], server_env, tmp_path / "history.log")
        started.append(server)
        url = f"http://127.0.0.1:{port}"
        try:
            cluster.wait_for(lambda: call(url + "/healthz") == 200, timeout=30, message="the history server answers")
        except AssertionError:
            raise AssertionError(f"the history server did not start:\n{server.log()[-3000:]}") from None
        # alice's kubeconfig gets her token from an exec credential plugin; bob's holds his token.
        plugin_dir = tmp_path / "alice-plugin"
        plugin_dir.mkdir()
        (plugin_dir / "token").write_text(tokens["alice"])
        alice_user = exec_user(write_plugin(plugin_dir), plugin_dir)
        alice_config = write_yaml(tmp_path / "alice.kubeconfig", kubeconfig_doc(cluster.url, alice_user, **tls))
        bob_config = write_yaml(
            tmp_path / "bob.kubeconfig", kubeconfig_doc(cluster.url, {"token": tokens["bob"]}, **tls)
        )
        for config in (alice_config, bob_config):  # the context's namespace: where the person works
            document = yaml.safe_load(config.read_text())
            document["contexts"][0]["context"]["namespace"] = ns
            config.write_text(yaml.safe_dump(document))
        _, alice_url = start_ui(alice_config, url, tmp_path / "ui-alice.log", started)
        _, bob_url = start_ui(bob_config, url, tmp_path / "ui-bob.log", started)
        yield {
            "cluster": cluster,
            "kubelet": kubelet,
            "ns": ns,
            "other_ns": other_ns,
            "tokens": tokens,
            "operator": operator,
            "server": url,
            "alice": alice_url,
            "bob": bob_url,
            "alice_config": alice_config,
            "server_process": server,
            "real": real,
        }
    finally:
        for process in reversed(started):
            process.stop()


def shoot(page: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if target := os.environ.get("AGENTRUN_SCREENSHOTS"):
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / path.name)
    return path


def row_of(page: Any, tool: str) -> Any:
    return page.locator("table.calls tr.call", has=page.locator("td.tool", has_text=tool))


def open_steps_until(page: Any, selector: str, text: str) -> Any:
    """Open the run page's steps one by one (each fetched when opened) until one's detail shows ``selector``
    holding ``text``; that step's detail."""
    steps = page.locator("details.step")
    for i in range(steps.count()):
        step = steps.nth(i)
        step.locator("summary").click()
        detail = step.locator(".step-detail")
        detail.wait_for(timeout=10_000)
        if detail.locator(selector, has_text=text).count():
            return detail
    raise AssertionError(f"no step shows {selector} with {text!r}: {page.locator('table.steps').inner_text()}")


def edit_the_pending_tool_call(page: Any, world: dict[str, Any], tmp_path: Path) -> None:
    """A LangChain tool call review (issue 32 item 5): the pending charge_card shown with its arguments, prefilled
    for Edit; invalid JSON is said and nothing is sent; the confirmation shows the edit decision sent; the card is
    charged once, for the edited order."""
    cluster, ns = world["cluster"], world["ns"]
    page.goto(f"{world['alice']}/runs/{ns}/review-run")
    assert "charge_card" in page.locator("ol.review").inner_text()
    assert json.loads(page.locator("#edit-args").input_value()) == {"order_id": "4812"}
    page.fill("#edit-args", "{order_id: 4821}")
    page.locator("button.edit").click()
    page.locator("#answer-error", has_text="the arguments are not JSON").wait_for(timeout=5_000)
    assert page.locator("#act-confirm").is_hidden(), "invalid JSON must not reach the confirmation"
    page.fill("#edit-args", '{"order_id": "4821"}')
    page.locator("button.edit").click()
    confirm = page.locator("#act-confirm")
    confirm.wait_for(state="visible", timeout=5_000)
    assert "Run the tool call with these arguments?" in confirm.inner_text(), confirm.inner_text()
    edit = {"decisions": [{"type": "edit", "edited_action": {"name": "charge_card", "args": {"order_id": "4821"}}}]}
    assert json.loads(confirm.locator("pre.sent").inner_text()) == edit
    shoot(page, tmp_path, "edit-confirm")
    confirm.locator("button.confirm-send").click()
    page.locator("#phase", has_text="Succeeded").wait_for(timeout=60_000)
    assert list((cluster.get("agentruns", "review-run", ns) or {})["spec"]["resume"]["values"].values()) == [edit]
    conn = sqlite3.connect(tmp_path / "review.db")
    try:
        charged = conn.execute("SELECT order_id FROM charges").fetchall()
    finally:
        conn.close()
    assert charged == [("4821",)], f"charge_card must run once, with the edited order: {charged}"


def inspect_the_conversation_graph_and_a_step(page: Any, tmp_path: Path) -> None:
    """The run inspector (issue 32 item 1) on the crashed run's page: its input, the conversation as content
    (roles, the tool calls asked with their arguments, each answer by call id), the graph picture with where
    the run ended, and a step opened: the messages it appended."""
    talk = page.locator("section.conversation")
    assert "charge my saved card for order 4821" in talk.locator("pre.input").inner_text()
    roles = [r.split()[0] for r in talk.locator("li.msg .who").all_inner_texts()]
    assert roles[0] == "user" and {"assistant", "tool"} <= set(roles), roles
    asked = talk.locator("li.role-assistant .call", has_text="charge_card")
    assert asked.count() == 1 and '"order_id"' in asked.inner_text(), talk.inner_text()[:2000]
    answered = talk.locator("li.role-tool", has_text="charge_card")
    assert answered.count() >= 1 and "answer to" in answered.first.inner_text()
    assert "__kind__" not in talk.inner_text() and "ToolMessage" not in talk.inner_text(), "content, not JSON"
    picture = page.locator("svg.graph-picture")
    drawn = picture.locator("g.gnode")
    nodes = [drawn.nth(i).get_attribute("data-node") for i in range(drawn.count())]
    assert {"__start__", "model", "tools", "__end__"} <= set(nodes), nodes
    assert picture.locator("g.gnode.current").count() == 1, "where the run is, marked"
    detail = open_steps_until(page, "li.role-tool", "charge_card")
    assert "Messages appended" in detail.inner_text()
    shoot(page, tmp_path, "inspector")


def test_the_history_view_in_a_real_browser(world: dict[str, Any], dsn: str, tmp_path: Path) -> None:
    cluster, operator = world["cluster"], world["operator"]
    ns, other_ns, tokens = world["ns"], world["other_ns"], world["tokens"]
    # A run SIGKILLed right after charge_card was recorded (the fault point's real SIGKILL, attempt 1 only;
    # send_receipt still running), then rescheduled. Not a kill timed by the test: under CI's load it landed
    # before or after the record.
    crash = agentrun(
        "crash-run",
        thread="crash-run",
        effects=tmp_path / "crash.db",
        env={"SUPPORT_TOOL_DELAY_SEND_RECEIPT": "2.5", "AGENTRUN_FAULT_POINT": "after_ledger_record:charge_card@1"},
        restartPolicy={"maxRestarts": 3, "backoffSeconds": 1},
    )
    apply(cluster, crash, namespace=ns)
    approval = "tests.cluster.graphs:approval"
    apply(cluster, agentrun("approve-run", thread="approve-run", graph=approval, effects=tmp_path / "a.db"), ns)
    hostile = "tests.cluster.history_graphs:hostile"
    apply(cluster, agentrun("hostile-run", thread="hostile-run", graph=hostile, effects=tmp_path / "h.db"), ns)
    apply(cluster, agentrun("other-run", thread="other-run", graph=approval, effects=tmp_path / "o.db"), other_ns)
    apply(cluster, agentrun("stop-run", thread="stop-run", graph=approval, effects=tmp_path / "s.db"), ns)
    # Its first attempt crashes inside its node and no restart is allowed: Failed, for the Retry button.
    flaky = agentrun(
        "retry-run",
        thread="retry-run",
        graph="tests.cluster.crashes_once:app",
        effects=tmp_path / "r.db",
        env={"CLUSTER_CRASH": "node:1"},
        restartPolicy={"maxRestarts": 0, "backoffSeconds": 0},
    )
    apply(cluster, flaky, ns)
    # A LangGraph run SIGKILLed right after charge_card was recorded (the fault point, attempt 1 only).
    lg_crash = agentrun(
        "langgraph-run",
        thread="langgraph-run",
        graph="examples.langgraph_support_agent:app",
        effects=tmp_path / "lg.db",
        env={"AGENTRUN_FAULT_POINT": "after_ledger_record:charge_card@1"},
        restartPolicy={"maxRestarts": 3, "backoffSeconds": 1},
    )
    apply(cluster, lg_crash, ns)
    # A graph whose state is not messages ({name} -> greeting): its result is its final values (issue 32 item 1).
    greeting = "tests.cluster.history_graphs:greeting"
    greet = agentrun("greet-run", thread="greet-run", graph=greeting, effects=tmp_path / "g.db", input={"name": "Ada"})
    apply(cluster, greet, ns)
    # A create_agent graph whose charge_card waits for a review (HumanInTheLoopMiddleware): the customer's typo.
    review = agentrun(
        "review-run",
        thread="review-run",
        graph="examples.langchain_review:app",
        effects=tmp_path / "review.db",
        text="charge my saved card for order 4812",
    )
    apply(cluster, review, ns)
    wait_phase(cluster, operator, "crash-run", "Succeeded", timeout=90, namespace=ns)
    wait_phase(cluster, operator, "approve-run", "Interrupted", timeout=60, namespace=ns)
    wait_phase(cluster, operator, "hostile-run", "Succeeded", timeout=60, namespace=ns)
    wait_phase(cluster, operator, "other-run", "Interrupted", timeout=60, namespace=other_ns)
    wait_phase(cluster, operator, "stop-run", "Interrupted", timeout=60, namespace=ns)
    wait_phase(cluster, operator, "retry-run", "Failed", timeout=60, namespace=ns)
    wait_phase(cluster, operator, "langgraph-run", "Succeeded", timeout=90, namespace=ns)
    wait_phase(cluster, operator, "greet-run", "Succeeded", timeout=60, namespace=ns)
    wait_phase(cluster, operator, "review-run", "Interrupted", timeout=90, namespace=ns)
    greeted = (cluster.get("agentruns", "greet-run", ns) or {})["status"].get("result")
    assert greeted is not None and (greeted["kind"], json.loads(greeted["message"])) == (
        "state",
        {"greeting": "Hello, Ada", "name": "Ada"},
    ), f"status.result of a graph without messages: {greeted}"

    # Without a token, nothing; with bob's, not a run of ns (the API server's own 403).
    server = world["server"]
    history_api = f"{server}/api/v1/namespaces/{ns}/agentruns/crash-run/history"
    assert call(history_api) == 401, "GUARANTEE BROKEN: the history was served without credentials"
    assert call(history_api, tokens["bob"]) == 403, "GUARANTEE BROKEN: bob read a run of a namespace he may not view"
    assert call(history_api, tokens["alice"]) == 200
    assert call(f"{server}/api/v1/namespaces/{ns}/agentruns/hostile-run/history", tokens["bob"]) == 403
    forged = call(f"{server}/runs/{ns}/approve-run/approve", tokens["alice"], "POST")
    assert forged == 403, "an action without the page's X-Agentrun-Action header (a cross-site form) must be refused"

    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))

            # The list: alice's three runs.
            page.goto(f"{world['alice']}/runs?namespace={ns}")
            for name in ("crash-run", "approve-run", "hostile-run"):
                assert page.locator("a.run", has_text=name).count() == 1, f"{name} is missing from the list"
            shoot(page, tmp_path, "list")

            # The crashed and rescheduled run: two attempts, charge_card replayed from the ledger in attempt 2.
            page.locator("a.run", has_text="crash-run").click()
            page.wait_for_selector("table.calls")
            attempts = page.locator("table.attempts tbody tr")
            assert attempts.count() == 2, page.locator("table.attempts").inner_text()
            assert "crash-run-1" in attempts.nth(0).inner_text() and "crash-run-2" in attempts.nth(1).inner_text()
            charge = row_of(page, "charge_card")
            assert charge.count() == 1, page.locator("table.calls").inner_text()
            cells = charge.locator("td")
            assert cells.nth(2).inner_text().strip() == "replayed", charge.inner_text()
            assert cells.nth(3).inner_text().strip() == "1" and cells.nth(4).inner_text().strip() == "2"
            assert "ar-" in cells.nth(8).inner_text(), "the idempotency key is shown"
            shoot(page, tmp_path, "crashed-run")
            inspect_the_conversation_graph_and_a_step(page, tmp_path)

            # A graph without messages: its result (the final state's values) and what its step changed.
            page.goto(f"{world['alice']}/runs/{ns}/greet-run")
            result = page.locator("pre.result-state")
            assert json.loads(result.inner_text()) == {"greeting": "Hello, Ada", "name": "Ada"}
            assert "the final state's values" in page.locator("section.summary h3").inner_text()
            greeted_at = open_steps_until(page, "tr.change-added", "greeting")
            assert "Hello, Ada" in greeted_at.inner_text(), greeted_at.inner_text()
            shoot(page, tmp_path, "state-result")

            # Approve with a JSON value: invalid JSON is said and nothing is sent; a valid value is shown in a
            # confirmation (interrupt, question, value) and sent only on Send; the page follows the run live.
            page.goto(f"{world['alice']}/runs/{ns}/approve-run")
            assert "Interrupted" in page.locator("#phase").inner_text()
            assert "approve a refund of 120?" in page.locator("table.interrupts").inner_text()
            page.evaluate("window.__sameDocument = true")
            page.fill("#answer-value", "{ok: yes}")
            page.locator("button.approve").click()
            page.locator("#answer-error", has_text="not JSON").wait_for(timeout=5_000)
            assert page.locator("#act-confirm").is_hidden(), "invalid JSON must not reach the confirmation"
            page.fill("#answer-value", '{"ok": true, "note": "checked the order"}')
            page.locator("button.approve").click()
            confirm = page.locator("#act-confirm")
            confirm.wait_for(state="visible", timeout=5_000)
            shown = confirm.inner_text()
            interrupt_id = (cluster.get("agentruns", "approve-run", ns) or {})["status"]["interrupt"]["id"]
            assert interrupt_id in shown and "approve a refund of 120?" in shown, shown
            assert json.loads(confirm.locator("pre.sent").inner_text()) == {"ok": True, "note": "checked the order"}
            shoot(page, tmp_path, "approve-confirm")
            confirm.locator("button.confirm-cancel").click()
            assert "resume" not in (cluster.get("agentruns", "approve-run", ns) or {})["spec"], "Cancel sent it"
            page.locator("button.approve").click()
            confirm.locator("button.confirm-send").click()
            # Locators, not wait_for_function: the page's Content-Security-Policy forbids eval.
            page.locator("#phase", has_text="Succeeded").wait_for(timeout=60_000)
            assert page.evaluate("window.__sameDocument") is True, "the page reloaded instead of updating live"
            assert int(page.evaluate("document.body.dataset.updates || '0'")) >= 2, "no live update arrived"
            answered = page.locator("table.interrupts").inner_text()
            assert "checked the order" in answered and "waiting" not in answered, answered
            lines = executions(tmp_path / "a.db")
            decided = [json.loads(li.removeprefix("approve:")) for li in lines if li.startswith("approve:")]
            assert decided == [{"ok": True, "note": "checked the order"}], "the graph got exactly the value sent"
            shoot(page, tmp_path, "approved-run")
            edit_the_pending_tool_call(page, world, tmp_path)

            # Retry a Failed run: a confirmation, then spec.retry as alice's patch; the page follows it live.
            page.goto(f"{world['alice']}/runs/{ns}/retry-run")
            assert "Failed" in page.locator("#phase").inner_text()
            page.locator("button.retry").click()
            confirm.wait_for(state="visible", timeout=5_000)
            assert "spec.retry 0 -> 1" in confirm.inner_text(), confirm.inner_text()
            confirm.locator("button.confirm-send").click()
            page.locator("#phase", has_text="Succeeded").wait_for(timeout=60_000)
            assert page.locator("table.attempts tbody tr").count() == 2, page.locator("table.attempts").inner_text()
            assert (cluster.get("agentruns", "retry-run", ns) or {})["spec"]["retry"] == 1
            shoot(page, tmp_path, "retried-run")

            # The LangGraph run killed after charge_card was recorded: charge_card replayed in attempt 2, with
            # its arguments and the tool's answer as content, as a run of our engine shows it.
            page.goto(f"{world['alice']}/runs/{ns}/langgraph-run")
            page.wait_for_selector("table.calls")
            assert page.locator("table.attempts tbody tr").count() == 2, page.locator("table.attempts").inner_text()
            cells = row_of(page, "charge_card").locator("td")
            shown = [cells.nth(i).inner_text().strip() for i in range(8)]
            assert shown[2:5] == ["replayed", "1", "2"], shown
            assert json.loads(shown[6]) == {"order_id": "4821"}, shown
            # The answer's digest is of the recorded envelope (larger than the text): its preview is the text.
            assert cells.nth(7).locator("pre").text_content() == "charged 4999 cents to visa-4242", shown
            assert "__end__" in page.locator("section.summary").inner_text()
            shoot(page, tmp_path, "langgraph-run")

            # Stop with the button: spec.stop as alice's own patch; the page follows the run to Stopped.
            page.goto(f"{world['alice']}/runs/{ns}/stop-run")
            page.locator("button.stop").click()
            page.locator("#phase", has_text="Stopped").wait_for(timeout=60_000)
            assert page.locator("button.stop").count() == 0, "a stopped run offers no Stop"

            # Hostile and huge tool output: text, never markup; the preview is cut, the size is the whole.
            page.goto(f"{world['alice']}/runs/{ns}/hostile-run")
            fetch = row_of(page, "fetch_page")
            fetch.locator("details").last.locator("summary").click()
            shown = fetch.inner_text()
            assert "<script>window.__pwned = 1</script>" in shown, shown[:500]
            assert "preview cut" in shown and re.search(r"\b3\d{5} B\b", shown), shown[:300]
            assert "<script>" in page.locator("pre.result").inner_text()
            assert page.evaluate("typeof window.__pwned") == "undefined", "GUARANTEE BROKEN: tool output ran as code"
            assert page.locator("table.calls img").count() == 0
            shoot(page, tmp_path, "hostile-run")

            # A deleted run: its history stays in the store, for whoever may list AgentRuns in its namespace. The
            # list (searched by its name) follows the deletion live and shows it marked (issue 32 item 4).
            page.goto(f"{world['alice']}/runs?namespace={ns}&q=hostile")
            listed = page.locator("table.runs tbody tr")
            assert listed.count() == 1 and "Succeeded" in listed.inner_text(), page.locator("main").inner_text()[:999]
            page.evaluate("window.__sameDocument = true")
            deleted = cluster.kubectl("delete", "agentrun", "hostile-run", "-n", ns, "--wait=true")
            assert deleted.returncode == 0, deleted.stderr
            page.locator("table.runs tbody tr.deleted").wait_for(timeout=30_000)
            assert page.evaluate("window.__sameDocument") is True, "the list reloaded instead of updating live"
            assert listed.count() == 1 and "Deleted" in listed.inner_text() and "completed" in listed.inner_text()
            shoot(page, tmp_path, "list-deleted")
            listed.locator("a.run").click()
            page.locator("#phase", has_text="Deleted").wait_for(timeout=10_000)
            assert row_of(page, "fetch_page").count() == 1, "the deleted run's history, from the store"
            assert page.locator("button.act").count() == 0, "a deleted run offers no action"

            # An unknown run.
            missing = page.goto(f"{world['alice']}/runs/{ns}/no-such-run")
            assert missing is not None and missing.status == 404
            assert "does not exist" in page.inner_text("body")

            # bob: view in other_ns only; he may not list ns, so its deleted runs are not his to see either.
            page.goto(f"{world['bob']}/runs?namespace={ns}")
            assert "You may not list AgentRuns" in page.inner_text("main") and page.locator("a.run").count() == 0
            denied = page.goto(f"{world['bob']}/runs/{ns}/crash-run")
            assert denied is not None and denied.status == 403, f"GUARANTEE BROKEN: bob saw a run in {ns}"
            assert "Forbidden" in page.inner_text("body")
            shoot(page, tmp_path, "forbidden")
            allowed = page.goto(f"{world['bob']}/runs/{other_ns}/other-run")
            assert allowed is not None and allowed.status == 200
            page.locator("button.approve").click()
            page.locator("#act-confirm button.confirm-send").click()
            page.locator("#act-result", has_text="refused").wait_for(timeout=20_000)
            assert "forbidden" in page.locator("#act-result").inner_text().lower()

            # A shared install's token login: a pasted token, kept in an HttpOnly cookie, authorizes as bob.
            login = browser.new_page()
            first = login.goto(f"{server}/runs/{other_ns}/other-run")
            assert first is not None and first.status == 401 and login.locator("input[name=token]").count() == 1
            login.fill("input[name=token]", tokens["bob"])
            with login.expect_navigation():
                login.click("form button[type=submit]")
            assert login.url.endswith("/runs"), (login.url, login.inner_text("body")[:500])
            again = login.goto(f"{server}/runs/{other_ns}/other-run")
            assert again is not None and again.status == 200
            assert any(c["name"] == "agentrun_token" and c["httpOnly"] for c in login.context.cookies())
            refused = login.goto(f"{server}/runs/{ns}/crash-run")
            assert refused is not None and refused.status == 403, "the cookie is bob's identity, not the server's"
            assert errors == [], errors
        finally:
            browser.close()
    # bob's approve was his own patch, refused by the API server: the run still waits.
    other = cluster.get("agentruns", "other-run", other_ns) or {}
    assert "resume" not in other.get("spec", {}) and other["status"]["phase"] == "Interrupted"

    # kubectl agentrun history: the same model, as alice (her exec plugin's token; her context's namespace).
    env = user_env(world["alice_config"])
    argv = [KUBECTL, "agentrun", "history", "crash-run", "--server", server]
    shown = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    line = next(li for li in shown.stdout.splitlines() if li.strip().startswith("charge_card"))
    assert "replayed" in line, shown.stdout
    as_json = subprocess.run([*argv, "-o", "json"], capture_output=True, text=True, env=env, timeout=60)
    assert as_json.returncode == 0, as_json.stderr
    found = json.loads(as_json.stdout)
    (charge_call,) = [c for c in found["tool_calls"] if c["name"] == "charge_card"]
    assert charge_call["outcome"] == "replayed" and charge_call["attempt"] == 1 and charge_call["replayed_in"] == [2]
    assert [a["attempt"] for a in found["attempts"]] == [1, 2]
    said = found["conversation"]["messages"]
    assert said[0]["role"] == "user" and any(c["name"] == "charge_card" for m in said for c in m["tool_calls"])
    assert "Conversation (" in shown.stdout and "-> charge_card(" in shown.stdout, shown.stdout
    greeted_json = subprocess.run(
        [KUBECTL, "agentrun", "history", "greet-run", "--server", server, "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert greeted_json.returncode == 0, greeted_json.stderr
    greeted_found = json.loads(greeted_json.stdout)
    assert greeted_found["result_kind"] == "state" and "Hello, Ada" in greeted_found["result"]["preview"]
    # No --server and no history Service to port-forward to: one line that says what to do.
    lost = subprocess.run(
        [KUBECTL, "agentrun", "history", "crash-run"], capture_output=True, text=True, env=env, timeout=60
    )
    assert lost.returncode == 1 and "--server URL" in lost.stderr and "Traceback" not in lost.stderr, lost.stderr
    server_log = world["server_process"].log()
    assert "Traceback" not in server_log, server_log[-3000:]
