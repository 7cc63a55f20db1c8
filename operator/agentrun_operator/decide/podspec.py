"""The runner pod for one attempt (pure).

Security by default: no service account token, the restricted Pod Security
profile (non-root, read-only root filesystem, no capabilities, seccomp
RuntimeDefault), store credentials only through ``secretKeyRef``, and from
``spec.podTemplate`` only fields that cannot widen privileges.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrun.contract import API_VERSION, GROUP, KIND, PLURAL, STORE_SECRET_KEYS, VERSION, Env, RunnerInputs

from ..settings import OperatorSettings
from .identity import request_key
from .spec import AgentRunSpec, thread_key

__all__ = ["GROUP", "KIND", "PLURAL", "VERSION"]  # re-exported: the operator's modules import them from here
RUN_LABEL = "agentrun.dev/run"
ATTEMPT_LABEL = "agentrun.dev/attempt"
MANAGED_BY = {"app.kubernetes.io/managed-by": "agentrun-operator"}
RUNNER_UID = 65532  # the conventional "nonroot" user of distroless images


@dataclass(frozen=True)
class RunRef:
    """Which AgentRun a pod belongs to."""

    namespace: str
    name: str
    uid: str

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> RunRef:
        meta = body["metadata"]
        return cls(namespace=str(meta["namespace"]), name=str(meta["name"]), uid=str(meta["uid"]))


def label_value(value: str) -> str:
    """Label values are at most 63 characters; longer run names keep a prefix and a stable hash."""
    if len(value) <= 63:
        return value
    return f"{value[:50]}-{hashlib.sha256(value.encode()).hexdigest()[:12]}"


def pod_name(run_name: str, attempt: int) -> str:
    return f"{run_name}-{attempt}"


def run_request_key(run: RunRef, spec: AgentRunSpec) -> str:
    """The request key of ``run`` (``identity.request_key``): the turn's identity on its thread."""
    return request_key(namespace=run.namespace, name=run.name, request_id=spec.requestId, input=spec.input)


def store_secret(spec: AgentRunSpec, settings: OperatorSettings) -> str:
    return spec.store.secretRef.name if spec.store else settings.default_store_secret


def build_pod(
    run: RunRef,
    spec: AgentRunSpec,
    *,
    attempt: int,
    settings: OperatorSettings,
    resume: dict[str, Any] | None = None,
    inputs_in_store: bool = False,
    take_over_from: str | None = None,
) -> dict[str, Any]:
    """The pod manifest of ``run``'s attempt ``attempt``; ``resume`` answers its interrupt(s).

    ``inputs_in_store``: the input and resume value are not rendered into the environment (Linux caps one
    variable at 128 KiB); the caller has written them to the store (``ControlStore.put_run_inputs``, keyed
    by thread, run uid and attempt) before it creates the pod, and the runner reads them from there.
    """
    name, namespace = run.name, run.namespace
    template = spec.podTemplate
    inputs = RunnerInputs(
        graph=spec.graph,
        thread_id=thread_key(namespace, spec.threadId),
        run_name=name,
        run_uid=run.uid,
        user_id=spec.userId or None,
        attempt=attempt,
        config=spec.run_config(),
        input=None if inputs_in_store else spec.input,
        resume=None if inputs_in_store else resume,
        inputs_in_store=inputs_in_store,
        request_key=run_request_key(run, spec),
        take_over_from=take_over_from or "",
        metrics_port=settings.runner_metrics_port,
    )
    labels = {
        **((template.labels or {}) if template else {}),
        "app.kubernetes.io/name": "agentrun-runner",
        "app.kubernetes.io/instance": label_value(name),
        **MANAGED_BY,
        RUN_LABEL: label_value(name),
        ATTEMPT_LABEL: str(attempt),
    }
    container = _container(spec, settings, _env(inputs, spec, settings))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(name, attempt),
            "namespace": namespace,
            "labels": labels,
            "annotations": dict(template.annotations or {}) if template else {},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": KIND,
                    "name": name,
                    "uid": run.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": _pod_spec(spec, settings, container),
    }


def _env(inputs: RunnerInputs, spec: AgentRunSpec, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The runner's environment: its inputs, the log format, the store Secret's keys, then the template's."""
    template = spec.podTemplate
    secret = store_secret(spec, settings)
    env: list[dict[str, Any]] = [*inputs.to_env()]
    log_format = settings.runner_log_format or settings.log_format  # by default, as their operator logs
    if log_format != "text":  # text is the runner's default: the pod spec stays as it was
        env.append({"name": Env.LOG_FORMAT.value, "value": log_format})
    for variable, key in STORE_SECRET_KEYS.items():
        ref: dict[str, Any] = {"name": secret, "key": key}
        if variable is not Env.POSTGRES_DSN:
            ref["optional"] = True
        env.append({"name": variable.value, "valueFrom": {"secretKeyRef": ref}})
    # spec.EnvVar refuses the contract's AGENTRUN_ names, so none of these can shadow the operator's.
    env.extend(var.model_dump(exclude_none=True) for var in (template.env if template and template.env else []))
    return env


def _container(spec: AgentRunSpec, settings: OperatorSettings, env: list[dict[str, Any]]) -> dict[str, Any]:
    """The runner container: restricted security context, a writable /tmp only, the run's resources."""
    template = spec.podTemplate
    container: dict[str, Any] = {
        "name": "runner",
        "image": spec.image or settings.default_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": list(settings.runner_command),
        "env": env,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if settings.runner_metrics_port > 0:  # 0 turns the runner's /metrics off; a port 0 is an invalid pod
        container["ports"] = [{"name": "metrics", "containerPort": settings.runner_metrics_port}]
    if template and template.resources:
        container["resources"] = template.resources
    elif settings.runner_resources:  # the operator's default (chart value runner.resources): never BestEffort
        container["resources"] = copy.deepcopy(settings.runner_resources)
    return container


def _pod_spec(spec: AgentRunSpec, settings: OperatorSettings, container: dict[str, Any]) -> dict[str, Any]:
    """The pod's spec around ``container``: never restarted in place, no API token, the template's placement."""
    template = spec.podTemplate
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": settings.pod_grace_seconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNNER_UID,
            "runAsGroup": RUNNER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}],
    }
    if template and template.nodeSelector:
        pod_spec["nodeSelector"] = template.nodeSelector
    if template and template.tolerations:
        pod_spec["tolerations"] = template.tolerations
    return pod_spec
