"""Chart tier: the Helm chart, the manifests generated from it and the Dockerfile, without a cluster.

Real Helm (helm-python-sdk, the Helm v4 SDK) lints and renders ``helm/agentrun`` with its
default values and with each non-default combination users turn on (namespaced RBAC,
monitors, the dev store, the NetworkPolicy, all at once). Every rendered object must be valid
Kubernetes for two versions (kubernetes-validate, strict), the operator's RBAC must be exactly
the rules its code calls, every pod must meet the restricted Pod Security profile, the values
schema must reject bad values with a message naming the key, ``deploy/`` must be the chart's
rendering byte for byte, the chart's CRD must be ``crds/``'s file, and the Dockerfile must
build reproducibly (hashed lock, pinned base, no pip or examples at run time) and lint clean.

Each combination is rendered once per session (``rendering()`` caches it), so the tier stays
fast. What this tier cannot show: that a real API server accepts the objects (tests/cluster
installs the chart into the emulated cluster; ``make e2e-kind`` into kind) and that the image
builds (no container engine here).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "agentrun"
RELEASE = "agentrun"
NAMESPACE = "agentrun-system"

# name -> values. Each non-default switch alone, then all of them together.
COMBINATIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "monitors": {"metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}},
    "dev-store": {"devStore": {"enabled": True}},
    "network-policy": {"networkPolicy": {"enabled": True}},
    "everything": {
        "watchNamespaces": ["team-a", "team-b"],
        "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
        "devStore": {"enabled": True, "secretNamespaces": ["team-a", "team-b"]},
        "networkPolicy": {"enabled": True},
        "image": {"digest": "sha256:" + "0" * 64},
    },
}


@dataclass(frozen=True)
class Rendering:
    """One ``helm template``: the objects of every template (NOTES.txt apart), in file order."""

    name: str
    values: dict[str, Any]
    objects: list[dict[str, Any]]
    notes: str
    paths: dict[int, str] = field(default_factory=dict)  # id(object) -> template path

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def find(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        found = [
            o
            for o in self.all(kind)
            if o["metadata"]["name"] == name and (namespace is None or o["metadata"].get("namespace") == namespace)
        ]
        assert len(found) == 1, f"{self.name}: expected one {kind} {name!r}, found {len(found)}"
        return found[0]

    def kinds(self) -> set[str]:
        return {o["kind"] for o in self.objects}

    def template_of(self, obj: dict[str, Any]) -> str:
        return self.paths[id(obj)]


@functools.cache
def _chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART)


@functools.cache
def rendering(name: str) -> Rendering:
    """The chart rendered with ``COMBINATIONS[name]``, once per session."""
    values = COMBINATIONS[name]
    rendered = _chart().render(values=values, name=RELEASE, namespace=NAMESPACE)
    objects: list[dict[str, Any]] = []
    paths: dict[int, str] = {}
    notes = ""
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects.append(doc)
                paths[id(doc)] = path
    return Rendering(name=name, values=values, objects=objects, notes=notes, paths=paths)


@pytest.fixture(scope="session")
def chart() -> Iterator[helm_python.Chart]:
    yield _chart()


@pytest.fixture(scope="module", params=sorted(COMBINATIONS))
def each(request: pytest.FixtureRequest) -> Rendering:
    """Every combination in turn (module-scoped: each is rendered once)."""
    return rendering(str(request.param))


def pod_templates(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(Kind/name, pod template) of every workload."""
    return [
        (f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"])
        for o in objects
        if o["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Job"}
    ]


def restricted_violations(pod_spec: dict[str, Any]) -> list[str]:  # noqa: C901 -- one branch per documented check
    """What in a pod spec breaks the restricted Pod Security Standard (Kubernetes' documented checks).

    Baseline: no host namespaces, ports or paths, no privileged containers, no added capabilities
    beyond the allowed, default /proc mount, no unsafe sysctls. Restricted adds: volume types
    from the allowed list, allowPrivilegeEscalation false, runAsNonRoot, not uid 0, seccomp
    RuntimeDefault or Localhost, capabilities dropping ALL (adding only NET_BIND_SERVICE).
    """
    problems: list[str] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(key):
            problems.append(f"{key} is set")
    allowed_volumes = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim"}
    allowed_volumes |= {"projected", "secret"}
    for volume in pod_spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= allowed_volumes:
            problems.append(f"volume {volume['name']} has type {sorted(kinds - allowed_volumes)}")
    pod_sc = pod_spec.get("securityContext", {})
    if pod_sc.get("sysctls"):
        problems.append("sysctls are set")
    containers = [*pod_spec.get("initContainers", []), *pod_spec["containers"]]
    for c in containers:
        sc = c.get("securityContext", {})
        name = c["name"]
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            problems.append(f"{name}: hostPort")
        if sc.get("procMount", "Default") != "Default":
            problems.append(f"{name}: procMount")
        run_as_non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if run_as_non_root is not True:
            problems.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            problems.append(f"{name}: runs as uid 0")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile")) or {}
        if seccomp.get("type") not in {"RuntimeDefault", "Localhost"}:
            problems.append(f"{name}: seccompProfile is {seccomp or 'unset'}")
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{name}: capabilities do not drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds capabilities {capabilities['add']}")
    return problems
