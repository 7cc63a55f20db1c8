"""The history server's own rules, before it asks the API server anything (``python -m agentrun_history``).

The server runs as a process with a kubeconfig whose API server is a closed port: a request that reached
for the API server would be a 502 ("did not answer"), so each answer below is the server's own. What the
API server decides (who may see and change a run, answers to a question that changed) is proved on both
API servers in ``tests/cluster/test_history_server.py``.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_dev.servers import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "someone-s-token"


class Server:
    """A running history server: its port, and requests to it from ``source`` (an address of this machine)."""

    def __init__(self, port: int, log: Path) -> None:
        self.port, self.log = port, log

    def call(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        body: str | None = None,
        via: str = "127.0.0.1",
    ) -> tuple[int, dict[str, str], str]:
        """One request to the server at address ``via`` (the connection comes from that address too)."""
        connection = http.client.HTTPConnection(via, self.port, timeout=10)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read().decode()
        finally:
            connection.close()


@contextmanager
def history_server(tmp_path: Path, host: str = "127.0.0.1", **settings: str) -> Iterator[Server]:
    """``python -m agentrun_history`` with ``AGENTRUN_HISTORY_<settings>``; its API server is a closed port."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
    env.update(
        KUBECONFIG=str(kubeconfig),
        PYTHONPATH=str(ROOT),
        AGENTRUN_HISTORY_POSTGRES_DSN="postgresql://nobody@127.0.0.1:9/none",  # no request here reads the store
        AGENTRUN_HISTORY_HOST=host,
        AGENTRUN_HISTORY_PORT=str(port),
        **{f"AGENTRUN_HISTORY_{key.upper()}": value for key, value in settings.items()},
    )
    log = tmp_path / f"history-{port}.log"
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "agentrun_history"], env=env, stdout=out, stderr=out)
    server = Server(port, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if server.call("GET", "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert "Traceback" not in log.read_text(), log.read_text()


def non_loopback_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (a connection to it comes from it), or ``None``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # a UDP "connect" only picks the route and source: nothing is sent
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if ipaddress.ip_address(address).is_loopback else address


def answer(status: int, body: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(body)
    assert found["status"] == status, found
    return found


BEARER = {"Authorization": f"Bearer {TOKEN}"}
ACTION = {**BEARER, "X-Agentrun-Action": "1"}


def test_a_dot_or_any_name_the_api_server_would_refuse_is_a_400_before_any_request(tmp_path: Path) -> None:
    with history_server(tmp_path) as server:
        for path in (
            "/api/v1/namespaces/a/agentruns/%2e/history",
            "/api/v1/namespaces/a/agentruns/%2e%2e/history",
            "/api/v1/namespaces/a/agentruns/..%2F..%2Fapi/history",
            "/api/v1/namespaces/a/agentruns/A.b/history",
            "/api/v1/namespaces/%2e%2e/agentruns/x/history",
            "/api/v1/namespaces/a.b/agentruns/x/history",  # a namespace is a label: no dot at all
            "/api/v1/namespaces/%2E/agentruns",
        ):
            status, _, body = server.call("GET", path, headers=BEARER)
            found = answer(400, body)
            assert status == 400 and "DNS-1123" in found["message"], (path, status, body)
        status, _, body = server.call("GET", "/api/v1/namespaces/a/agentruns/%2e/history", headers=BEARER)
        assert '"." is not an AgentRun name' in answer(400, body)["message"]
        for path in (
            "/runs/%2e%2e/x",
            "/runs/a/%2e",
            "/runs?namespace=..",
            "/runs/a/%2e/timeline",
            "/runs/a/../events",
        ):
            status, headers, body = server.call("GET", path, headers=BEARER)
            assert status == 400 and "DNS-1123" in body and "text/html" in headers["Content-Type"], (path, body)
        status, _, body = server.call("POST", "/runs/a/%2e%2e/stop", headers=ACTION)
        assert status == 400 and "DNS-1123" in answer(400, body)["message"], body
        # A valid name reaches for the API server, here a closed port: the answer above was the server's own.
        status, _, body = server.call("GET", "/api/v1/namespaces/a/agentruns/x.y-1/history", headers=BEARER)
        assert status == 502 and "did not answer" in answer(502, body)["message"], body


def test_a_step_that_is_not_a_state_version_is_a_400_before_any_request(tmp_path: Path) -> None:
    """The run inspector's step detail (issue 32 item 1): ``/steps/<version>``, a positive integer."""
    with history_server(tmp_path) as server:
        for version in ("abc", "0", "-1", "1.5", "9" * 30):
            status, _, body = server.call("GET", f"/api/v1/namespaces/a/agentruns/x/steps/{version}", headers=BEARER)
            assert status == 400 and "a positive integer" in answer(400, body)["message"], (version, body)
            status, headers, body = server.call("GET", f"/runs/a/x/steps/{version}?fragment=1", headers=BEARER)
            assert status == 400 and "text/html" in headers["Content-Type"], (version, body)
        status, _, body = server.call("GET", "/runs/a/%2e/steps/3", headers=BEARER)
        assert status == 400 and "DNS-1123" in body, body
        # A valid step of a valid name reaches for the API server (a closed port here): the run is read first.
        status, _, body = server.call("GET", "/api/v1/namespaces/a/agentruns/x/steps/3", headers=BEARER)
        assert status == 502 and "did not answer" in answer(502, body)["message"], body


def test_an_answer_must_name_the_question_it_answers(tmp_path: Path) -> None:
    with history_server(tmp_path) as server:
        shape = '{"interrupt": ID, "digest": SHA256, "value": ANY JSON VALUE}'
        for body in (None, "{}", '{"interrupt": "r-1"}', "not json", '["r-1"]', '{"value": [[[[[}'):
            status, _, text = server.call("POST", "/runs/a/x/approve", headers=ACTION, body=body)
            assert status == 400 and shape in answer(400, text)["message"], text
        said = answer(400, server.call("POST", "/runs/a/x/approve", headers=ACTION, body="not json")[2])["message"]
        assert said.startswith("the request body is not JSON (Expecting value at character 0)"), said
        nested = '{"value": ' + "[" * 20000 + "]" * 20000 + "}"  # deeper than the parser goes, within 64 KiB
        status, _, text = server.call("POST", "/runs/a/x/approve", headers=ACTION, body=nested)
        assert status == 400 and "nested too deeply" in answer(400, text)["message"], text
        # A retry names the failure it re-opens: the spec.retry the page showed, a non-negative integer.
        for body in (None, "{}", '{"retry": -1}', '{"retry": "1"}', '{"retry": true}', '{"retry": 1.5}'):
            status, _, text = server.call("POST", "/runs/a/x/retry", headers=ACTION, body=body)
            assert status == 400 and '{"retry": N}' in answer(400, text)["message"], (body, text)
        status, _, text = server.call("POST", "/runs/a/x/reject", headers=BEARER, body='{"interrupt": "r"}')
        assert status == 403, "the action header comes first"
        status, _, text = server.call("POST", "/runs/a/x/approve", headers={"X-Agentrun-Action": "1"})
        assert status == 401, "no credentials: 401 before anything about the body"


def test_router_404_and_405_and_refusals_carry_the_security_headers(tmp_path: Path) -> None:
    with history_server(tmp_path) as server:
        for method, path, status in (
            ("GET", "/no/such/page", 404),
            ("GET", "/api/v1/nothing", 404),
            ("GET", "/logout", 405),
            ("DELETE", "/runs", 405),
            ("GET", "/runs", 401),
        ):
            got, headers, body = server.call(method, path)
            assert got == status, (method, path, got, body)
            assert headers.get("X-Content-Type-Options") == "nosniff", (method, path, headers)
            assert "default-src 'self'" in headers.get("Content-Security-Policy", ""), (method, path, headers)
            if status == 405:
                assert "POST" in headers["Allow"] or "GET" in headers["Allow"], headers
        got, headers, body = server.call("GET", "/api/v1/nothing")
        assert "application/json" in headers["Content-Type"] and answer(404, body)["reason"] == "Not Found"


def test_sign_out_from_a_page_of_another_origin_is_refused(tmp_path: Path) -> None:
    with history_server(tmp_path, TOKEN_LOGIN="true") as server:
        cookie = {"Cookie": f"agentrun_token={TOKEN}"}
        status, headers, body = server.call("POST", "/logout", headers={**cookie, "Origin": "https://evil.example"})
        assert status == 403 and "cross-origin sign-out refused" in body, (status, body)
        assert "Set-Cookie" not in headers, "GUARANTEE BROKEN: another site signed the person out"
        own = f"http://127.0.0.1:{server.port}"
        status, headers, _ = server.call("POST", "/logout", headers={**cookie, "Origin": own})
        assert status == 303 and 'agentrun_token=""' in headers["Set-Cookie"], headers


def sign_in(server: Server, via: str) -> tuple[int, dict[str, str], str]:
    form = {"Content-Type": "application/x-www-form-urlencoded", "Origin": f"http://{via}:{server.port}"}
    return server.call("POST", "/login", headers=form, body=f"token={TOKEN}", via=via)


def test_the_sign_in_cookie_is_secure_behind_tls_and_plain_http_sign_in_needs_loopback(tmp_path: Path) -> None:
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to sign in from")
    with history_server(tmp_path, host="0.0.0.0", TOKEN_LOGIN="true") as server:
        status, headers, _ = sign_in(server, "127.0.0.1")  # kubectl port-forward arrives on loopback
        assert status == 303 and "HttpOnly" in headers["Set-Cookie"] and "Secure" not in headers["Set-Cookie"]
        status, headers, body = sign_in(server, address)
        assert status == 403 and "Set-Cookie" not in headers, "GUARANTEE BROKEN: a token signed in over plain HTTP"
        assert "token sign-in over plain HTTP" in body and "history.tokenLogin.allowPlainHttp" in body, body
        status, _, page = server.call("GET", "/login", via=address)
        assert status == 403 and "name=token" not in page, "the form must not invite a token it would refuse"
        status, _, page = server.call("GET", "/runs", via=address)
        assert status == 401 and "name=token" not in page and "plain HTTP" in page, page
    with history_server(tmp_path, host="0.0.0.0", TOKEN_LOGIN="true", TLS_IN_FRONT="true") as server:
        for via in ("127.0.0.1", address):  # the ingress's hop to the pod is plain HTTP from its address
            status, headers, _ = sign_in(server, via)
            assert status == 303, (via, status)
            cookie = headers["Set-Cookie"]
            assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie, cookie
    with history_server(tmp_path, host="0.0.0.0", TOKEN_LOGIN="true", ALLOW_PLAIN_HTTP_LOGIN="true") as server:
        status, headers, _ = sign_in(server, address)
        assert status == 303 and "Secure" not in headers["Set-Cookie"], headers
