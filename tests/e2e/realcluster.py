"""Driving a real cluster from the tests: the real ``kubectl`` with the given kubeconfig, the store
through a ``kubectl port-forward``, and (on kind only) a SIGKILL from outside a pod's PID namespace.

Everything is polled, never watched: a poll that fails says what it saw last, and a real
cluster is slow in ways an emulator is not (image pulls, scheduling, kubelet sync periods).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from agentrun.checkpoint.base import LedgerEntry, Progress
from agentrun.checkpoint.postgres import PgCheckpointer

T = TypeVar("T")
# The ``new_run`` fixture: (scenario, *, env=None, **spec) -> the name of the applied AgentRun.
NewRun = Callable[..., str]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agentrun.yaml"
KUBECTL = os.environ.get("AGENTRUN_E2E_KUBECTL") or shutil.which("kubectl") or "kubectl"
DOCKER = shutil.which("docker") or "docker"
OPERATOR_NAMESPACE = "agentrun-system"
OPERATOR_SELECTOR = "app.kubernetes.io/name=agentrun-operator"
LEASE = "agentrun-operator"
TERMINAL = ("Succeeded", "Failed", "Stopped")


def wait_for(
    probe: Callable[[], T | None], *, timeout: float, interval: float = 2.0, message: Callable[[], str] | str = ""
) -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``message`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        seen = probe()
        if seen:
            return seen
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout:.0f}s: {text}")
        time.sleep(interval)


class Kubectl:
    """The real kubectl against the cluster of one kubeconfig; namespace ``default`` unless told."""

    def __init__(self, kubeconfig: str, namespace: str = "default") -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace

    def run(
        self, *args: str, input: str | None = None, timeout: float = 120.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        command = [KUBECTL, "--kubeconfig", self.kubeconfig, "--namespace", self.namespace, *args]
        result = subprocess.run(command, input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def json(self, *args: str) -> dict[str, Any] | None:
        """``kubectl get ... -o json``; ``None`` when the object does not exist."""
        result = self.run("get", *args, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr or "not found" in result.stderr:
                return None
            raise AssertionError(f"kubectl get {' '.join(args)} failed: {result.stderr.strip()}")
        body: dict[str, Any] = json.loads(result.stdout)
        return body

    def apply(self, manifest: dict[str, Any]) -> None:
        self.run("apply", "-f", "-", input=yaml.safe_dump(manifest))

    def run_status(self, name: str) -> dict[str, Any]:
        run = self.json("agentrun", name)
        return dict((run or {}).get("status") or {})

    def pods_of(self, run: str) -> list[dict[str, Any]]:
        listing = self.json("pods", "-l", f"agentrun.dev/run={run}") or {}
        return sorted(listing.get("items") or [], key=lambda p: p["metadata"]["name"])

    def pod_names(self, run: str) -> list[str]:
        return [p["metadata"]["name"] for p in self.pods_of(run)]

    def evict(self, pod: str) -> None:
        """Evict through the Eviction API, as ``kubectl drain`` and the cluster autoscaler do."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": self.namespace}}
        self.run(
            "create",
            "--raw",
            f"/api/v1/namespaces/{self.namespace}/pods/{pod}/eviction",
            "-f",
            "-",
            input=json.dumps(body),
        )

    def operator_log(self, tail: int = 80) -> str:
        result = self.run(
            "logs",
            "--namespace",
            OPERATOR_NAMESPACE,
            "-l",
            OPERATOR_SELECTOR,
            "--prefix",
            "--all-containers",
            f"--tail={tail}",
            check=False,
        )
        return result.stdout or result.stderr

    def diagnostics(self, run: str) -> str:
        """What to read when a scenario fails: the run's status, its pods and their logs, the operator's log."""
        parts = [f"status of {run}: {json.dumps(self.run_status(run), indent=1)}"]
        for pod in self.pods_of(run):
            name = pod["metadata"]["name"]
            states = [s.get("state") for s in (pod.get("status") or {}).get("containerStatuses") or []]
            parts.append(f"pod {name}: phase {pod.get('status', {}).get('phase')}, containers {json.dumps(states)}")
            parts.append(self.run("logs", name, "--tail=40", check=False).stdout)
        parts.append("operator log (tail):\n" + self.operator_log())
        return "\n".join(parts)


