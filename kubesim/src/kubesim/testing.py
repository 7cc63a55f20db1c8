"""Small builders for tests against the emulated cluster."""

from __future__ import annotations

from typing import Any


def python_pod(
    name: str,
    script: str,
    *,
    env: list[dict[str, Any]] | None = None,
    grace: int | None = None,
    owner: dict[str, Any] | None = None,
    restricted: bool = False,
    **spec: Any,
) -> dict[str, Any]:
    """A restartPolicy: Never pod whose container runs ``python -c SCRIPT`` (image python:3.11).

    ``restricted``: with the security contexts the ``restricted`` Pod Security level asks for, so a
    namespace that enforces it admits the pod (the kubelet stand-in applies none of them)."""
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
    if restricted:
        pod["spec"]["securityContext"] = {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        pod["spec"]["containers"][0]["securityContext"] = {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
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
