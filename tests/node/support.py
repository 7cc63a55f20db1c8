"""The chart installed for real on the node (issue 35 item 3), and what the node's scenarios read from it.

``install_chart()`` does what a platform engineer does on a new cluster, with real tools:

- a PostgreSQL for the runs, reachable from pods: a server of its own listening on the node's host
  address (``kubesim.node``: the one host address pods reach), a role ``agentrun`` with a password
  allowed from the pods' subnet only (loopback stays the test's, trusted);
- the release namespace labelled for the restricted Pod Security profile (the chart's own pods must
  pass it), with the store Secret the history server reads;
- ``helm install`` of ``helm/agentrun`` (real Helm 4, ``helm_python``), waiting for the Deployments
  to be ready, with only what this environment needs as values (``chart_values()``): the images
  built here and ``pullPolicy: Never`` (no registry is reachable), the demo image for runners (the
  examples' graphs live in it).

Then kube-scheduler puts the operator's two replicas and the history server on the node as
containers, the operator pod (its ServiceAccount's projected token, its RBAC) leads through its
Lease and creates runner pods, which the kubelet runs with containerd and runc. Nothing here starts
a process of the operator or the runner on this machine.

``InstalledChart`` is the interface the scenarios use (kept stable: another helper's scenarios
use it too): a namespace per test (``new_namespace()``, restricted, with the store Secret),
``kubectl()``, the run's status and pods, the operator pods and the leader, the store's ledger,
a container killed by the runtime (``kill_container()``), and a file of each pod's ``/tmp`` kept from the
node's disk (``KeptFiles``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from agentrun.checkpoint.postgres import PgCheckpointer
from agentrun_dev import chart_on_node as node_chart
from agentrun_dev.chart_on_node import (
    RELEASE,
    RELEASE_NAMESPACE,
    RESTRICTED,
    Store,
    install_release,
    running_store,
    store_secret,
    uninstall_release,
)
from agentrun_dev.chart_on_node import STORE_ROLE as STORE_ROLE  # re-exported: the scenarios use it
from agentrun_dev.chart_on_node import ChartError as ChartError  # re-exported: conftest uses it

if TYPE_CHECKING:
    from agentrun.checkpoint.base import LedgerEntry
    from kubesim.node import NodeCluster, RealNode
    from kubesim.real import RealControlPlane
    from tests.node.conftest import Images

ROOT = Path(__file__).resolve().parents[2]
RUN_LABEL = "agentrun.dev/run"
OPERATOR_SELECTOR = "app.kubernetes.io/component=operator"
HISTORY_SELECTOR = "app.kubernetes.io/component=history"

T = TypeVar("T")


# The operator gives up a pod on a lost node this long after its grace period (the chart's default is 60 s): the
# lost-node test waits through it, and 50 s less of nothing but waiting is CI time.
LOST_NODE_TIMEOUT = 10


def chart_values(images: Images) -> dict[str, Any]:
    """The chart's values for this node (``agentrun_dev.chart_on_node.chart_values``) with the images built here,
    and a short lost-node timeout."""
    values = node_chart.chart_values(images.runtime, images.demo)
    values["operator"] = {"lostNodeTimeoutSeconds": LOST_NODE_TIMEOUT}
    return values


@dataclass
class InstalledChart:
    """helm/agentrun installed on the node; the scenarios' handles (see the module docstring)."""

    cluster: NodeCluster
    store: Store
    release: dict[str, Any]
    values: dict[str, Any]
    workdir: Path
    namespace: str = RELEASE_NAMESPACE
    _namespaces: list[str] = field(default_factory=list)

    # --- the cluster --------------------------------------------------------------------------------------------

    @property
    def plane(self) -> RealControlPlane:
        """The real control plane (admin access)."""
        assert self.cluster.plane is not None
        return self.cluster.plane

    @property
    def node(self) -> RealNode:
        """The real node (containerd, kubelet): ``node.ctr(...)``, ``node.name``, ``node.host_address``."""
        return self.cluster.node

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig (a bearer token: ``kubectl agentrun history|ui`` can carry it)."""
        return self.plane.kubeconfig

    def kubectl_env(self) -> dict[str, str]:
        """The environment ``kubectl()`` runs in: the admin kubeconfig, this virtualenv's bin first on PATH
        (``kubectl agentrun`` is the ``kubectl-agentrun`` installed there)."""
        venv_bin = str(Path(sys.executable).parent)
        path = os.pathsep.join([venv_bin, os.environ.get("PATH", "")])
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": path, "PYTHONUNBUFFERED": "1"}

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """The real ``kubectl`` with the admin kubeconfig (``kubectl_env()``)."""
        return subprocess.run(
            ["kubectl", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.kubectl_env(),
            check=False,
        )

    def wait_for(self, check: Callable[[], T | None], *, timeout: float, message: str, interval: float = 0.5) -> T:
        """``check()``'s first truthy answer; after ``timeout`` an AssertionError with ``message`` and the pods."""
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {message}\n{self.diagnostics()}")
            time.sleep(interval)

    def new_namespace(self, prefix: str = "runs") -> str:
        """A fresh namespace enforcing the restricted Pod Security profile, with the store Secret
        (``agentrun-store``: ``postgresDsn`` as pods reach the store). Deleted by ``delete_namespaces()``."""
        name = f"{prefix}-{secrets.token_hex(3)}"
        self.plane.create_namespace(name, labels=RESTRICTED)
        self._store_secret(name)
        self._namespaces.append(name)
        return name

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace of ``new_namespace()``: its runs, pods and Secret (the threads stay in the store)."""
        self.plane.api("DELETE", f"/api/v1/namespaces/{name}")
        with contextlib.suppress(ValueError):
            self._namespaces.remove(name)

    # --- the chart's pods ---------------------------------------------------------------------------------------

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Pods matching a label selector, oldest first."""
        found = self.plane.api("GET", f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector})
        items: list[dict[str, Any]] = found.body.get("items", [])
        return sorted(items, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))

    def operator_pods(self) -> list[dict[str, Any]]:
        """The operator Deployment's pods (the release namespace), oldest first."""
        return self.pods(self.namespace, OPERATOR_SELECTOR)

    def history_pods(self) -> list[dict[str, Any]]:
        """The history server Deployment's pods, oldest first."""
        return self.pods(self.namespace, HISTORY_SELECTOR)

    def leader(self) -> str | None:
        """The operator pod holding the leader Lease (its name is its identity), or None."""
        lease = self.plane.get("leases", f"{RELEASE}-operator", self.namespace)
        holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
        return str(holder) if holder else None

    def wait_for_leader(
        self, timeout: float = 120, *, other_than: str | None = None, excluding: Collection[str] = ()
    ) -> str:
        """The name of a Ready operator pod holding the Lease, neither ``other_than`` nor one of ``excluding``."""
        refused = {*excluding, *([other_than] if other_than else [])}

        def running_leader() -> str | None:
            holder = self.leader()
            running = {p["metadata"]["name"] for p in self.operator_pods() if _ready(p)}
            return holder if holder in running and holder not in refused else None

        return self.wait_for(running_leader, timeout=timeout, message="a Ready operator pod to hold the Lease")

    def wait_operator_ready(self, timeout: float = 180) -> list[dict[str, Any]]:
        """The operator Deployment's pods once as many are Ready as it wants (none terminating), and one leads."""
        deployment = self.plane.get("deployments", f"{RELEASE}-operator", self.namespace)
        wanted = int((deployment or {}).get("spec", {}).get("replicas", 0))

        def ready() -> list[dict[str, Any]] | None:
            pods = self.operator_pods()
            return pods if len(pods) == wanted and all(_ready(p) for p in pods) else None

        pods = self.wait_for(ready, timeout=timeout, message=f"{wanted} Ready operator pods")
        self.wait_for_leader(timeout)
        return pods

    # --- runs ---------------------------------------------------------------------------------------------------

    def run(self, namespace: str, name: str) -> dict[str, Any]:
        """The AgentRun (AssertionError when it does not exist)."""
        found = self.plane.get("agentruns", name, namespace)
        assert found is not None, f"no AgentRun {namespace}/{name}"
        return found

    def wait_phase(self, namespace: str, name: str, *phases: str, timeout: float = 180) -> dict[str, Any]:
        """The run's status once its phase is one of ``phases``."""

        def reached() -> dict[str, Any] | None:
            status = (self.plane.get("agentruns", name, namespace) or {}).get("status") or {}
            return status if status.get("phase") in phases else None

        return self.wait_for(
            reached, timeout=timeout, message=f"AgentRun {namespace}/{name} to be {' or '.join(phases)}"
        )

    def runner_pods(self, namespace: str, run: str) -> list[dict[str, Any]]:
        """The run's runner pods (``<run>-<attempt>``), oldest first."""
        return self.pods(namespace, f"{RUN_LABEL}={run}")

    def wait_runner(self, namespace: str, pod: str, timeout: float = 180) -> dict[str, Any]:
        """The runner pod once its container runs (a containerd task exists for it)."""

        def started() -> dict[str, Any] | None:
            found = self.plane.get("pods", pod, namespace)
            statuses = ((found or {}).get("status") or {}).get("containerStatuses") or []
            return found if statuses and "running" in (statuses[0].get("state") or {}) else None

        return self.wait_for(started, timeout=timeout, message=f"pod {namespace}/{pod} running")

    def wait_pod_ended(self, namespace: str, pod: str, timeout: float = 120) -> dict[str, Any]:
        """The pod once it has Succeeded or Failed (the run's phase comes from the store, often before)."""

        def ended() -> dict[str, Any] | None:
            found = self.plane.get("pods", pod, namespace)
            return found if (found or {}).get("status", {}).get("phase") in ("Succeeded", "Failed") else None

        return self.wait_for(ended, timeout=timeout, message=f"pod {namespace}/{pod} to end")

    def logs(self, namespace: str, pod: str) -> str:
        """``kubectl logs`` of a pod (the API server asks the real kubelet, which reads containerd's log file)."""
        done = self.kubectl("logs", "-n", namespace, pod)
        assert done.returncode == 0, f"kubectl logs {namespace}/{pod}: {done.stderr}"
        return done.stdout

    # --- the runtime --------------------------------------------------------------------------------------------

    def container_id(self, pod: dict[str, Any]) -> str:
        """The containerd id of the pod's first container (``containerd://<id>`` in its status)."""
        statuses = pod.get("status", {}).get("containerStatuses") or []
        assert statuses and statuses[0].get("containerID"), f"pod {pod['metadata']['name']} has no container yet"
        return str(statuses[0]["containerID"]).split("://", 1)[1]

    def kill_container(self, pod: dict[str, Any], sig: signal.Signals = signal.SIGKILL) -> None:
        """Signal the container's process 1 through containerd (``ctr task kill``): the runtime's kill, as the
        kernel's OOM killer or a node's shutdown delivers it, not a signal the runner sends itself."""
        done = self.node.ctr("tasks", "kill", "--signal", sig.name, self.container_id(pod), timeout=30)
        assert done.returncode == 0, f"ctr tasks kill: {done.stderr}"

    def container_pid(self, pod: dict[str, Any]) -> int:
        """The host pid of the container's process 1 (``ctr task ls``)."""
        cid = self.container_id(pod)
        listed = self.node.ctr("tasks", "list", timeout=30).stdout.splitlines()
        for line in listed[1:]:
            parts = line.split()
            if parts and parts[0] == cid:
                return int(parts[1])
        raise AssertionError(f"no containerd task {cid} for pod {pod['metadata']['name']}: {listed}")

    # --- the store ----------------------------------------------------------------------------------------------

    def ledger(self, thread: str) -> list[LedgerEntry]:
        """The thread's recorded tool calls (``<namespace>/<threadId>``), read from PostgreSQL by the test."""

        async def read() -> list[LedgerEntry]:
            store = PgCheckpointer(self.store.dsn)
            try:
                return list(await store.ledger_list(thread))
            finally:
                await store.aclose()

        return asyncio.run(read())

    # --- diagnostics --------------------------------------------------------------------------------------------

    def diagnostics(self) -> str:
        """The pods of the release, the runs and the leader, and the last lines of the leader's log (for failures)."""
        lines = [f"leader: {self.leader()}"]
        shown = self.kubectl("get", "pods,agentruns", "-A", "-o", "wide", timeout=30)
        lines.append(shown.stdout or shown.stderr)
        leader = self.leader()
        if leader:
            tail = self.kubectl("logs", "-n", self.namespace, leader, "--tail=30", timeout=30)
            lines.append(f"--- {leader} ---\n{tail.stdout or tail.stderr}")
        return "\n".join(lines)

    # --- internals ----------------------------------------------------------------------------------------------

    def _store_secret(self, namespace: str) -> None:
        store_secret(self.plane, namespace, self.store.pod_dsn)


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    deleting = pod["metadata"].get("deletionTimestamp") is not None
    return not deleting and any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@contextlib.contextmanager
