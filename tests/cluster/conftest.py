"""Cluster tier: the emulated Kubernetes cluster, driven with the real ``kubectl``.

What it tests: the AgentRun CRD as the API server enforces it (schema,
defaults, printer columns, ``kubectl explain``), the API semantics an operator
relies on (resourceVersion conflicts, generation, status subresource,
finalizers, graceful pod deletion, garbage collection, watches), and the
local kubelet stand-in that runs pods as processes and injects faults
(SIGKILL, eviction, deletion with a grace period, a lost node), and the Helm
chart installed, upgraded and uninstalled by real Helm 4 (server-side apply).

The server is ``tests.cluster.emulator.ClusterEmulator`` (kmock's
``KubernetesEmulator`` made faithful) on 127.0.0.1, on a background thread,
so that separate processes (kubectl, the operator, runner pods) reach it over
TCP. Fixtures:

- ``cluster``: an ``EmulatedCluster`` (``.url``, ``.kubeconfig``,
  ``.kubectl(*args)`` running the real binary, ``.api(...)`` for raw HTTP,
  ``.get/.list/.history`` for stored objects, ``.wait_for``); a test fails if
  the emulator itself raised while serving it.
- ``kubelet``: a ``KubeletThread`` bound to that cluster (fault injection:
  ``kill``, ``oom_kill``, ``evict``, ``lose_node``, ``pause``/``resume``; per
  pod ``logs``/``log_path``); every pod process is dead after the test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import EmulatedCluster
from tests.cluster.kubelet import KubeletThread

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "agentrun.dev_agentruns.yaml"
EXAMPLE = ROOT / "examples" / "agentrun.yaml"
INVALID_MANIFESTS = sorted((Path(__file__).parent / "manifests").glob("invalid-*.yaml"))
AGENTRUNS = "/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns"
PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmulatedCluster]:
    emulated = EmulatedCluster(tmp_path / "cluster").start()
    try:
        yield emulated
    finally:
        emulated.stop()
    assert not emulated.internal_errors, f"the emulator failed while serving: {emulated.internal_errors!r}"


@pytest.fixture
def kubelet(cluster: EmulatedCluster, tmp_path: Path) -> Iterator[KubeletThread]:
    node = KubeletThread(cluster.url, tmp_path / "kubelet").start()
    try:
        yield node
    finally:
        pids = [r.process.pid for r in node.kubelet.pods.values() if r.process is not None]
        node.stop()
        for pid in pids:  # the process group leader is reaped by the kubelet: no pid, no leak
            with pytest.raises(ProcessLookupError):
                os.killpg(pid, 0)


def python_pod(
    name: str,
    script: str,
    *,
    env: list[dict[str, Any]] | None = None,
    grace: int | None = None,
    owner: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A restartPolicy: Never pod whose container runs ``python -c SCRIPT``."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "cluster-tier-test"}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [
                {"name": "main", "image": "python:3.11", "command": ["python", "-c", script], "env": env or []}
            ],
            **spec,
        },
    }
    if grace is not None:
        pod["spec"]["terminationGracePeriodSeconds"] = grace
    if owner is not None:
        pod["metadata"]["ownerReferences"] = [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return pod


def terminated(pod: dict[str, Any] | None) -> dict[str, Any] | None:
    """The terminated state of the pod's first container, if it has one."""
    if not pod:
        return None
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    result: dict[str, Any] | None = statuses[0].get("state", {}).get("terminated")
    return result
