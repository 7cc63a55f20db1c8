"""The real operator process on the emulated cluster, plus helpers the operator tests share."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun.checkpoint.base import Progress
from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun_dev import launch
from agentrun_dev.launch import OperatorProcess
from kubesim import EmulatedCluster, KubeletThread

ROOT = Path(__file__).resolve().parents[2]
__all__ = ["OperatorProcess"]

# Snappy tests: a short lease and short grace periods (the operator reacts to events, no loop to speed up).
TEST_SETTINGS = {
    "lease_duration_seconds": 3,
    "stop_grace_seconds": 15,
    "pod_grace_seconds": 10,
    "default_image": "agentrun:test",
}


def start_operator(cluster: EmulatedCluster, workdir: Path, identity: str = "op-1", **env: str) -> OperatorProcess:
    """The operator against ``cluster`` (or ``KUBECONFIG=...``), ``AGENTRUN_OPERATOR_*`` variables in ``env``."""
    kubeconfig = Path(env.pop("KUBECONFIG", cluster.kubeconfig))
    return launch.start_operator(
        kubeconfig,
        identity=identity,
        log_path=workdir / f"operator-{identity}-{time.monotonic_ns()}.log",
        settings=TEST_SETTINGS,
        env={"PYTHONPATH": str(ROOT), **env},
        cwd=ROOT,
    )


def store_secret(
    cluster: EmulatedCluster, dsn: str, name: str = "agentrun-store", namespace: str = "default", *, opt_in: bool = True
) -> None:
    """The Secret an AgentRun's ``spec.store.secretRef`` names: ``postgresDsn`` only.

    ``opt_in``: labelled ``agentrun.dev/runner-access: "true"``, as a Secret other than the operator's default
    store Secret must be (decide.access).
    """
    made = cluster.kubectl("create", "secret", "generic", name, "-n", namespace, f"--from-literal=postgresDsn={dsn}")
    assert made.returncode == 0, made.stderr
    if opt_in:
        labelled = cluster.kubectl("label", "secret", name, "-n", namespace, "agentrun.dev/runner-access=true")
        assert labelled.returncode == 0, labelled.stderr


def status(cluster: EmulatedCluster, name: str, namespace: str = "default") -> dict[str, Any]:
    run = cluster.get("agentruns", name, namespace)
    return (run or {}).get("status") or {}


def run_events(cluster: EmulatedCluster, name: str) -> list[dict[str, Any]]:
    """The Events about object ``name`` in namespace default."""
    return [e for e in cluster.list_objects("events", "default") if e.get("involvedObject", {}).get("name") == name]


def wait_phase(
    cluster: EmulatedCluster,
    operator: OperatorProcess,
    name: str,
    phase: str,
    *,
    timeout: float = 60,
    interval: float = 0.1,
    namespace: str = "default",
) -> dict[str, Any]:
    """The run's status once it is in ``phase``; fails with the status and the operator's log tail."""

    def reached() -> dict[str, Any] | None:
        now = status(cluster, name, namespace)
        return now if now.get("phase") == phase else None

    try:
        return cluster.wait_for(
            reached,
            timeout=timeout,
            interval=interval,
            message=f"{name} in phase {phase}",
        )
    except AssertionError:
        raise AssertionError(
            f"{name} never reached {phase}; status: {json.dumps(status(cluster, name, namespace))}\n"
            f"operator log (tail):\n{operator.log()[-4000:]}"
        ) from None


def pods_of(cluster: EmulatedCluster, run: str) -> list[str]:
    """The names of the run's pods now, in namespace default."""
    return sorted(
        p["metadata"]["name"]
        for p in cluster.list_objects("pods", "default")
        if p["metadata"].get("labels", {}).get("agentrun.dev/run") == run
    )


def operator_pods(cluster: EmulatedCluster) -> dict[str, list[str]]:
    """Run name -> its pods, in namespace default."""
    pods: dict[str, list[str]] = {}
    for pod in cluster.list_objects("pods", "default"):
        run = pod["metadata"].get("labels", {}).get("agentrun.dev/run")
        if run:
            pods.setdefault(run, []).append(pod["metadata"]["name"])
    return pods


def wait_node(dsn: str, thread: str, node: str, timeout: float = 30) -> None:
    """Returns once the thread runs ``node`` (its store progress says so)."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = progress(dsn, thread)
        if seen is not None and seen.current_node == node and seen.status == "running":
            return
        time.sleep(0.1)
    last = "nothing in the store" if seen is None else f"node {seen.current_node}, {seen.status}"
    raise AssertionError(f"thread {thread} never reached node {node} in {timeout:.0f} s (last seen: {last})")


def agentrun(
    name: str,
    *,
    thread: str,
    graph: str = "examples.support_agent:app",
    effects: Path,
    text: str = "charge my saved card for order 4821 and email me the receipt",
    env: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    variables = [
        {"name": "SUPPORT_EFFECTS_DB", "value": str(effects)},
        {"name": "CLUSTER_EFFECTS", "value": str(effects) + ".log"},
    ]
    variables += [{"name": k, "value": v} for k, v in (env or {}).items()]
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "graph": graph,
            "threadId": thread,
            "input": {"messages": [{"role": "user", "content": text}]},
            "store": {"secretRef": {"name": "agentrun-store"}},
            "podTemplate": {"env": variables},
            **spec,
        },
    }


def apply(cluster: EmulatedCluster, manifest: dict[str, Any], namespace: str = "default") -> None:
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))
    assert result.returncode == 0, result.stderr


def progress(dsn: str, thread: str) -> Progress | None:
    async def read() -> Progress | None:
        store = PgCheckpointer(dsn)
        try:
            return await store.aget_progress(thread)
        finally:
            await store.aclose()

    return asyncio.run(read())


def executions(effects: Path) -> list[str]:
    path = Path(str(effects) + ".log")
    return path.read_text().splitlines() if path.exists() else []


# --- the operator tests' fixtures: a module takes them with ``store, operator = harness.store, harness.operator``


@pytest.fixture
def store(cluster: EmulatedCluster, dsn: str) -> str:
    for namespace in ("default",):
        result = cluster.kubectl(
            "create", "secret", "generic", "agentrun-store", "-n", namespace, f"--from-literal=postgresDsn={dsn}"
        )
        assert result.returncode == 0, result.stderr
    return dsn


@pytest.fixture
def operator(cluster: EmulatedCluster, kubelet: KubeletThread, store: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    process = start_operator(cluster, tmp_path)
    try:
        yield process
    finally:
        process.stop()


# --- what the operator tests read -------------------------------------------------------------------------------


def table(output: str) -> list[list[str]]:
    """kubectl's columns, cut at the header's offsets (so an empty cell stays an empty string)."""
    header, *rows = output.rstrip().splitlines()
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    return [[line[a:b].strip() for a, b in bounds] for line in (header, *rows)]


NO_SUCH_ORDER = "charge my saved card for order 9999 and email me the receipt"


def invocations(effects: Path, tool: str) -> int:
    """How many times ``tool`` actually ran (every call is logged, whatever the idempotency key)."""
    if not effects.exists():
        return 0
    conn = sqlite3.connect(effects)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM tool_invocations WHERE tool = ?", (tool,)).fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


def tool_calls_counted(operator: OperatorProcess) -> float:
    """``agentrun_operator_tool_calls_total`` of namespace default, every outcome (this operator process's)."""
    samples = [
        line
        for line in operator.metrics().splitlines()
        if line.startswith("agentrun_operator_tool_calls_total{") and 'namespace="default"' in line
    ]
    return sum(float(line.rsplit(" ", 1)[1]) for line in samples)
