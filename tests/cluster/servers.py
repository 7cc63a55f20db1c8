"""The cluster tier's two API servers: kubesim's emulator, and the real control plane (``kubesim.real``).

A test runs on kubesim unless it is marked ``@pytest.mark.real_server``: then it runs on the real
control plane only (``[real]``), and on kubesim too (``[kubesim]``) when it is also marked ``kubesim_too``,
because kubesim adds something there (``--api-server=both`` runs every real_server test on both,
``=real`` or ``=kubesim`` on that one; ``conftest.pytest_generate_tests`` decides). The real control plane is
started once per session (its binaries come from ``make k8s``); each test gets it as it was after start:

- ``RealCluster`` installs the CRDs once, shapes the plane like ``EmulatedCluster`` for the tests (``history``
  records every version of the objects a test watched, from a real watch) and, after each test, deletes
  what the test left: AgentRuns, pods (at once), Secrets, Events, Leases, namespaces (emptied and finalized
  at once, as the namespace controller would after its fixed 5 s wait), Nodes of earlier
  kubelets, cluster roles and bindings and CRDs that were not there at the start;
- every difference between the two servers a test finds is a bug in kubesim or in the operator, never a
  reason for a test to ask which server it runs on (the few that must, say why).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from kubesim.cluster import ApiResponse
from kubesim.real import RealControlPlane

# Namespaced kinds a test may leave behind, deleted after it (in every namespace it touched).
NAMESPACED = (
    "agentruns",
    "pods",
    "secrets",
    "configmaps",
    "events",
    "leases",
    "roles",
    "rolebindings",
    "deployments",
)
CLUSTER_SCOPED = ("clusterroles", "clusterrolebindings", "customresourcedefinitions", "namespaces", "nodes")
KEPT_CONFIGMAPS = ("kube-root-ca.crt",)
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


class RealCluster:
    """A ``RealControlPlane`` with the ``EmulatedCluster`` surface the cluster tier uses."""

    def __init__(self, plane: RealControlPlane, crd_files: Sequence[Path]) -> None:
        self.plane = plane
        self.kubeconfig = plane.kubeconfig
        self.url = plane.url
        self.internal_errors: list[Exception] = []
        self._recorders: dict[tuple[str, str | None], _Recorder] = {}
        for path in crd_files:
            applied = plane.kubectl("apply", "--server-side", "-f", str(path))
            assert applied.returncode == 0, applied.stderr
        for path in crd_files:
            for doc in yaml.safe_load_all(path.read_text()):
                if doc and doc.get("kind") == "CustomResourceDefinition":
                    name: str = doc["metadata"]["name"]

                    def established(crd: str = name) -> bool:
                        return _established(plane.get("customresourcedefinitions", crd, None))

                    plane.wait_for(established, timeout=30, message=f"CRD {name} established")
        self._baseline = {kind: set(self._names(kind)) for kind in CLUSTER_SCOPED}

    # -- the EmulatedCluster surface -----------------------------------------------------------------

    def kubectl(self, *args: str, **kwargs: Any) -> Any:
        return self.plane.kubectl(*args, **kwargs)

    def kubectl_popen(self, *args: str) -> Any:
        return self.plane.kubectl_popen(*args)

    def api(self, method: str, path: str, body: Any = None, **kwargs: Any) -> ApiResponse:
        return self.plane.api(method, path, body, **kwargs)

    def get(self, resource: str, name: str, namespace: str | None = "default") -> dict[str, Any] | None:
        return self.plane.get(resource, name, namespace)

    def list_objects(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return self.plane.list_objects(resource, namespace)

    def wait_for(self, predicate: Any, **kwargs: Any) -> Any:
        return self.plane.wait_for(predicate, **kwargs)

    def watch(self, resource: str, namespace: str | None = None) -> None:
        """Start recording ``resource``'s versions (``history``); the cluster tier records AgentRuns from the start."""
        key = (resource, namespace)
        if key not in self._recorders:
            self._recorders[key] = _Recorder(self.plane, resource, namespace)

    def history(self, resource: str, name: str, namespace: str | None = "default") -> list[dict[str, Any] | None]:
        """Every version of the object seen by the watch since ``watch()`` (None: deleted), as kubesim's."""
        recorder = self._recorders.get((resource, None)) or self._recorders.get((resource, namespace))
        assert recorder is not None, f"history of {resource} needs cluster.watch({resource!r}) first"
        return recorder.versions(namespace, name)

    # -- between tests -------------------------------------------------------------------------------

    def stop_watches(self) -> None:
        for recorder in self._recorders.values():
            recorder.stop()
        self._recorders.clear()

    def reset(self) -> None:
        """Delete what the last test left (see the module docstring) and wait until it is gone."""
        self.stop_watches()
        namespaces = set(self._names("namespaces"))
        kept = sorted(namespaces & self._baseline["namespaces"] - {"kube-system", "kube-public", "kube-node-lease"})
        gone = namespaces - self._baseline["namespaces"] - set(SYSTEM_NAMESPACES)
        for namespace in kept:
            for kind in NAMESPACED:
                for obj in self._list(kind, namespace):
                    name = obj["metadata"]["name"]
                    if kind == "configmaps" and name in KEPT_CONFIGMAPS:
                        continue
                    self._delete(kind, name, namespace)
        for kind in CLUSTER_SCOPED:  # the test's namespaces turn Terminating: nothing new can be created in them
            for name in set(self._names(kind)) - self._baseline[kind] - set(SYSTEM_NAMESPACES):
                self._delete(kind, name, None)
        if gone:
            collections = self._namespaced_collections()
            for namespace in gone:
                self._empty_and_finalize(namespace, collections)
        self.plane.wait_for(
            lambda: not any(self._list(k, n) for n in kept for k in ("pods", "agentruns")),
            timeout=60,
            message="the previous test's pods and AgentRuns are gone",
        )
        self.plane.wait_for(
            lambda: not (set(self._names("namespaces")) - self._baseline["namespaces"] - set(SYSTEM_NAMESPACES)),
            timeout=120,
            message="the previous test's namespaces are gone",
        )

    def _namespaced_collections(self) -> list[str]:
        """The path prefix (``/apis/apps/v1``) and name of every namespaced resource that can be listed and
        deleted as a collection, by discovery (a CRD a test installed included)."""
        prefixes = ["/api/v1"] + [
            f"/apis/{g['preferredVersion']['groupVersion']}" for g in self.plane.api("GET", "/apis").body["groups"]
        ]
        found = []
        for prefix in prefixes:
            listing = self.plane.api("GET", prefix)
            for r in listing.body.get("resources", []) if listing.status == 200 else []:
                if r["namespaced"] and "/" not in r["name"] and {"list", "deletecollection"} <= set(r["verbs"]):
                    found.append(f"{prefix}|{r['name']}")
        return found

    def _empty_and_finalize(self, namespace: str, collections: Sequence[str]) -> None:
        """What kube-controller-manager's namespace controller does for a deleted namespace, without its fixed 5 s
        wait first (``namespaceDeletionGracePeriod``, for HA API servers: this plane has one). The namespace is
        Terminating already, so nothing new can be created in it: delete every collection in it, and once every
        list is empty, clear its ``kubernetes`` finalizer so the API server removes it. If anything is left (an
        object with a finalizer of its own), the controller finishes the job as before."""
        options = {"gracePeriodSeconds": 0, "propagationPolicy": "Background"}
        paths = [f"{prefix}/namespaces/{namespace}/{name}" for prefix, name in (c.split("|") for c in collections)]
        full = [path for path in paths if self._any(path)]
        for path in full:
            self.plane.api("DELETE", path, options)
        if any(self._any(path) for path in full):
            return
        current = self.plane.api("GET", f"/api/v1/namespaces/{namespace}")
        if current.status != 200 or not (current.body.get("metadata") or {}).get("deletionTimestamp"):
            return
        current.body["spec"]["finalizers"] = []
        self.plane.api("PUT", f"/api/v1/namespaces/{namespace}/finalize", current.body)

    def _any(self, path: str) -> bool:
        listed = self.plane.api("GET", path, params={"limit": "1"})
        return listed.status == 200 and bool(listed.body.get("items"))

    def _list(self, kind: str, namespace: str | None) -> list[dict[str, Any]]:
        try:
            path = self.plane.resource_path(kind, namespace)
        except KeyError:  # a kind this server does not serve (a CRD the test removed)
            return []

        def listed() -> ApiResponse | None:  # 429 while a CRD created just now starts its storage
            response = self.plane.api("GET", path)
            return None if response.status == 429 else response

        response = self.plane.wait_for(listed, timeout=30, interval=0.5, message=f"LIST {kind} past its 429")
        if response.status == 404:  # the kind went away between discovery and the list
            return []
        assert response.status == 200, f"LIST {kind} in {namespace}: {response}"
        items: list[dict[str, Any]] = response.body["items"]
        return items

    def _names(self, kind: str) -> Iterable[str]:
        return [o["metadata"]["name"] for o in self._list(kind, None)]

    def _delete(self, kind: str, name: str, namespace: str | None) -> None:
        options = {"gracePeriodSeconds": 0, "propagationPolicy": "Background"}
        self.plane.api("DELETE", self.plane.resource_path(kind, namespace, name), options)


