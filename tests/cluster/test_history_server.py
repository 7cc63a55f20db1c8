"""The history server's actions and errors against the API server's own answers (RBAC, JSON patch tests).

No operator and no pods: the AgentRuns' status is written by the test (as the operator would, through the
status subresource), so a run can be moved from one question to the next at an exact moment. The server
runs in this process (``make_app``, served on 127.0.0.1) so that one of its requests can be preceded by such
a move: ``MovingKube`` runs a step just before the server's patch leaves, the interleaving a person meets
when the run moves on while they read its page. Everything else is the real server code over real HTTP,
the API server's real authorization (alice may view and edit AgentRuns, bob may only view them) and a
real PostgreSQL store (or, for the outage, none).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from aiohttp import web

from agentrun_dev.servers import free_port
from agentrun_history.kube import UserKube, run_path
from agentrun_history.server import make_app
from agentrun_history.store import HistoryStore, ProgressHub
from tests.cluster.history_people import people

pytestmark = [pytest.mark.cluster, pytest.mark.real_server, pytest.mark.timeout(240)]

NS = "default"
MERGE = "application/merge-patch+json"
DEAD_STORE = "postgresql://nobody@127.0.0.1:9/none"


class MovingKube(UserKube):
    """The API server as the history server reaches it, with ``before_patch`` run once just before a patch."""

    before_patch: Callable[[], None] | None = None

    async def json_patch(self, token: str, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        step, self.before_patch = self.before_patch, None
        if step is not None:
            await asyncio.to_thread(step)
        return await super().json_patch(token, namespace, name, ops)


@contextmanager
def serving(kube: UserKube, dsn: str) -> Iterator[str]:
    """The history server's app for ``kube`` and the store ``dsn`` on 127.0.0.1, in a thread; yields its URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(make_app(kube=kube, store=HistoryStore(dsn), hub=ProgressHub(dsn)))
    port = free_port()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, name="history-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def call(
    url: str, token: str, method: str = "GET", body: Any = None, *, raw: bytes | None = None
) -> tuple[int, dict[str, str], str]:
    """One request as ``token`` (a POST as the page's buttons send it; ``raw``: a body sent as is)."""
    headers = {"Authorization": f"Bearer {token}"}
    data = raw
    if method == "POST":
        headers["X-Agentrun-Action"] = "1"
    if body is not None or raw is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode() if raw is None else raw
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, dict(e.headers), e.read().decode()


def create_run(cluster: Any, name: str, **spec: Any) -> None:
    manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"graph": "tests.cluster.graphs:approval", "threadId": name, **spec},
    }
    made = cluster.api("POST", run_path(NS), manifest)
    assert made.status == 201, made.body


def set_status(cluster: Any, name: str, **status: Any) -> None:
    """Write the run's status as the operator does (the status subresource)."""
    done = cluster.api("PATCH", run_path(NS, name) + "/status", {"status": status}, content_type=MERGE)
    assert done.status == 200, done.body


def ask(cluster: Any, name: str, interrupt_id: str, question: str, amount: str) -> None:
    interrupt = {"id": interrupt_id, "ids": [interrupt_id], "message": question, "payload": {"amount": amount}}
    set_status(cluster, name, phase="Interrupted", interrupt=interrupt)


def shown(page: str) -> dict[str, str]:
    """The question the page's Approve button answers: its interrupt id and digest."""
    found = re.search(r'class="act approve"[^>]*data-interrupt="([^"]*)" data-digest="([^"]*)"', page)
    assert found, page[:3000]
    return {"interrupt": found.group(1), "digest": found.group(2)}


def retry_shown(page: str) -> dict[str, int]:
    """The failure the page's Retry button re-opens: the spec.retry it shows."""
    found = re.search(r'class="act retry"[^>]*data-retry="(\d+)"', page)
    assert found, page[:3000]
    return {"retry": int(found.group(1))}


def patch_spec(cluster: Any, name: str, **spec: Any) -> None:
    """Another person's change of the run's spec (the cluster's admin)."""
    done = cluster.api("PATCH", run_path(NS, name), {"spec": spec}, content_type=MERGE)
    assert done.status == 200, done.body


