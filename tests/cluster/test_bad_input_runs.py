"""Bad input on the cluster: a 10 MB result, runner pods without API access, namespaces, a canary (issue 13).

Every test runs on kubesim and on the real control plane (``real_server``): there the pod spec is the one
kube-apiserver stored after its ServiceAccount admission (which mounts a token unless the pod opts out),
and the AgentRun's size meets etcd's real limit.

The real operator process, real runner pods (processes started by kubesim's
kubelet stand-in), real kubectl, the real PostgreSQL (a private database per
test). Guarantees:

- a 10 MB tool result, a 10 MB tool error and a 10 MB final answer leave the
  AgentRun, its events and its status small;
- runner pods carry no Kubernetes API token and nothing that leads to the
  API server: the pod spec opts out of the token and the service links, and
  the runner process started from it finds no in-cluster config, token file
  or kubeconfig;
- a run cannot read or resume another namespace's thread, even with the
  same ``threadId`` on the same database;
- a store password (a canary created for the test, on a role of its own)
  appears nowhere: operator log, runner logs, events, AgentRuns, pods, metrics.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from agentrun_dev.databases import postgres_dsn, throwaway_database, with_database
from agentrun_dev.servers import free_port
from kubesim import EmulatedCluster, KubeletThread
from tests.badinput.graphs import BIG, TOKEN_DIR
from tests.cluster.operator_harness import (
    OperatorProcess,
    agentrun,
    apply,
    executions,
    progress,
    run_events,
    start_operator,
    status,
    store_secret,
    wait_phase,
)

pytestmark = [pytest.mark.cluster, pytest.mark.postgres, pytest.mark.timeout(240), pytest.mark.real_server]


@pytest.fixture
def dsn() -> Iterator[str]:
    with throwaway_database() as database:
        yield database


# --- a 10 MB result ---------------------------------------------------------------------------------------------------


def test_a_10_mb_result_error_and_answer_leave_the_agentrun_small(
    cluster: EmulatedCluster, operator: OperatorProcess, dsn: str, tmp_path: Path
) -> None:
    apply(cluster, agentrun("big", thread="big", graph="tests.badinput.graphs:big_result", effects=tmp_path / "e.db"))
    final = wait_phase(cluster, operator, "big", "Succeeded", timeout=120)
    run = cluster.get("agentruns", "big")
    size = len(json.dumps(run))
    events = run_events(cluster, "big")
    print(f"AgentRun after a 10 MB result: {size} bytes; status {len(json.dumps(final))} bytes; {len(events)} events")
    assert size < 16 << 10, f"GUARANTEE BROKEN: the AgentRun grew to {size} bytes: {json.dumps(final)[:2000]}"
    assert all(len(json.dumps(e)) < 4 << 10 for e in events), "an event carries the payload"
    assert events, "no events were captured"
    assert final["toolCalls"]["executed"] == 1 and final["toolCalls"]["failed"] == 1, final["toolCalls"]
    shown = cluster.kubectl("get", "ar", "big", "-o", "yaml")
    assert shown.returncode == 0 and len(shown.stdout) < 16 << 10
    # The whole result is in the store, where it belongs.
    stored = progress(dsn, "default/big")
    assert stored is not None and stored.status == "completed"

    async def answer() -> int:
        conn = await asyncpg.connect(dsn, server_settings={"search_path": "agentrun"})
        try:
            value: int = await conn.fetchval(
                "SELECT octet_length(result_text) FROM tool_executions WHERE thread_id = $1", "default/big"
            )
            return value
        finally:
            await conn.close()

    assert asyncio.run(answer()) >= BIG, "the 10 MB result was not recorded whole"


def test_a_10_mb_interrupt_leaves_the_agentrun_small_and_can_be_answered(
    cluster: EmulatedCluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    graph = "tests.badinput.graphs:big_interrupt"
    apply(cluster, agentrun("sign", thread="sign", graph=graph, effects=tmp_path / "e.db"))
    asked = wait_phase(cluster, operator, "sign", "Interrupted", timeout=90)
    size = len(json.dumps(cluster.get("agentruns", "sign")))
    print(f"AgentRun waiting on a 10 MB interrupt: {size} bytes; interrupt {len(json.dumps(asked['interrupt']))}")
    assert size < 16 << 10, f"GUARANTEE BROKEN: the AgentRun grew to {size} bytes: {json.dumps(asked)[:2000]}"
    assert all(len(json.dumps(e)) < 4 << 10 for e in run_events(cluster, "sign")), "an event carries the message"
    assert asked["interrupt"]["message"].startswith("sign this: mmm")
    patched = cluster.kubectl("patch", "ar", "sign", "--type", "merge", "-p", '{"spec":{"resume":{"value":"yes"}}}')
    assert patched.returncode == 0, patched.stderr
    done = wait_phase(cluster, operator, "sign", "Succeeded", timeout=90)
    assert done["result"]["message"] == "answered yes" and len(json.dumps(cluster.get("agentruns", "sign"))) < 16 << 10


def test_a_node_failing_with_a_10_mb_message_fails_the_run_with_a_small_status(
    cluster: EmulatedCluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    apply(cluster, agentrun("boom", thread="boom", graph="tests.badinput.graphs:big_failure", effects=tmp_path / "e"))
    failed = wait_phase(cluster, operator, "boom", "Failed", timeout=90)
    size = len(json.dumps(cluster.get("agentruns", "boom")))
    print(f"AgentRun failed with a 10 MB message: {size} bytes; message {failed['message'][:120]!r}")
    assert size < 16 << 10, f"GUARANTEE BROKEN: the AgentRun grew to {size} bytes"
    assert all(len(json.dumps(e)) < 4 << 10 for e in run_events(cluster, "boom")), "an event carries the message"
    # The kubelet's FallbackToLogsOnError keeps the last 2048 bytes of the log: the runner's last line must
    # fit, or the code and the start of the message are lost (they were).
    assert failed["message"].startswith("NODE_ERROR_001: ") and "the report could not be built" in failed["message"]


def _scrape(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            body: bytes = response.read()
            return body.decode()
    except OSError:
        return ""


# --- runner pods and the Kubernetes API -------------------------------------------------------------------------------


def test_runner_pods_have_no_token_and_their_process_finds_no_way_to_the_api(
    cluster: EmulatedCluster, kubelet: KubeletThread, operator: OperatorProcess, tmp_path: Path
) -> None:
    manifest = agentrun(
        "probe",
        thread="probe",
        graph="tests.badinput.graphs:kubernetes_probe",
        effects=tmp_path / "e.db",
        env={"PROBE_HOLD_SECONDS": "3"},
    )
    apply(cluster, manifest)
    pod = cluster.wait_for(lambda: cluster.get("pods", "probe-1"), timeout=60, message="the runner pod")
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False, "GUARANTEE BROKEN: the runner pod mounts an API token"
    assert spec["enableServiceLinks"] is False
    projected = [v for v in spec.get("volumes") or [] if "projected" in v or "secret" in v]
    assert not projected, f"GUARANTEE BROKEN: the runner pod mounts credentials: {projected}"
    for container in spec["containers"] + (spec.get("initContainers") or []):
        mounts = [m["mountPath"] for m in container.get("volumeMounts") or []]
        assert not [m for m in mounts if m.startswith("/var/run/secrets")], mounts
        names = {e["name"] for e in container.get("env") or []}
        assert not {n for n in names if n.startswith("KUBERNETES_") or n == "KUBECONFIG"}, names
        assert cluster.url not in json.dumps(container), "the pod spec holds the API server's address"
    assert spec.get("serviceAccountName") in (None, "default")

    # The process the kubelet started from that spec, while it runs.
    running = cluster.wait_for(
        lambda: (p := kubelet.kubelet.pods.get(("default", "probe-1"))) is not None and p.process is not None and p,
        timeout=60,
        message="the runner process",
    )
    environ = Path(f"/proc/{running.process.pid}/environ").read_bytes().split(b"\0")
    names = {e.split(b"=", 1)[0].decode() for e in environ if e}
    assert "AGENTRUN_THREAD_ID" in names, "not the runner's environment"
    assert not {n for n in names if n.startswith("KUBERNETES_") or n == "KUBECONFIG"}, sorted(names)
    port = cluster.url.rsplit(":", 1)[-1]
    assert not [e for e in environ if port.encode() in e], "the runner's environment holds the API server's port"
    final = wait_phase(cluster, operator, "probe", "Succeeded", timeout=60)
    found = json.loads(_final_answer(final))
    assert found == {"env": [], "token_files": [], "kubeconfig": False}, f"GUARANTEE BROKEN: the runner found {found}"
    assert not Path(TOKEN_DIR).exists() or not Path(TOKEN_DIR, "token").exists()


def _final_answer(final: dict[str, Any]) -> str:
    result = final.get("result") or {}
    message = result.get("message") if isinstance(result, dict) else None
    assert message, f"no final answer in status: {final}"
    return str(message)


# --- namespaces -------------------------------------------------------------------------------------------------------


def test_a_run_cannot_read_or_resume_another_namespaces_thread(
    cluster: EmulatedCluster, operator: OperatorProcess, dsn: str, tmp_path: Path
) -> None:
    """Same threadId, same database (the worst case): team-b's run sees and resumes only its own thread."""
    assert cluster.kubectl("create", "namespace", "team-b").returncode == 0
    store_secret(cluster, dsn, namespace="team-b")
    secret_text = f"order 4821 for the CEO, card ending {uuid.uuid4().hex[:6]}"
    graph = "tests.cluster.graphs:approval"
    apply(cluster, agentrun("ask", thread="shared", graph=graph, effects=tmp_path / "a.db", text=secret_text))
    a = wait_phase(cluster, operator, "ask", "Interrupted", timeout=60)
    a_version = progress(dsn, "default/shared")
    assert a_version is not None
    other = agentrun("ask", thread="shared", graph=graph, effects=tmp_path / "b.db", text="hello from team b")
    apply(cluster, other, namespace="team-b")
    wait_phase(cluster, operator, "ask", "Interrupted", timeout=60, namespace="team-b")
    patched = cluster.kubectl(
        "patch", "ar", "ask", "-n", "team-b", "--type", "merge", "-p", '{"spec":{"resume":{"value":{"approved":true}}}}'
    )
    assert patched.returncode == 0, patched.stderr
    b = wait_phase(cluster, operator, "ask", "Succeeded", timeout=60, namespace="team-b")
    time.sleep(1)
    # team-b's resume answered team-b's interrupt only.
    assert status(cluster, "ask")["phase"] == "Interrupted", "GUARANTEE BROKEN: another namespace resumed this run"
    after = progress(dsn, "default/shared")
    assert after is not None and after.version == a_version.version, "another namespace wrote to this thread"
    assert not [x for x in executions(tmp_path / "a.db") if x.startswith("approve:")], "team-a's approval ran"
    assert [x for x in executions(tmp_path / "b.db") if x.startswith("approve:")], "team-b's approval did not run"
    # Nothing of team-a's thread reached team-b: not its status, not its transcript.
    assert secret_text not in json.dumps(b) and secret_text not in json.dumps(cluster.get("agentruns", "ask", "team-b"))

    async def transcript(thread: str) -> str:
        from agentrun.checkpoint.postgres import PgCheckpointer

        store = PgCheckpointer(dsn)
        try:
            state = await store.aget(thread)
        finally:
            await store.aclose()
        assert state is not None
        return json.dumps([m.to_json() for m in state.messages])

    assert secret_text in asyncio.run(transcript("default/shared"))
    assert secret_text not in asyncio.run(transcript("team-b/shared")), "GUARANTEE BROKEN: team-b read team-a's thread"
    assert a["interrupt"] == status(cluster, "ask")["interrupt"]