def wait_phase(kube: Kubectl, name: str, phase: str, *, timeout: float = 300) -> dict[str, Any]:
    """The run's status once it is in ``phase``; fails at once if it ends in another terminal phase."""

    def probe() -> dict[str, Any] | None:
        status = kube.run_status(name)
        current = status.get("phase")
        if current == phase:
            return status
        if current in TERMINAL:
            raise AssertionError(f"{name} ended {current}, expected {phase}\n{kube.diagnostics(name)}")
        return None

    return wait_for(probe, timeout=timeout, message=lambda: f"{name} never reached {phase}\n{kube.diagnostics(name)}")


class Store:
    """The cluster's PostgreSQL store, read through a port-forward (AGENTRUN_E2E_POSTGRES_DSN)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def _read(self, what: Callable[[PgCheckpointer], Awaitable[T]]) -> T:
        async def read() -> T:
            store = PgCheckpointer(self.dsn)
            try:
                return await what(store)
            finally:
                await store.aclose()

        return asyncio.run(read())

    def progress(self, thread: str) -> Progress | None:
        return self._read(lambda store: store.aget_progress(thread))

    def ledger(self, thread: str) -> list[LedgerEntry]:
        return self._read(lambda store: store.ledger_list(thread))

    def wait_node(self, thread: str, node: str, *, timeout: float = 300) -> Progress:
        """Wait until the thread runs ``node`` (the pod is up and inside that node)."""

        def probe() -> Progress | None:
            seen = self.progress(thread)
            return seen if seen is not None and seen.current_node == node and seen.status == "running" else None

        return wait_for(
            probe,
            timeout=timeout,
            interval=0.5,
            message=lambda: f"thread {thread} never ran node {node}; last: {self.progress(thread)}",
        )


def example_run(name: str, *, thread: str, env: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """examples/agentrun.yaml under a fresh name and thread, with extra pod env and spec fields."""
    manifest: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    manifest["metadata"] = {"name": name}
    manifest["spec"]["threadId"] = thread
    variables = manifest["spec"].setdefault("podTemplate", {}).setdefault("env", [])
    variables += [{"name": k, "value": v} for k, v in (env or {}).items()]
    manifest["spec"].update(spec)
    return manifest


def sigkill_from_the_node(pod: dict[str, Any], container: str = "runner") -> int:
    """SIGKILL a container's main process from its kind node; returns the killed PID (as the node sees it).

    Not ``kubectl exec ... kill -9 1``: the runner is PID 1 of its container, and the kernel
    ignores SIGKILL sent to a PID namespace's init from inside that namespace. From the node
    (kind runs each node as a Docker container named like the node) the signal comes from an
    ancestor namespace and kills it for real, exactly like the OOM killer or a crashing runtime.
    """
    node, name = pod["spec"]["nodeName"], pod["metadata"]["name"]
    namespace = pod["metadata"]["namespace"]

    def on_node(*args: str) -> str:
        result = subprocess.run([DOCKER, "exec", node, *args], capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise AssertionError(f"on kind node {node}: {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    ids = on_node(
        "crictl",
        "ps",
        "-q",
        "--name",
        f"^{container}$",
        "--label",
        f"io.kubernetes.pod.name={name}",
        "--label",
        f"io.kubernetes.pod.namespace={namespace}",
    ).split()
    assert len(ids) == 1, f"expected one running {container} container of pod {name} on {node}, found {ids}"
    pid = int(json.loads(on_node("crictl", "inspect", ids[0]))["info"]["pid"])
    on_node("sh", "-c", 'kill -KILL "$1"', "sh", str(pid))
    return pid