def retry_of(cluster: Any, name: str) -> Any:
    return (cluster.get("agentruns", name, NS) or {}).get("spec", {}).get("retry")


def resume_of(cluster: Any, name: str) -> Any:
    return (cluster.get("agentruns", name, NS) or {}).get("spec", {}).get("resume")


@pytest.fixture
def kube(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> MovingKube:
    """The server's way to the API server: the cluster's address and CA from its kubeconfig, no identity."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return MovingKube.from_environment()


def test_an_answer_applies_only_to_the_question_the_person_saw(cluster: Any, kube: MovingKube, dsn: str) -> None:
    tokens = people(
        cluster, NS, [("alice", NS, "agentrun-view"), ("alice", NS, "agentrun-edit"), ("bob", NS, "agentrun-view")]
    )
    alice, bob = tokens["alice"], tokens["bob"]
    create_run(cluster, "refund")
    ask(cluster, "refund", "r-1", "refund $1?", "1.00")
    with serving(kube, dsn) as server:
        page_url, approve = f"{server}/runs/{NS}/refund", f"{server}/runs/{NS}/refund/approve"
        status, _, page = call(page_url, alice)
        assert status == 200, page[:2000]
        saw_r1 = shown(page)
        assert saw_r1["interrupt"] == "r-1" and "refund $1?" in page

        # The run moves on while alice reads: her approve of r-1 must not answer r-2.
        ask(cluster, "refund", "r-2", "refund $1,000,000?", "1000000.00")
        status, _, body = call(approve, alice, "POST", saw_r1)
        refused = json.loads(body)
        assert status == 409, f"GUARANTEE BROKEN: an answer to r-1 was applied to r-2: {status} {body}"
        assert refused["interrupt"]["ids"] == ["r-2"] and refused["interrupt"]["message"] == "refund $1,000,000?"
        assert "refund $1,000,000?" in refused["message"], refused
        assert resume_of(cluster, "refund") is None

        # It moves on again between the server's read and its patch: the API server's test of the object the
        # server checked refuses the patch, and the person is told the question now waiting.
        status, _, page = call(page_url, alice)
        saw_r2 = shown(page)
        kube.before_patch = lambda: ask(cluster, "refund", "r-3", "refund $5,000,000?", "5000000.00")
        status, _, body = call(approve, alice, "POST", saw_r2)
        refused = json.loads(body)
        assert status == 409, f"GUARANTEE BROKEN: a patch made after the run moved on went through: {body}"
        assert refused["interrupt"]["ids"] == ["r-3"], refused
        assert resume_of(cluster, "refund") is None, "GUARANTEE BROKEN: r-3 got the answer meant for r-2"

        # A status change that leaves the question as it was is no reason to refuse: the answer goes through.
        interrupt = refused["interrupt"]
        kube.before_patch = lambda: set_status(cluster, "refund", message="still waiting")
        status, _, body = call(approve, bob, "POST", {"interrupt": "r-3", "digest": interrupt["digest"]})
        assert status == 403, f"bob may only view: the API server's answer to his own patch: {status} {body}"
        kube.before_patch = lambda: set_status(cluster, "refund", message="still waiting, still r-3")
        status, _, body = call(approve, alice, "POST", {"interrupt": "r-3", "digest": interrupt["digest"]})
        assert status == 200 and "r-3" in json.loads(body)["message"], body
        assert resume_of(cluster, "refund") == {"values": {"r-3": True}}

        # The same id with another payload (the digest differs) is another question.
        ask(cluster, "refund", "r-3", "refund $5,000,000?", "9000000.00")
        status, _, body = call(
            f"{server}/runs/{NS}/refund/reject", alice, "POST", {"interrupt": "r-3", "digest": interrupt["digest"]}
        )
        assert status == 409 and json.loads(body)["interrupt"]["payload"] == {"amount": "9000000.00"}, body
        assert resume_of(cluster, "refund") == {"values": {"r-3": True}}


def test_an_answer_carries_the_json_value_the_person_sent_and_a_body_that_is_not_json_is_a_400(
    cluster: Any, kube: MovingKube, dsn: str
) -> None:
    alice = people(cluster, NS, [("alice", NS, "agentrun-view"), ("alice", NS, "agentrun-edit")])["alice"]
    create_run(cluster, "valued")
    ask(cluster, "valued", "v-1", "refund how much?", "120.00")
    with serving(kube, dsn) as server:
        page_url, approve = f"{server}/runs/{NS}/valued", f"{server}/runs/{NS}/valued/approve"
        saw = shown(call(page_url, alice)[2])
        # (A body nested deeper than the parser goes: integration/test_history_server.py, in a server process of
        # its own; this process runs kubesim, which raises the recursion limit.)
        for raw, says in (
            (b'{"interrupt": "v-1", "value": {amount: 10}}', "the request body is not JSON (Expecting property name"),
            (b"[1, 2]", "the request body is JSON but not an object"),
        ):
            status, _, body = call(approve, alice, "POST", raw=raw)
            assert status == 400, (status, body)
            refused = json.loads(body)["message"]
            assert says in refused and '"value": ANY JSON VALUE' in refused, refused
        assert resume_of(cluster, "valued") is None, "a refused answer must not reach the run"

        value = {"amount_cents": 2000, "note": "partial refund, \u2713 checked", "items": [1, 2]}
        status, _, body = call(approve, alice, "POST", {**saw, "value": value})
        assert status == 200, body
        assert json.loads(body)["values"] == {"v-1": value} and '"amount_cents": 2000' in json.loads(body)["message"]
        assert resume_of(cluster, "valued") == {"values": {"v-1": value}}, "the run must get exactly the value sent"

        # A reject with a value sends that value; without one, false (and approve, true: the first test).
        ask(cluster, "valued", "v-2", "and the shipping?", "4.99")
        saw = shown(call(page_url, alice)[2])
        status, _, body = call(f"{server}/runs/{NS}/valued/reject", alice, "POST", {**saw, "value": "too late"})
        assert status == 200 and resume_of(cluster, "valued") == {"values": {"v-2": "too late"}}, body
        ask(cluster, "valued", "v-3", "gift wrap?", "0")
        saw = shown(call(page_url, alice)[2])
        status, _, body = call(f"{server}/runs/{NS}/valued/reject", alice, "POST", saw)
        assert status == 200 and resume_of(cluster, "valued") == {"values": {"v-3": False}}, body


def test_a_retry_reopens_only_the_failure_the_person_saw_as_their_own_patch(
    cluster: Any, kube: MovingKube, dsn: str
) -> None:
    tokens = people(
        cluster, NS, [("alice", NS, "agentrun-view"), ("alice", NS, "agentrun-edit"), ("bob", NS, "agentrun-view")]
    )
    alice, bob = tokens["alice"], tokens["bob"]
    create_run(cluster, "flaky")
    set_status(cluster, "flaky", phase="Failed", reason="BackoffLimitExceeded")
    with serving(kube, dsn) as server:
        page_url, retry = f"{server}/runs/{NS}/flaky", f"{server}/runs/{NS}/flaky/retry"
        saw = retry_shown(call(page_url, alice)[2])
        assert saw == {"retry": 0}
        status, _, body = call(retry, bob, "POST", saw)
        assert status == 403, f"GUARANTEE BROKEN: bob may only view, the API server must refuse him: {status} {body}"
        status, _, body = call(retry, alice, "POST")
        assert status == 400 and '{"retry": N}' in json.loads(body)["message"], body
        assert retry_of(cluster, "flaky") == 0, "the CRD's default: nothing patched"

        # Someone retried it while alice read the page: hers is not a second retry.
        patch_spec(cluster, "flaky", retry=1)
        status, _, body = call(retry, alice, "POST", saw)
        refused = json.loads(body)
        assert status == 409 and "was retried since you saw it" in refused["message"], body
        assert (refused["retry"], refused["phase"]) == (1, "Failed") and retry_of(cluster, "flaky") == 1

        # It was re-opened and failed again; it is retried again between the server's read and its patch.
        set_status(cluster, "flaky", observedRetry=1)
        saw = retry_shown(call(page_url, alice)[2])
        assert saw == {"retry": 1}
        kube.before_patch = lambda: patch_spec(cluster, "flaky", retry=2)
        status, _, body = call(retry, alice, "POST", saw)
        assert status == 409 and json.loads(body)["retry"] == 2, body
        assert retry_of(cluster, "flaky") == 2, "GUARANTEE BROKEN: the run was retried twice for one failure"

        # A status change that leaves the failure as it was is no reason to refuse.
        set_status(cluster, "flaky", observedRetry=2)
        saw = retry_shown(call(page_url, alice)[2])
        kube.before_patch = lambda: set_status(cluster, "flaky", message="still failed")
        status, _, body = call(retry, alice, "POST", saw)
        assert status == 200 and json.loads(body)["retry"] == 3, body
        assert retry_of(cluster, "flaky") == 3
        status, _, body = call(retry, alice, "POST", {"retry": 3})
        assert status == 409 and "already requested" in json.loads(body)["message"], body
        page = call(page_url, alice)[2]
        assert 'class="act retry"' not in page and "Retry 3 requested" in page

        # Only a Failed run: a stop is one-way (the CRD refuses the patch too), a running run has not failed.
        create_run(cluster, "halted", stop=True)
        set_status(cluster, "halted", phase="Stopped", reason="Stopped")
        status, _, body = call(f"{server}/runs/{NS}/halted/retry", alice, "POST", {"retry": 0})
        assert status == 409 and "spec.stop is one-way" in json.loads(body)["message"], body
        set_status(cluster, "flaky", phase="Running", observedRetry=3)
        status, _, body = call(retry, alice, "POST", {"retry": 3})
        assert status == 409 and "has not failed (phase Running)" in json.loads(body)["message"], body
        assert retry_of(cluster, "halted") == 0 and retry_of(cluster, "flaky") == 3


def test_a_viewers_stop_is_the_api_servers_answer_even_on_a_run_already_stopping(
    cluster: Any, kube: MovingKube, dsn: str
) -> None:
    tokens = people(
        cluster, NS, [("alice", NS, "agentrun-view"), ("alice", NS, "agentrun-edit"), ("bob", NS, "agentrun-view")]
    )
    create_run(cluster, "stopping", stop=True)
    set_status(cluster, "stopping", phase="Stopping")
    with serving(kube, dsn) as server:
        stop = f"{server}/runs/{NS}/stopping/stop"
        status, _, body = call(stop, tokens["bob"], "POST")
        assert status == 403, f"GUARANTEE BROKEN: a viewer was told {status} {body} without the API server asked"
        status, _, body = call(stop, tokens["alice"], "POST")
        assert status == 200 and "stop requested" in body, body
        # The live view's stream carries the same headers as every page.
        request = urllib.request.Request(
            f"{server}/runs/{NS}/stopping/events", headers={"Authorization": f"Bearer {tokens['alice']}"}
        )
        with urllib.request.urlopen(request, timeout=20) as stream:
            assert stream.headers["Content-Type"].startswith("text/event-stream")
            assert stream.headers["X-Content-Type-Options"] == "nosniff", dict(stream.headers)
            assert "default-src 'self'" in stream.headers["Content-Security-Policy"]


def test_a_store_that_cannot_be_read_is_a_503_and_its_address_stays_in_the_log(
    cluster: Any, kube: MovingKube, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = people(cluster, NS, [("alice", NS, "agentrun-view")])
    create_run(cluster, "shown")
    caplog.set_level(logging.WARNING, logger="agentrun.history")
    with serving(kube, DEAD_STORE) as server:
        for path in (f"/api/v1/namespaces/{NS}/agentruns/shown/history", f"/runs/{NS}/shown"):
            status, _, body = call(server + path, tokens["alice"])
            assert status == 503 and "could not be read from the store" in body, (path, status, body)
            assert "127.0.0.1" not in body and ":9" not in body, f"GUARANTEE BROKEN: the store's address shown: {body}"
        # A run that does not exist (deleted, or never made): only the store knows which, and it cannot be asked.
        status, _, body = call(f"{server}/api/v1/namespaces/{NS}/agentruns/deleted-run/history", tokens["alice"])
        assert status == 503, f"a guess ('does not exist') while the store is down: {status} {body}"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "127.0.0.1" in logged and "shown" in logged and "deleted-run" in logged, logged
