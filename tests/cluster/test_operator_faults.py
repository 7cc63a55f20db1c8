"""The operator under infrastructure faults and bad input (issue 8), on the emulated cluster.

The tests of what the API server sees (1 MiB inputs, a pod that cannot start, store Secrets and their
label, confinement, hostile objects 10,000 levels deep, broken stores) are marked ``real_server``: they
run on the real control plane too. The store outages run on kubesim only (the API server plays no part).

Real operator process, real runner processes, real kubectl, real PostgreSQL. The store outages run
against a PRIVATE PostgreSQL server (``agentrun_dev.servers.PrivatePostgres``: its own data
directory and port) that the test stops and starts, so no other test's database ever goes away.

Guarantees: a PostgreSQL restart mid-run costs no restart budget and re-executes no tool; a store
down past ``storeUnavailableTimeoutSeconds`` fails the run ``StoreUnavailable``; a broken store
configuration fails ``InvalidStore`` at once and the password appears nowhere; 1 MiB inputs and
resume values run; a pod that cannot start fails with the kubelet's reason; a Secret reaches a
runner only when its namespace allows it; hostile objects do not disturb other runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_dev.databases import throwaway_database
from agentrun_dev.servers import PrivatePostgres
from examples.support_agent import count_effects
from kubesim import EmulatedCluster, KubeletThread
from tests.cluster.operator_harness import (
    OperatorProcess,
    agentrun,
    apply,
    executions,
    pods_of,
    run_events,
    start_operator,
    status,
    store_secret,
    wait_phase,
)

pytestmark = pytest.mark.timeout(240)

PASSWORD = "Hunter2-S3cret-Pw"
MIB = 1 << 20


def _store(manifest: dict[str, Any], secret: str) -> dict[str, Any]:
    manifest["spec"]["store"] = {"secretRef": {"name": secret}}
    return manifest


def _conditions(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in state.get("conditions") or []}


def _runner_logs(tmp_path: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in tmp_path.rglob("*.log") if p.is_file())


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    with PrivatePostgres().running() as server:
        yield server


@pytest.fixture
def shared_dsn() -> Iterator[str]:
    with throwaway_database() as database:
        yield database


@pytest.fixture
def operator(cluster: EmulatedCluster, kubelet: KubeletThread, tmp_path: Path) -> Iterator[OperatorProcess]:
    # Runners give up on an unreachable store after 3 s instead of a minute (the kubelet's base env: the
    # operator does not render this variable, and a podTemplate may not set an AGENTRUN_ name).
    kubelet.kubelet.base_env["AGENTRUN_STORE_RETRY_SECONDS"] = "3"
    process = start_operator(cluster, tmp_path)
    try:
        yield process
    finally:
        process.stop()


# --- store outages ---------------------------------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_postgres_restarted_mid_run_under_20_runs_costs_no_restart_and_reruns_no_tool(
    cluster: EmulatedCluster, kubelet: KubeletThread, private_pg: PrivatePostgres, tmp_path: Path
) -> None:
    """RESTARTS a private PostgreSQL while 20 runs are inside their tools (the runners ride it out)."""
    store_secret(cluster, private_pg.dsn)
    process = start_operator(cluster, tmp_path)  # runners keep their default 60 s retry bound
    names = [f"pg-{i:02d}" for i in range(20)]
    try:
        for name in names:
            apply(
                cluster, agentrun(name, thread=name, effects=tmp_path / f"{name}.db", env={"SUPPORT_TOOL_DELAY": "8"})
            )
        # Every run started, most of them inside their 8 s tools when the store goes away.
        cluster.wait_for(
            lambda: all(status(cluster, n).get("phase") in ("Running", "Succeeded") for n in names),
            timeout=240,
            interval=0.5,
            message="all 20 runs started",
        )
        running = sum(status(cluster, n).get("phase") == "Running" for n in names)
        began = time.monotonic()
        private_pg.stop()  # pg_ctl stop -m fast: every session is disconnected, as a restart does
        time.sleep(3)
        private_pg.start()
        restart = time.monotonic() - began
        finals = {n: wait_phase(cluster, process, n, "Succeeded", timeout=240) for n in names}
    finally:
        process.stop()
    saw_outage = [n for n in names if any(_was_down(s) for s in cluster.history("agentruns", n))]
    restarts = sum(f["restarts"] for f in finals.values())
    reruns = sum(count_effects(str(tmp_path / f"{n}.db"))["tool_invocations"] - 2 for n in names)
    print(
        f"PostgreSQL restart: {restart:.1f}s down (stop -m fast, 3 s, start) with {running} runs running; "
        f"{len(names)} runs Succeeded, "
        f"restarts {restarts}, disruptions {sum(f['disruptions'] for f in finals.values())}, tool re-executions "
        f"{reruns}, StoreAvailable False seen on {len(saw_outage)} runs"
    )
    assert restarts == 0, f"GUARANTEE BROKEN: a store restart spent restart budget: {finals}"
    for name in names:
        effects = count_effects(str(tmp_path / f"{name}.db"))
        assert (effects["charges"], effects["receipts"], effects["tool_invocations"]) == (1, 1, 2), (
            f"GUARANTEE BROKEN: {name} re-executed a recorded tool: {effects}"
        )
    assert saw_outage, "no run showed StoreAvailable=False during the outage"
    for name in saw_outage:
        condition = _conditions(finals[name]).get("StoreAvailable")
        assert condition is not None and condition["status"] == "True", f"{name}: StoreAvailable never came back"


def _was_down(run: dict[str, Any] | None) -> bool:
    condition = _conditions((run or {}).get("status") or {}).get("StoreAvailable")
    return condition is not None and condition["status"] == "False"


def test_store_down_past_the_timeout_fails_store_unavailable_without_spending_restarts(
    cluster: EmulatedCluster,
    kubelet: KubeletThread,
    operator: OperatorProcess,
    private_pg: PrivatePostgres,
    tmp_path: Path,
) -> None:
    """STOPS a private PostgreSQL mid-run for good: exit 8, backoff, then Failed past a 20 s timeout (6 s left no room
    on a loaded machine: the first reconcile after the exit 8 came past it, and the Pending wait was never seen)."""
    store_secret(cluster, private_pg.dsn)
    manifest = agentrun(
        "outage",
        thread="outage",
        effects=tmp_path / "e.db",
        env={"SUPPORT_TOOL_DELAY": "3"},
        restartPolicy={"maxRestarts": 0, "backoffSeconds": 1, "storeUnavailableTimeoutSeconds": 20},
    )
    apply(cluster, manifest)
    wait_phase(cluster, operator, "outage", "Running", timeout=60)
    private_pg.stop()
    stopped = time.monotonic()
    final = wait_phase(cluster, operator, "outage", "Failed", timeout=60)
    took = time.monotonic() - stopped
    print(f"store down -> Failed StoreUnavailable after {took:.1f}s: {final['message']}")
    assert final["reason"] == "StoreUnavailable", final
    assert final["restarts"] == 0, "a store outage must never count against maxRestarts (0 here)"
    assert final["storeUnavailableSince"] and "storeUnavailableTimeoutSeconds is 20" in final["message"]
    down = _conditions(final)["StoreAvailable"]
    assert down["status"] == "False" and down["message"].startswith("STORAGE_UNAVAILABLE_001"), down
    assert any(
        s and (s.get("status") or {}).get("reason") == "StoreUnavailable" and s["status"]["phase"] == "Pending"
        for s in cluster.history("agentruns", "outage")
    ), "the run should have waited Pending StoreUnavailable"


def test_a_stop_during_a_store_outage_shows_stopping_at_once_and_ends_the_run_when_the_store_returns(
    cluster: EmulatedCluster,
    kubelet: KubeletThread,
    operator: OperatorProcess,
    private_pg: PrivatePostgres,
    tmp_path: Path,
) -> None:
    """Issue 22 item 9: STOPS a private PostgreSQL, then kubectl patch spec.stop: Stopping at once, kept, Stopped."""
    store_secret(cluster, private_pg.dsn)
    kubelet.kubelet.base_env["AGENTRUN_STORE_RETRY_SECONDS"] = "60"  # the runner rides the outage out
    apply(
        cluster, agentrun("stop-dark", thread="stop-dark", effects=tmp_path / "e.db", env={"SUPPORT_TOOL_DELAY": "60"})
    )
    wait_phase(cluster, operator, "stop-dark", "Running", timeout=60)
    private_pg.stop()
    try:
        patched = cluster.kubectl("patch", "ar", "stop-dark", "--type", "merge", "-p", '{"spec":{"stop":true}}')
        assert patched.returncode == 0, patched.stderr
        asked = time.monotonic()
        # The store stays down until after this: Stopping shown at all is shown without it (not timed).
        stopping = wait_phase(cluster, operator, "stop-dark", "Stopping", timeout=30, interval=0.05)
        shown = time.monotonic() - asked
        down = _conditions(stopping).get("StoreAvailable")
        assert down is not None and down["status"] == "False", stopping
        assert "store is unavailable" in stopping["message"], stopping
        print(f"stop during an outage shown as Stopping after {shown:.2f}s: {stopping['message']}")
        time.sleep(3)
    finally:
        private_pg.start()
    final = wait_phase(cluster, operator, "stop-dark", "Stopped", timeout=60)
    assert final["reason"] == "Stopped", f"the stop must reach the runner once the store is back: {final}"


def _password_postgres(server: PrivatePostgres) -> str:
    """Role ``app`` must log in over TCP with PASSWORD (scram); returns a correct DSN."""
    hba = server.data / "pg_hba.conf"
    hba.write_text("host all app 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    server.stop()
    server.start()
    server.sql(f"CREATE ROLE app LOGIN PASSWORD '{PASSWORD}'")
    return f"postgresql://app:{PASSWORD}@127.0.0.1:{server.port}/postgres"


@pytest.mark.real_server
@pytest.mark.parametrize("broken", ["malformed-dsn", "wrong-password", "missing-database"])
def test_a_broken_store_fails_invalid_store_at_once_and_the_password_appears_nowhere(
    cluster: EmulatedCluster,
    kubelet: KubeletThread,
    operator: OperatorProcess,
    private_pg: PrivatePostgres,
    tmp_path: Path,
    broken: str,
) -> None:
    good = _password_postgres(private_pg)
    dsn = {
        "malformed-dsn": f"postgresql://app:{PASSWORD}@127.0.0.1:notaport/postgres",
        "wrong-password": good.replace(PASSWORD, PASSWORD + "-wrong"),
        "missing-database": good.replace("/postgres", "/no_such_database"),
    }[broken]
    store_secret(cluster, dsn, "broken-store")
    apply(cluster, _store(agentrun(broken, thread=broken, effects=tmp_path / "e.db"), "broken-store"))
    final = wait_phase(cluster, operator, broken, "Failed", timeout=60)
    assert final["reason"] == "InvalidStore", final
    assert final["message"].startswith("STORAGE_CONFIG_001: ") and "\n" not in final["message"], final
    assert len(pods_of(cluster, broken)) <= 1, "a configuration error must fail within one attempt"
    time.sleep(1.5)
    assert len(pods_of(cluster, broken)) <= 1, "a configuration error must not be retried"
    seen = {
        "status": json.dumps(status(cluster, broken)),
        "events": json.dumps(run_events(cluster, broken)),
        "operator log": operator.log(),
        "runner logs": _runner_logs(tmp_path / "kubelet"),
    }
    for where, text in seen.items():
        assert PASSWORD not in text, f"SECRET LEAKED: the store password appears in the {where}"
    print(f"{broken}: {final['message']}")


# --- large inputs ----------------------------------------------------------------------------------------------------


@pytest.mark.real_server
def test_a_one_mib_input_and_a_one_mib_resume_value_run_to_succeeded(
    cluster: EmulatedCluster, kubelet: KubeletThread, operator: OperatorProcess, shared_dsn: str, tmp_path: Path
) -> None:
    store_secret(cluster, shared_dsn)
    big = agentrun(
        "big-input",
        thread="big-input",
        effects=tmp_path / "a.db",
        text="charge my saved card for order 4821 and email me the receipt " + "é✓ 𝄞" * (MIB // 10),  # ~1 MiB UTF-8
    )
    # kubectl create: client-side apply would copy the object into a 256 KiB-limited annotation.
    made = cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(big))
    assert made.returncode == 0, made.stderr
    asked = agentrun(
        "big-resume", thread="big-resume", graph="tests.cluster.graphs:approval", effects=tmp_path / "b.db"
    )
    apply(cluster, asked)
    wait_phase(cluster, operator, "big-resume", "Interrupted", timeout=90)
    patch = tmp_path / "resume.json"
    patch.write_text(json.dumps({"spec": {"resume": {"value": {"approved": True, "note": "n" * MIB}}}}))
    patched = cluster.kubectl("patch", "ar", "big-resume", "--type", "merge", "--patch-file", str(patch))
    assert patched.returncode == 0, patched.stderr
    first = wait_phase(cluster, operator, "big-input", "Succeeded", timeout=120)
    second = wait_phase(cluster, operator, "big-resume", "Succeeded", timeout=120)
    assert first["attempt"] == 1 and second["attempt"] == 2
    approved = [line for line in executions(tmp_path / "b.db") if line.startswith("approve:")]
    assert len(approved) == 1 and len(approved[0]) > MIB, "the runner did not get the whole resume value"
    pod = cluster.get("pods", "big-input-1")
    assert pod is not None
    env = {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}
    assert env["AGENTRUN_INPUTS_IN_STORE"] == "true" and max(len(v) for v in env.values()) < 8192


# --- pods that cannot start ------------------------------------------------------------------------------------------


@pytest.mark.real_server
def test_a_pod_that_cannot_start_fails_with_the_kubelet_reason_without_retrying(
    cluster: EmulatedCluster, kubelet: KubeletThread, operator: OperatorProcess, shared_dsn: str, tmp_path: Path
) -> None:
    store_secret(cluster, shared_dsn)
    # One environment string over Linux's 128 KiB limit: exec fails (E2BIG), the kubelet reports StartError.
    apply(cluster, agentrun("no-start", thread="no-start", effects=tmp_path / "e.db", env={"HUGE": "z" * (200 << 10)}))
    final = wait_phase(cluster, operator, "no-start", "Failed", timeout=60)
    assert final["reason"] == "StartError", final
    assert final["message"].startswith("StartError: ") and "\n" not in final["message"], final
    time.sleep(1.5)
    assert pods_of(cluster, "no-start") == ["no-start-1"], "a pod that cannot start must not be retried"
    described = cluster.kubectl("describe", "ar", "no-start")
    assert described.returncode == 0 and final["message"] in described.stdout, described.stdout[-2000:]


# --- Secrets only by permission --------------------------------------------------------------------------------------


@pytest.mark.real_server
def test_an_unlabelled_secret_is_refused_before_any_pod_and_a_labelled_one_works(
    cluster: EmulatedCluster, kubelet: KubeletThread, operator: OperatorProcess, shared_dsn: str, tmp_path: Path
) -> None:
    store_secret(cluster, shared_dsn)
    made = cluster.kubectl("create", "secret", "generic", "api-key", "--from-literal=token=tok-123")
    assert made.returncode == 0, made.stderr

    def referencing(name: str, secret: str) -> dict[str, Any]:
        manifest = agentrun(name, thread=name, effects=tmp_path / f"{name}.db")
        manifest["spec"]["podTemplate"]["env"].append(
            {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}}}
        )
        return manifest

    apply(cluster, referencing("sneaky", "api-key"))
    refused = wait_phase(cluster, operator, "sneaky", "Failed", timeout=30)
    assert refused["reason"] == "InvalidSpec" and "default/api-key" in refused["message"], refused
    assert 'agentrun.dev/runner-access="true"' in refused["message"], "the message must say how to allow it"
    apply(cluster, referencing("store-thief", "agentrun-store"))
    thief = wait_phase(cluster, operator, "store-thief", "Failed", timeout=30)
    assert thief["reason"] == "InvalidSpec" and "store Secret" in thief["message"], thief
    assert pods_of(cluster, "sneaky") == [] and pods_of(cluster, "store-thief") == [], "GUARANTEE BROKEN: a pod"

    labelled = cluster.kubectl("label", "secret", "api-key", "agentrun.dev/runner-access=true")
    assert labelled.returncode == 0, labelled.stderr
    apply(cluster, referencing("allowed", "api-key"))
    wait_phase(cluster, operator, "allowed", "Succeeded", timeout=60)


@pytest.mark.real_server
def test_a_store_secret_needs_the_label_and_the_pod_confinement_and_contract_cannot_be_changed(
    cluster: EmulatedCluster, kubelet: KubeletThread, operator: OperatorProcess, shared_dsn: str, tmp_path: Path
) -> None:
    """Issue 22 item 3: spec.store.secretRef, podTemplate annotations and AGENTRUN_* env are not a way around."""
    store_secret(cluster, shared_dsn)
    store_secret(cluster, shared_dsn, "team-db", opt_in=False)  # any Secret with a postgresDsn key
    apply(cluster, _store(agentrun("store-bypass", thread="store-bypass", effects=tmp_path / "a.db"), "team-db"))
    refused = wait_phase(cluster, operator, "store-bypass", "Failed", timeout=30)
    assert refused["reason"] == "InvalidSpec" and "default/team-db" in refused["message"], refused
    assert 'kubectl label secret -n default team-db agentrun.dev/runner-access="true"' in refused["message"], refused

    unconfined = agentrun("unconfined", thread="unconfined", effects=tmp_path / "b.db")
    unconfined["spec"]["podTemplate"]["annotations"] = {
        "container.apparmor.security.beta.kubernetes.io/runner": "unconfined"
    }
    apply(cluster, unconfined)
    refused = wait_phase(cluster, operator, "unconfined", "Failed", timeout=30)
    assert refused["reason"] == "InvalidSpec" and "apparmor" in refused["message"], refused

    shadow = agentrun("dsn-shadow", thread="dsn-shadow", effects=tmp_path / "c.db")
    shadow["spec"]["podTemplate"]["env"].append({"name": "AGENTRUN_POSTGRES_DSN", "value": "postgresql://x@h/db"})
    apply(cluster, shadow)
    refused = wait_phase(cluster, operator, "dsn-shadow", "Failed", timeout=30)
    assert refused["reason"] == "InvalidSpec" and "AGENTRUN_POSTGRES_DSN is reserved" in refused["message"], refused
    for name in ("store-bypass", "unconfined", "dsn-shadow"):
        assert pods_of(cluster, name) == [], f"GUARANTEE BROKEN: {name} got a pod"

    labelled = cluster.kubectl("label", "secret", "team-db", "agentrun.dev/runner-access=true")
    assert labelled.returncode == 0, labelled.stderr
    apply(cluster, _store(agentrun("store-allowed", thread="store-allowed", effects=tmp_path / "d.db"), "team-db"))
    wait_phase(cluster, operator, "store-allowed", "Succeeded", timeout=60)


# --- hostile objects -------------------------------------------------------------------------------------------------


def _nested(levels: int) -> str:
    return '{"a":' * levels + '"bottom"' + "}" * levels


@pytest.mark.real_server
@pytest.mark.kubesim_too  # kubesim's size and depth limits are held to the real server's
def test_hostile_objects_fail_invalid_spec_and_do_not_disturb_ten_other_runs(
    cluster: EmulatedCluster, kubelet: KubeletThread, operator: OperatorProcess, shared_dsn: str, tmp_path: Path
) -> None:
    store_secret(cluster, shared_dsn)
    path = "/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns"
    hostile = {
        "deep": f'{{"messages": [{{"role": "user", "content": "hi"}}], "nested": {_nested(10_000 - 10)}}}',
        "nul": json.dumps({"messages": [{"role": "user", "content": "a\u0000b \U0001d11e\u202e" + "x" * (64 << 10)}]}),
    }
    for name, raw_input in hostile.items():
        head = json.dumps(
            {
                "apiVersion": "agentrun.dev/v1alpha1",
                "kind": "AgentRun",
                "metadata": {"name": f"hostile-{name}"},
                "spec": {"graph": "examples.support_agent:app", "threadId": f"hostile-{name}"},
            }
        )
        body = head[: -len("}}")] + f', "input": {raw_input}}}}}'  # spliced: json.dumps would recurse
        created = cluster.api("POST", path, body, timeout=60)
        assert created.status == 201, f"the API server must accept what a real one accepts: {created!r}"[:2000]
    names = [f"calm-{i}" for i in range(10)]
    for name in names:
        apply(cluster, agentrun(name, thread=name, effects=tmp_path / f"{name}.db"))
    for name in hostile:
        final = wait_phase(cluster, operator, f"hostile-{name}", "Failed", timeout=60)
        assert final["reason"] == "InvalidSpec", final
        print(f"hostile-{name}: {final['message'][:200]}")
        assert pods_of(cluster, f"hostile-{name}") == []
    for name in names:
        wait_phase(cluster, operator, name, "Succeeded", timeout=120)
    assert "RecursionError" not in operator.log(), operator.log()[-3000:]