# --- no secret anywhere -----------------------------------------------------------------------------------------------


@pytest.fixture
def canary_dsn() -> Iterator[tuple[str, str]]:
    """A private database owned by a role of its own whose password is a canary: (DSN, password)."""
    token = uuid.uuid4().hex[:12]
    role, password = f"canary_{token}", f"canary-{token}-Pw"
    database = f"agentrun_canary_{token}"

    async def admin(*statements: str) -> None:
        conn = await asyncpg.connect(postgres_dsn())
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(admin(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'", f'CREATE DATABASE "{database}" OWNER {role}'))
    dsn = with_database(postgres_dsn(), database).replace("postgres@", f"{role}:{password}@", 1)
    assert password in dsn and role in dsn, dsn
    try:
        yield dsn, password
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)', f"DROP ROLE IF EXISTS {role}"))


def test_the_store_password_appears_in_no_log_event_status_or_metric(
    cluster: EmulatedCluster, kubelet: KubeletThread, canary_dsn: tuple[str, str], tmp_path: Path
) -> None:
    dsn, password = canary_dsn
    kubelet.kubelet.base_env["AGENTRUN_STORE_RETRY_SECONDS"] = "2"
    store_secret(cluster, dsn)
    # The same canary on a port where nothing listens: the runner's and the operator's error paths.
    down_dsn = dsn.replace(dsn.split("@", 1)[1].split("/", 1)[0], f"127.0.0.1:{free_port()}")
    store_secret(cluster, down_dsn, "down-store")
    # And on a database that does not exist: the configuration-error path (InvalidStore).
    store_secret(cluster, dsn.rsplit("/", 1)[0] + "/no_such_database", "no-db-store")
    runner_port = free_port()  # the one runner that reaches the store serves /metrics here while it runs
    process = start_operator(cluster, tmp_path, AGENTRUN_OPERATOR_RUNNER_METRICS_PORT=str(runner_port))
    runner_metrics = ""
    try:
        apply(cluster, agentrun("good", thread="good", effects=tmp_path / "g.db", env={"SUPPORT_TOOL_DELAY": "3"}))
        runner_metrics = cluster.wait_for(
            lambda: _scrape(f"http://127.0.0.1:{runner_port}/metrics"), timeout=60, message="the runner's /metrics"
        )
        no_db = agentrun("no-db", thread="no-db", effects=tmp_path / "n.db")
        no_db["spec"]["store"] = {"secretRef": {"name": "no-db-store"}}
        apply(cluster, no_db)
        down = agentrun(
            "down",
            thread="down",
            effects=tmp_path / "d.db",
            restartPolicy={"maxRestarts": 0, "backoffSeconds": 1, "storeUnavailableTimeoutSeconds": 4},
        )
        down["spec"]["store"] = {"secretRef": {"name": "down-store"}}
        apply(cluster, down)
        wait_phase(cluster, process, "good", "Succeeded", timeout=90)
        failed = wait_phase(cluster, process, "down", "Failed", timeout=90)
        assert failed["reason"] in ("StoreUnavailable", "InvalidStore"), failed
        invalid = wait_phase(cluster, process, "no-db", "Failed", timeout=90)
        assert invalid["reason"] == "InvalidStore", invalid
        metrics = process.metrics()
    finally:
        process.stop()
    seen = {
        "operator log": process.log(),
        # Every pod's log file, deleted pods' too (the kubelet keeps them in its folder).
        "runner pod logs": "\n".join(
            p.read_text(errors="replace") for p in (tmp_path / "kubelet").rglob("*.log") if p.is_file()
        ),
        "kubectl get events -A -o yaml": cluster.kubectl("get", "events", "-A", "-o", "yaml").stdout,
        "kubectl get agentruns -A -o yaml": cluster.kubectl("get", "agentruns", "-A", "-o", "yaml").stdout,
        "kubectl describe agentruns": cluster.kubectl("describe", "agentruns").stdout,
        "kubectl get pods -A -o yaml": cluster.kubectl("get", "pods", "-A", "-o", "yaml").stdout,
        "operator /metrics": metrics,
        "runner /metrics": runner_metrics,
    }
    assert "AGENTRUN_POSTGRES_DSN" in seen["kubectl get pods -A -o yaml"], "the pods were not captured"
    assert "agentrun_" in runner_metrics, "the runner's metrics were not captured"
    assert seen["runner pod logs"].strip(), "the runner logs were not captured"
    for where, text in seen.items():
        assert password not in text, f"SECRET LEAKED: the store password appears in the {where}"
    print({where: len(text) for where, text in seen.items()})
