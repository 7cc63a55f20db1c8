"""``kubectl agentrun history`` on a run whose tool results hold what once hid a history (issue 31 items 1, 2).

A real graph writes, on the real store, a tool result holding a NUL and one nested deeper than any reader's
``json.loads`` goes (a graph may raise its recursion limit); the AgentRun exists on the API server (no
operator: the store already holds its thread). The real history server process reads it for alice (who may
view AgentRuns) and the real ``kubectl agentrun history`` prints it, as a table and as JSON: every call is
shown, the NUL as the text ``\\u0000``, the deep value as a cut preview, and nothing fails on the way.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun import ToolCall, assistant, tool
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun.models import ScriptedModel
from agentrun_dev.servers import free_port
from agentrun_history.kube import run_path
from kubesim import KUBECTL, EmulatedCluster
from tests.cluster.history_people import people
from tests.unit.helpers import tool_graph

pytestmark = [pytest.mark.cluster, pytest.mark.real_server, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NS = "default"
NAME = "odd-values"
DEEP = 2000  # levels: deeper than json.loads goes on any stack of the server (the issue met 980)


def write_run(dsn: str, run_uid: str) -> None:
    """The run, on a thread of its own whose recursion limit the graph raised (the limit is the process's)."""
    deep: Any = "leaf"
    for _ in range(DEEP):
        deep = {"a": deep}

    @tool
    async def fetch_page(url: str) -> str:
        return f"page {url}:\x00hidden after a NUL"

    @tool
    async def nested() -> Any:
        return deep

    calls = [ToolCall(id="c1", name="fetch_page", arguments='{"url": "a"}'), ToolCall(id="c2", name="nested")]
    model = ScriptedModel.replies([assistant(tool_calls=calls), assistant("done\x00")])

    async def run() -> None:
        store = PgCheckpointer(dsn)
        try:
            config = {"thread_id": f"{NS}/{NAME}", "attempt": 1, "run_uid": run_uid}
            await tool_graph([fetch_page, nested], model).compile(store).ainvoke("go\x00", config)
        finally:
            await store.aclose()

    def write() -> None:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(10 * DEEP)
        try:
            asyncio.run(run())
        finally:
            sys.setrecursionlimit(limit)

    writer = threading.Thread(target=write)
    writer.start()
    writer.join(120)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=5) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def test_kubectl_agentrun_history_shows_a_run_whose_results_hold_a_nul_and_a_deep_value(
    cluster: Any, dsn: str, tmp_path: Path
) -> None:
    manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"graph": "tests.cluster.graphs:approval", "threadId": NAME},
    }
    made = cluster.api("POST", run_path(NS), manifest)
    assert made.status == 201, made.body
    uid = (cluster.get("agentruns", NAME, NS) or {})["metadata"]["uid"]
    write_run(dsn, uid)
    tokens = people(cluster, NS, [("alice", NS, "agentrun-view")])
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
    server_env = {
        **env,
        "KUBECONFIG": str(cluster.kubeconfig),
        "PYTHONPATH": str(ROOT),
        "AGENTRUN_HISTORY_POSTGRES_DSN": dsn,
        "AGENTRUN_HISTORY_HOST": "127.0.0.1",
        "AGENTRUN_HISTORY_PORT": str(port),
    }
    log = tmp_path / "history.log"
    with log.open("w") as out:
        server = subprocess.Popen([sys.executable, "-m", "agentrun_history"], env=server_env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        cluster.wait_for(lambda: healthy(url), timeout=30, message="the history server answers")
        tls = {} if isinstance(cluster, EmulatedCluster) else {"certificate-authority": str(cluster.plane.ca.pair.cert)}
        config = tmp_path / "alice.kubeconfig"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": cluster.url, **tls}}],
                    "users": [{"name": "alice", "user": {"token": tokens["alice"]}}],
                    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "alice", "namespace": NS}}],
                    "current-context": "c",
                }
            )
        )
        user_env = {**env, "KUBECONFIG": str(config), "PYTHONPATH": str(ROOT)}
        user_env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "/usr/bin:/bin")])
        argv = [KUBECTL, "agentrun", "history", NAME, "--server", url]
        table = subprocess.run(argv, capture_output=True, text=True, env=user_env, timeout=60)
        assert table.returncode == 0, f"GUARANTEE BROKEN: kubectl agentrun history failed:\n{table.stderr}"
        assert "fetch_page" in table.stdout and "nested" in table.stdout, table.stdout
        as_json = subprocess.run([*argv, "-o", "json"], capture_output=True, text=True, env=user_env, timeout=60)
        assert as_json.returncode == 0, as_json.stderr
    finally:
        server.terminate()
        server.wait(timeout=10)
    found = json.loads(as_json.stdout)
    fetch, nested = found["tool_calls"]
    assert (fetch["outcome"], fetch["result"]["preview"]) == ("executed", "page a:\\u0000hidden after a NUL")
    assert nested["outcome"] == "executed" and nested["result"]["preview"].startswith('{"a": {"a": ')
    assert nested["result"]["truncated"] and found["result"]["preview"] == "done\\u0000"
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
