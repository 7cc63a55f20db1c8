"""The real history server process for the cluster tests, read as alice (who may view AgentRuns in ``default``).

Shared by the tests that check what people see of a run on the history pages (test_honest_outcomes.py,
test_langgraph_runs.py). ``BIN``: the virtualenv's scripts, where the real kubectl finds the plugin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentrun_dev.servers import free_port
from kubesim import EmulatedCluster
from tests.cluster.history_people import people

ROOT = Path(__file__).resolve().parents[2]
NS = "default"
BIN = Path(sys.executable).parent


class History:
    """The history server process, read as alice (who may view AgentRuns in ``default``)."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    def get(self, path: str) -> str:
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=20) as response:
            return str(response.read().decode())

    def history(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.get(f"/api/v1/namespaces/{NS}/agentruns/{name}/history"))
        return found


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=5) as response:
            return int(response.status) == 200
    except OSError:
        return False


@contextmanager
def history_server(cluster: EmulatedCluster, dsn: str, tmp_path: Path) -> Iterator[History]:
    tokens = people(cluster, NS, [("alice", NS, "agentrun-view")])
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "AGENTRUN_"))}
    env.update(
        KUBECONFIG=str(cluster.kubeconfig),
        PYTHONPATH=str(ROOT),
        AGENTRUN_HISTORY_POSTGRES_DSN=dsn,
        AGENTRUN_HISTORY_HOST="127.0.0.1",
        AGENTRUN_HISTORY_PORT=str(port),
    )
    log = tmp_path / "history.log"
    with log.open("w") as out:
        server = subprocess.Popen([sys.executable, "-m", "agentrun_history"], env=env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        cluster.wait_for(lambda: healthy(url), timeout=30, message="the history server answers")
        yield History(url, tokens["alice"])
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