def install_chart(cluster: NodeCluster, images: Images, workdir: Path) -> Iterator[InstalledChart]:
    """``helm install`` of helm/agentrun on ``cluster``'s node with a store of its own; uninstalled after."""
    plane = cluster.plane
    assert plane is not None
    values = chart_values(images)
    with running_store(cluster.node) as store:
        chart = InstalledChart(cluster=cluster, store=store, release={}, values=values, workdir=workdir)
        chart.release = install_release(plane, values, pod_dsn=store.pod_dsn, diagnostics=chart.diagnostics)
        try:
            chart.wait_for_leader(timeout=120)
            yield chart
        finally:
            for namespace in list(chart._namespaces):
                chart.delete_namespace(namespace)
            uninstall_release(plane)


class KeptFiles:
    """The file ``name`` of every pod's emptyDir ``/tmp``, as the pod left it, read from the node's disk.

    The kubelet removes a pod's emptyDir as soon as the pod has ended, and runner pods get no other
    volume: a provider's records a graph keeps in /tmp (examples/support_agent.py's SQLite file) would
    go with it. While ``keep()`` runs, a thread of the test looks for the file in each pod's emptyDir
    on the node's disk (every 20 ms) and hard-links it as soon as it appears: the pod goes on writing
    the same inode, which outlives the emptyDir. The file appears when the graph's first tool with
    effects runs, seconds after the container started; the pod ends a second or more after it.
    """

    def __init__(self, chart: InstalledChart, name: str) -> None:
        self.name = name
        self._pods = chart.node.slot.data_dir / "kubelet" / "pods"
        # Inside the kubelet's root: a hard link cannot cross its bind mount.
        self.folder = chart.node.slot.data_dir / "kubelet" / f"kept-by-tests-{secrets.token_hex(3)}"
        self.by_uid: dict[str, Path] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()

    def path(self, pod: dict[str, Any]) -> Path | None:
        """The kept file of ``pod``, or None when the pod never wrote it."""
        return self.by_uid.get(pod["metadata"]["uid"])

    @contextlib.contextmanager
    def keep(self) -> Iterator[KeptFiles]:
        """Keep files while the block runs (and until the thread's last look after it)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        watcher = threading.Thread(target=self._watch, name="kept-files", daemon=True)
        watcher.start()
        try:
            yield self
        finally:
            self._stop.set()
            watcher.join(timeout=10)
        assert not self.errors, f"files of the pods' /tmp could not be kept: {self.errors}"

    def _watch(self) -> None:
        while True:
            stopping = self._stop.is_set()
            for found in self._pods.glob(f"*/volumes/kubernetes.io~empty-dir/tmp/{self.name}"):
                uid = found.parts[-5]  # pods/<uid>/volumes/kubernetes.io~empty-dir/tmp/<name>
                if uid not in self.by_uid:
                    kept = self.folder / f"{uid}-{self.name}"
                    try:
                        os.link(found, kept)
                        self.by_uid[uid] = kept
                    except FileNotFoundError:  # the emptyDir went meanwhile: nothing left to keep
                        pass
                    except OSError as e:  # said by keep() when the block ends
                        self.errors.append(f"{found} -> {kept}: {e}")
            if stopping:
                return
            time.sleep(0.02)


def release_objects(chart: InstalledChart) -> list[dict[str, Any]]:
    """The objects of the installed release, as Helm rendered them."""
    return [doc for doc in yaml.safe_load_all(chart.release.get("manifest", "")) if doc]


def dump(value: Any) -> str:
    """JSON for an assertion message."""
    return json.dumps(value, indent=1, default=str)[:4000]