def _established(crd: dict[str, Any] | None) -> bool:
    conditions = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


class _Recorder:
    """A real watch of one resource, keeping every version of every object (kubesim's ``history``)."""

    def __init__(self, plane: RealControlPlane, resource: str, namespace: str | None) -> None:
        self.plane = plane
        self.path = plane.resource_path(resource, namespace)
        self._versions: dict[tuple[str, str], list[dict[str, Any] | None]] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()

        def listed() -> ApiResponse | None:  # 429 while a new CRD's storage starts
            response = plane.api("GET", self.path)
            return response if response.status == 200 else None

        listing = plane.wait_for(listed, timeout=30, interval=0.2, message=f"a listing of {self.path}")
        for item in listing.body["items"]:
            self._add("ADDED", item)
        self._rv = listing.body["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, name=f"watch-{resource}", daemon=True)
        self._thread.start()

    def _add(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace") or "", meta.get("name") or "")
        with self._lock:
            self._versions.setdefault(key, []).append(None if kind == "DELETED" else obj)

    def versions(self, namespace: str | None, name: str) -> list[dict[str, Any] | None]:
        with self._lock:
            return list(self._versions.get((namespace or "", name), []))

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        access = self.plane.admin
        while not self._stopped.is_set():
            query = urllib.parse.urlencode({"watch": "1", "resourceVersion": self._rv, "timeoutSeconds": "5"})
            request = urllib.request.Request(
                f"{self.plane.url}{self.path}?{query}", headers={"Accept": "application/json", **access.headers()}
            )
            try:
                with urllib.request.urlopen(request, timeout=15, context=access.ssl_context()) as stream:
                    for line in stream:
                        if self._stopped.is_set():
                            return
                        event = json.loads(line)
                        if event.get("type") == "ERROR":  # 410 Gone: list again from now
                            self._rv = self.plane.api("GET", self.path).body["metadata"]["resourceVersion"]
                            break
                        obj = event.get("object") or {}
                        self._rv = (obj.get("metadata") or {}).get("resourceVersion", self._rv)
                        self._add(str(event.get("type")), obj)
            except OSError:
                time.sleep(0.2)  # the server restarting, or a timeout between events: watch again
