"""A real Prometheus scrapes the real operator (and a long runner) through a crash, a replay, a stop and an interrupt.

Debian's ``prometheus`` binary (installed by ``.ci/run`` / ``make test`` via
scripts/prometheus.sh, never run as a service) is started here with a
temporary config and data directory on a free loopback port, scraping every
second: the operator's ``/metrics`` and the runners' port (every runner pod
is told the same port; on this one host only the first live runner binds it,
which is the long run that is stopped last -- the "long runner" a PodMonitor
would scrape; the job adds ``namespace`` as the PodMonitor does).

Then every query of every panel of the chart's dashboard must return data
through Prometheus's HTTP API (``/api/v1/query``), and the numbers must be
what happened: one crash rescheduled (``reason="BackOff"``), one resume, tool
calls replayed from the ledger, one stop, runs by final phase, and the tokens
of a short run that called an OpenAI-compatible endpoint (served here) counted
by the operator from the checkpoint, though that run's pod was never scraped.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_dev.databases import create_database, drop_database
from agentrun_dev.servers import free_port
from kubesim import EmulatedCluster, KubeletThread
from tests.cluster.operator_harness import (
    OperatorProcess,
    agentrun,
    apply,
    start_operator,
    store_secret,
    wait_node,
    wait_phase,
)

pytestmark = pytest.mark.timeout(120)

PROMETHEUS = "/usr/bin/prometheus"
DASHBOARD = Path(__file__).resolve().parents[2] / "helm" / "agentrun" / "dashboards" / "agentrun.json"
NAMESPACE = "default"


class Prometheus:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as response:
            answer = json.loads(response.read())
        assert answer["status"] == "success", f"{expr}: {answer}"
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "1"}
        url = f"http://127.0.0.1:{self.port}/api/v1/query_range?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as response:
            answer = json.loads(response.read())
        assert answer["status"] == "success", f"{expr}: {answer}"
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def value(self, expr: str) -> float:
        result = self.query(expr)
        assert len(result) == 1, f"{expr}: expected one series, got {result}"
        return float(result[0]["value"][1])


@pytest.fixture
def store(cluster: EmulatedCluster) -> Iterator[str]:
    dsn = asyncio.run(create_database())
    try:
        store_secret(cluster, dsn)
        yield dsn
    finally:
        asyncio.run(drop_database(dsn))


@pytest.fixture
def runner_port() -> int:
    return free_port()


@pytest.fixture
def operator(
    cluster: EmulatedCluster, kubelet: KubeletThread, store: str, runner_port: int, tmp_path: Path
) -> Iterator[OperatorProcess]:
    process = start_operator(cluster, tmp_path, AGENTRUN_OPERATOR_RUNNER_METRICS_PORT=str(runner_port))
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def prometheus(operator: OperatorProcess, runner_port: int, tmp_path: Path) -> Iterator[Prometheus]:
    if not Path(PROMETHEUS).exists():
        pytest.fail(f"{PROMETHEUS} is missing: run `make prometheus` (scripts/prometheus.sh installs Debian's package)")
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "agentrun-operator", "static_configs": [{"targets": [f"127.0.0.1:{operator.port}"]}]},
            {
                "job_name": "agentrun-runners",
                "static_configs": [{"targets": [f"127.0.0.1:{runner_port}"], "labels": {"namespace": NAMESPACE}}],
            },
        ],
    }
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={path}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(proc, port, log)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError(f"prometheus did not start:\n{log.read_text()[-3000:]}") from None
                time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp_path / "tsdb", ignore_errors=True)


class ChatCompletions(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint: the first request gets HTTP 503 (the adapter retries), then one completion."""

    served: list[int] = []
    USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        first = not self.served
        self.served.append(503 if first else 200)
        body: dict[str, Any] = (
            {"error": {"message": "overloaded, try again"}}
            if first
            else {
                "id": "chatcmpl-cluster",
                "choices": [{"message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}],
                "usage": self.USAGE,
            }
        )
        raw = json.dumps(body).encode()
        self.send_response(self.served[-1])
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def model_endpoint() -> Iterator[str]:
    ChatCompletions.served = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), ChatCompletions)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def wait_value(prom: Prometheus, expr: str, want: float, timeout: float = 15) -> float:
    deadline = time.monotonic() + timeout
    seen: float | None = None
    while time.monotonic() < deadline:
        result = prom.query(expr)
        seen = float(result[0]["value"][1]) if len(result) == 1 else None
        if seen is not None and seen >= want:
            return seen
        time.sleep(0.5)
    raise AssertionError(f"{expr}: wanted >= {want}, last saw {seen}")


