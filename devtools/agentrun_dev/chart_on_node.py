"""helm/agentrun installed for real on the real node (``kubesim.node``): for ``agentrun-dev --api-server node``
and tests/node.

What a platform engineer does on a new cluster, with real tools:

- ``running_store()``: a PostgreSQL for the runs that pods reach, a server of its own listening on the
  node's host address (the one host address pods reach), role ``agentrun`` with a password allowed from
  the pods' subnet only (loopback stays this machine's, trusted);
- ``install_release()``: the release namespace labelled for the restricted Pod Security profile (the
  chart's own pods must pass it) with the store Secret the history server reads, then ``helm install``
  of ``helm/agentrun`` (real Helm 4, ``helm_python``) waiting for the Deployments to be ready, with
  only what this environment needs as values (``chart_values()``).

HAZARD: the store's role password is in the Secrets in clear (as any store Secret); the server listens
on the node's host address only, which nothing outside this machine reaches.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .servers import PrivatePostgres

if TYPE_CHECKING:
    from kubesim.node import NodeCluster, RealNode
    from kubesim.real import RealControlPlane

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "agentrun"
RELEASE = "agentrun"
RELEASE_NAMESPACE = "agentrun-system"
STORE_SECRET = "agentrun-store"  # the chart's store.defaultSecretName, and examples/agentrun.yaml's secretRef
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}
STORE_ROLE, STORE_DATABASE = "agentrun", "agentrun"
INSTALL_TIMEOUT = 300  # seconds for helm install --wait: the first pods of a cold node unpack the images
RUNTIME_IMAGE, DEMO_IMAGE = "localhost/agentrun:dev", "localhost/agentrun-demo:dev"  # make image's names


class ChartError(RuntimeError):
    """The chart could not be installed on the node; the message says what failed and where to look."""


def chart_values(runtime: str = RUNTIME_IMAGE, demo: str = DEMO_IMAGE) -> dict[str, Any]:
    """The chart's values for the node: only what the environment needs, every default kept.

    The images built here (``make image``) under the names the node imported them, never pulled; the
    runner pods run the demo image (runtime + ``examples/``) so ``examples/*.yaml`` work unchanged.
    """
    repository, tag = runtime.rsplit(":", 1)
    runner_repository, runner_tag = demo.rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "runner": {"image": {"repository": runner_repository, "tag": runner_tag}},
    }


@dataclass
class Store:
    """The runs' PostgreSQL: ``pod_dsn`` as pods reach it (in the store Secrets), ``dsn`` as this machine does."""

    postgres: PrivatePostgres
    pod_dsn: str
    dsn: str


@contextlib.contextmanager
def running_store(node: RealNode) -> Iterator[Store]:
    """PostgreSQL on the node's host address: role ``agentrun`` (a password) from the pods' subnet only."""
    password = secrets.token_hex(16)
    hba = [f"host {STORE_DATABASE} {STORE_ROLE} {node.pod_cidr} scram-sha-256"]
    postgres = PrivatePostgres(listen=[node.host_address], hba=hba, prefix="agentrun-node-pg-")
    with postgres.running():
        postgres.sql(f"CREATE ROLE {STORE_ROLE} LOGIN PASSWORD '{password}'")
        postgres.sql(f"CREATE DATABASE {STORE_DATABASE} OWNER {STORE_ROLE}")
        yield Store(
            postgres=postgres,
            pod_dsn=f"postgresql://{STORE_ROLE}:{password}@{node.host_address}:{postgres.port}/{STORE_DATABASE}",
            dsn=f"postgresql://postgres@127.0.0.1:{postgres.port}/{STORE_DATABASE}",
        )


def store_secret(plane: RealControlPlane, namespace: str, pod_dsn: str) -> None:
    """The Secret ``agentrun-store`` (``postgresDsn`` as pods reach the store) in ``namespace``."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": STORE_SECRET, "namespace": namespace},
        "stringData": {"postgresDsn": pod_dsn},
    }
    made = plane.api("POST", f"/api/v1/namespaces/{namespace}/secrets", secret)
    if made.status != 201:
        raise ChartError(f"the store Secret in {namespace} was refused: {made}")


def discovery_cache(url: str) -> Path:
    """Where Helm's client-go caches discovery for a server (by host and port only, for 6 hours)."""
    root = Path(os.environ.get("KUBECACHEDIR") or Path.home() / ".kube" / "cache")
    host = url.removeprefix("https://")
    return root / "discovery" / re.sub(r"[^(\w/.)]", "_", host)


def install_release(
    plane: RealControlPlane, values: dict[str, Any], *, pod_dsn: str, diagnostics: Callable[[], str]
) -> dict[str, Any]:
    """The restricted release namespace with the store Secret, then ``helm install --wait``: the release.

    ChartError with Helm's words and ``diagnostics()`` (the pods' state) when it fails.
    """
    import helm_python

    plane.create_namespace(RELEASE_NAMESPACE, labels=RESTRICTED)
    store_secret(plane, RELEASE_NAMESPACE, pod_dsn)
    # Another server's, from an earlier plane on this address and port, would name resources this one lacks.
    shutil.rmtree(discovery_cache(plane.url), ignore_errors=True)
    with helm_python.Config(kubeconfig_path=plane.kubeconfig, namespace=RELEASE_NAMESPACE) as helm:
        try:
            release: dict[str, Any] = helm.install(
                CHART, RELEASE, values, namespace=RELEASE_NAMESPACE, wait="watcher", timeout=INSTALL_TIMEOUT
            )
        except helm_python.HelmError as e:
            raise ChartError(f"helm install of {CHART} on the node failed: {e}\n{diagnostics()}") from e
    return release


def uninstall_release(plane: RealControlPlane) -> None:
    """``helm uninstall`` of the release (errors ignored: the node may be going), and Helm's discovery cache."""
    import helm_python

    with (
        helm_python.Config(kubeconfig_path=plane.kubeconfig, namespace=RELEASE_NAMESPACE) as helm,
        contextlib.suppress(helm_python.HelmError),
    ):
        helm.uninstall(RELEASE, timeout=60)
    shutil.rmtree(discovery_cache(plane.url), ignore_errors=True)


def wait_for_leader(plane: RealControlPlane, timeout: float = 120) -> str:
    """The operator pod holding the release's leader Lease (its identity); ChartError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lease = plane.get("leases", f"{RELEASE}-operator", RELEASE_NAMESPACE)
        holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
        if holder:
            return str(holder)
        time.sleep(0.5)
    raise ChartError(f"no operator pod took the Lease {RELEASE}-operator within {timeout} s\n{pod_states(plane)}")


def pod_states(plane: RealControlPlane) -> str:
    """Every pod's namespace, name, phase and waiting or terminated reasons: what to read when a wait fails."""
    found = plane.api("GET", "/api/v1/pods")
    lines = ["pods:"]
    for pod in (found.body or {}).get("items", []):
        reasons = [
            f"{c['name']}:{reason}"
            for c in pod.get("status", {}).get("containerStatuses") or []
            for state in (c.get("state") or {}).values()
            if (reason := (state or {}).get("reason"))
        ]
        meta = pod["metadata"]
        lines.append(f"  {meta['namespace']}/{meta['name']} {pod.get('status', {}).get('phase')} {' '.join(reasons)}")
    return "\n".join(lines)


@dataclass
class ChartOnNode:
    """``agentrun-dev --api-server node``: the real control plane and node, a store, the chart installed on it.

    ``start()`` raises ChartError (or kubesim's NodeError / ControlPlaneError) in words for the user, after
    stopping what it started; ``stop()`` stops the node (its pods first) and the plane, then the store.
    """

    workdir: Path
    cluster: NodeCluster | None = None
    store: Store | None = None
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def plane(self) -> RealControlPlane:
        """The real control plane (admin access)."""
        assert self.cluster is not None and self.cluster.plane is not None
        return self.cluster.plane

    def start(self, say: Callable[[str], None]) -> None:
        """The node with make image's images, the store, its Secret in ``default``, the chart, a leader."""
        from kubesim.node import NodeCluster, image_archives, image_cache

        archives = image_archives()
        for image in (RUNTIME_IMAGE, DEMO_IMAGE):
            if image not in archives:
                raise ChartError(f"the image {image} is not in {image_cache()}: run make image")
        self.cluster = NodeCluster(self.workdir, archives=archives)
        self.cluster.start()
        say(f"API server (real), node {self.cluster.node.name}")
        self.store = self._stack.enter_context(running_store(self.cluster.node))
        store_secret(self.plane, "default", self.store.pod_dsn)
        say("store (PostgreSQL)")
        install_release(
            self.plane, chart_values(), pod_dsn=self.store.pod_dsn, diagnostics=lambda: pod_states(self.plane)
        )
        wait_for_leader(self.plane)
        say("chart (operator, history server)")

    def stop(self) -> None:
        """The store, then the node's pods and daemons and the plane (the order tests/node stops them in)."""
        try:
            self._stack.close()
        finally:
            if self.cluster is not None:
                self.cluster.stop()