def panel_queries() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in board["panels"] for target in panel["targets"]]


def concrete(expr: str) -> str:
    """A dashboard query as Grafana would send it: the namespace chosen, the rate window filled in."""
    return expr.replace("$namespace", NAMESPACE).replace("$__rate_interval", "2m")


def test_every_dashboard_panel_answers_from_a_real_prometheus_after_a_crash_replay_stop_and_interrupt(
    cluster: EmulatedCluster,
    kubelet: KubeletThread,
    operator: OperatorProcess,
    prometheus: Prometheus,
    store: str,
    model_endpoint: str,
    tmp_path: Path,
) -> None:
    began = time.time()
    # The long runner first, so it holds the runners' metrics port while the others come and go.
    apply(cluster, agentrun("hung", thread="hung", effects=tmp_path / "hung.db", env={"SUPPORT_TOOL_DELAY": "3600"}))
    wait_node(store, "default/hung", "tools")
    # A crash mid-turn: lookup and charge are recorded, send_receipt is in flight when the pod is SIGKILLed.
    apply(
        cluster,
        agentrun(
            "crash",
            thread="crash",
            effects=tmp_path / "crash.db",
            env={"SUPPORT_TOOL_DELAY_SEND_RECEIPT": "3"},
            restartPolicy={"maxRestarts": 3, "backoffSeconds": 1},
        ),
    )
    # An interrupt answered with a resume: the finished sibling calls replay from the ledger.
    apply(
        cluster,
        agentrun("approval", thread="approval", graph="tests.cluster.graphs:approval", effects=tmp_path / "ap.db"),
    )
    wait_node(store, "default/crash", "tools")
    time.sleep(1.0)
    kubelet.kill("crash-1")
    wait_phase(cluster, operator, "approval", "Interrupted", timeout=40)
    resumed = cluster.kubectl(
        "patch",
        "ar",
        "approval",
        "--type",
        "merge",
        "-p",
        json.dumps({"spec": {"resume": {"value": {"approved": True}}}}),
    )
    assert resumed.returncode == 0, resumed.stderr
    # A short run that calls a model: its pod ends before any scrape (the long runner holds the metrics port).
    apply(
        cluster,
        agentrun(
            "model",
            thread="model",
            graph="tests.cluster.graphs:metered_model",
            effects=tmp_path / "model.db",
            env={"CLUSTER_MODEL_URL": model_endpoint},
        ),
    )
    wait_phase(cluster, operator, "crash", "Succeeded", timeout=40)
    wait_phase(cluster, operator, "approval", "Succeeded", timeout=40)
    wait_phase(cluster, operator, "model", "Succeeded", timeout=40)
    assert ChatCompletions.served == [503, 200], "the adapter must retry the 503 once and get the completion"
    # The rate() panels need the long runner scraped at least twice before it stops (one scrape gives up == 1
    # but no rate; under load a 1 s scrape can time out).
    wait_value(prometheus, 'sum_over_time(up{job="agentrun-runners"}[5m])', 3, timeout=30)
    stopped = cluster.kubectl("patch", "ar", "hung", "--type", "merge", "-p", '{"spec":{"stop":true}}')
    assert stopped.returncode == 0, stopped.stderr
    wait_phase(cluster, operator, "hung", "Stopped", timeout=30)

    # What happened, as Prometheus saw it (waiting for the scrape after the last transition).
    assert wait_value(prometheus, 'sum(agentrun_operator_runs{phase="Stopped"})', 1) == 1
    assert prometheus.value('sum(agentrun_operator_runs{phase="Succeeded", namespace="default"})') == 3
    assert prometheus.value('sum(agentrun_operator_reschedules_total{reason="BackOff"})') == 1, "one crash"
    assert prometheus.value('sum(agentrun_operator_reschedules_total{reason="Resume"})') == 1, "one resume"
    assert prometheus.value('sum(agentrun_operator_reschedules_total{reason="EvictionByEvictionAPI"})') == 0
    replayed = prometheus.value('sum(agentrun_operator_tool_calls_total{outcome="replayed"})')
    assert replayed >= 1, "GUARANTEE NOT SHOWN: no ledger replay counted after the crash and the resume"
    assert prometheus.value('sum(agentrun_operator_tool_calls_total{outcome="executed"})') >= 3
    assert prometheus.value("agentrun_operator_stop_latency_seconds_count") == 1
    assert prometheus.value('sum(agentrun_operator_run_duration_seconds_count{phase="Succeeded"})') == 3
    assert prometheus.value('sum(agentrun_operator_run_duration_seconds_count{phase="Stopped"})') == 1
    assert prometheus.value("agentrun_operator_pod_start_latency_seconds_count") >= 3
    assert prometheus.value("sum(agentrun_operator_leader)") == 1
    assert prometheus.value("sum(agentrun_operator_kube_requests_total)") > 0
    assert prometheus.value('sum(agentrun_build_info{component="operator"})') == 1
    scraped = prometheus.query('max_over_time(up{job="agentrun-runners"}[5m])')
    assert scraped and float(scraped[0]["value"][1]) == 1, f"the long runner was never scraped: {scraped}"
    runner_info = prometheus.value('max(max_over_time(agentrun_build_info{component="runner"}[5m]))')
    assert runner_info == 1, "the runner's /metrics must carry agentrun_build_info{component=runner}"
    # A finished runner's series are stale at once (its target is gone): look back over the run, as Grafana does.
    written = prometheus.value("sum(max_over_time(agentrun_checkpoint_write_seconds_count[5m]))")
    assert written > 0, "the long runner's checkpoint writes were scraped"

    # Model usage outlives the short pod: the operator counted it from the checkpoint (status.modelUsage).
    usage = (cluster.get("agentruns", "model", NAMESPACE) or {}).get("status", {}).get("modelUsage")
    assert usage and usage[0]["model"] == "cluster-model" and usage[0]["promptTokens"] == 11, usage
    assert usage[0]["requests"] == {"ok": 1, "error": 1}, usage
    model = 'namespace="default", model="cluster-model"'
    tokens = f"agentrun_operator_model_tokens_total{{{model}, kind=%r}}"
    assert wait_value(prometheus, tokens % "prompt", 11) == 11, "GUARANTEE BROKEN: a short run's tokens were lost"
    assert prometheus.value(tokens % "completion") == 7
    assert prometheus.value(f'agentrun_operator_model_requests_total{{{model}, status="ok"}}') == 1
    assert prometheus.value(f'agentrun_operator_model_requests_total{{{model}, status="error"}}') == 1
    assert prometheus.value(f'agentrun_operator_model_request_seconds_total{{{model}, status="ok"}}') > 0
    unscraped = prometheus.query('max_over_time(agentrun_model_tokens_total{model="cluster-model"}[5m])')
    assert not unscraped, f"the model run's pod was scraped after all, so this proves nothing: {unscraped}"

    # Every panel's every query, as Grafana sends it: a range query over the test's window.
    empty = [
        (title, expr)
        for title, expr in panel_queries()
        if not prometheus.query_range(concrete(expr), began, time.time())
    ]
    assert not empty, f"dashboard panels with no data from Prometheus: {empty}"
