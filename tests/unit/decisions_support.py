"""Builders of the operator's decision tests: kubelet-shaped pods, run statuses, store progress, the clock.

Shared by the decision tests of the unit tier (``test_operator_decisions.py`` and its siblings) and
``tests/badinput/test_stop_decisions.py``. Pure: a pod is built as a kubelet reports it, so
``PodView.from_manifest`` is exercised on every path; ``applied`` feeds a Decision's status back as
the operator's merge patch would.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from agentrun.checkpoint.base import Progress
from agentrun_operator.decide.classify import PodView
from agentrun_operator.decide.decision import Decision, Limits
from agentrun_operator.decide.podspec import pod_name
from agentrun_operator.decide.reasons import Phase
from agentrun_operator.decide.run import decide as decide_run
from agentrun_operator.decide.spec import AgentRunSpec, parse_spec
from agentrun_operator.decide.status import AgentRunStatus, iso

PENDING, RUNNING, INTERRUPTED, STOPPING = Phase.PENDING, Phase.RUNNING, Phase.INTERRUPTED, Phase.STOPPING
STOPPED, SUCCEEDED, FAILED = Phase.STOPPED, Phase.SUCCEEDED, Phase.FAILED

RUN = "support-order-4821"
NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
STARTED = NOW - timedelta(hours=1)
LIMITS = Limits(stop_grace=30.0, lost_node_timeout=60.0, max_disruptions=3, max_backoff=300.0)
IMAGE = "ghcr.io/agentrun/agentrun:0.1.0"


# --- kubelet-shaped pod manifests ------------------------------------------------------------------------------------


def container(state: dict[str, Any], *, name: str = "runner", ready: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "image": IMAGE,
        "imageID": f"{IMAGE}@sha256:{'ab' * 32}",
        "containerID": "containerd://" + "c0ffee" * 10,
        "ready": ready,
        "started": ready,
        "restartCount": 0,
        "lastState": {},
        "state": state,
    }


def pod_conditions(ready: bool) -> list[dict[str, Any]]:
    flag = "True" if ready else "False"
    return [
        {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": iso(STARTED)},
        {"type": "Initialized", "status": "True", "lastTransitionTime": iso(STARTED)},
        {"type": "Ready", "status": flag, "lastTransitionTime": iso(STARTED)},
        {"type": "ContainersReady", "status": flag, "lastTransitionTime": iso(STARTED)},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": iso(STARTED)},
    ]


def manifest(
    attempt: int = 1,
    *,
    phase: str,
    state: dict[str, Any] | None = None,
    ready: bool = False,
    conditions: list[dict[str, Any]] | None = None,
    reason: str | None = None,
    message: str | None = None,
    deleting: bool = False,
    containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": pod_name(RUN, attempt),
        "namespace": "shop",
        "uid": f"pod-uid-{attempt}",
        "labels": {"agentrun.dev/run": RUN, "agentrun.dev/attempt": str(attempt)},
        "creationTimestamp": iso(STARTED),
    }
    if deleting:
        metadata.update(deletionTimestamp=iso(NOW), deletionGracePeriodSeconds=30)
    status: dict[str, Any] = {
        "phase": phase,
        "hostIP": "10.0.0.7",
        "podIP": "10.244.1.12",
        "qosClass": "BestEffort",
        "startTime": iso(STARTED),
        "conditions": pod_conditions(ready) + list(conditions or []),
    }
    if containers is not None:
        status["containerStatuses"] = containers
    elif state is not None:
        status["containerStatuses"] = [container(state, ready=ready)]
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "runner"}]},
        "status": status,
    }


def running(attempt: int = 1, **kwargs: Any) -> dict[str, Any]:
    return manifest(attempt, phase="Running", ready=True, state={"running": {"startedAt": iso(STARTED)}}, **kwargs)


def terminated(
    code: int, attempt: int = 1, *, reason: str | None = None, message: str | None = None, **kwargs: Any
) -> dict[str, Any]:
    state: dict[str, Any] = {
        "exitCode": code,
        "reason": reason or ("Completed" if code == 0 else "Error"),
        "startedAt": iso(STARTED),
        "finishedAt": iso(NOW),
        "containerID": "containerd://" + "c0ffee" * 10,
    }
    if message is not None:
        state["message"] = message
    kwargs.setdefault("phase", "Succeeded" if code == 0 else "Failed")
    return manifest(attempt, state={"terminated": state}, **kwargs)


def waiting(reason: str, message: str, attempt: int = 1) -> dict[str, Any]:
    return manifest(attempt, phase="Pending", state={"waiting": {"reason": reason, "message": message}})


def disruption_target(reason: str = "EvictionByEvictionAPI") -> dict[str, Any]:
    return {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": reason,
        "message": "Eviction API: evicting",
        "lastTransitionTime": iso(NOW),
    }


def view(pod: dict[str, Any]) -> PodView:
    return PodView.from_manifest(pod)


# --- run state -------------------------------------------------------------------------------------------------------


def make_spec(**fields: Any) -> AgentRunSpec:
    return parse_spec({"graph": "examples.support_agent:app", "threadId": "order-4821", **fields})


def run_status(phase: str = RUNNING, attempt: int = 1, **fields: Any) -> dict[str, Any]:
    return {
        "phase": phase,
        "attempt": attempt,
        "restarts": 0,
        "disruptions": 0,
        "startTime": iso(STARTED),
        "podName": pod_name(RUN, attempt),
        # The operator writes every phase with a reason; a Pending without one is the CRD's default.
        **({"reason": "PodCreated"} if phase == PENDING else {}),
        **fields,
    }


def decide(
    spec: AgentRunSpec,
    status: dict[str, Any],
    pod: PodView | None,
    progress: Progress | None,
    now: datetime,
    limits: Limits,
) -> Decision:
    """``decide`` on a status as the API holds it: the plain dict that ``applied`` builds from merge patches."""
    return decide_run(
        spec=spec, status=AgentRunStatus.parse(status), pod=pod, progress=progress, now=now, limits=limits
    )


def applied(status: dict[str, Any], decision: Decision) -> dict[str, Any]:
    """The status after the operator's merge patch of ``decision.status`` (a ``None`` removes the key)."""
    merged = {**status, **decision.status}
    return {k: v for k, v in merged.items() if v is not None}


def progress(**fields: Any) -> Progress:
    base: dict[str, Any] = dict(
        thread_id="shop/order-4821",
        version=7,
        current_node="tools",
        step=3,
        status="running",
        updated_at=(NOW - timedelta(seconds=2)).timestamp(),
        tool_calls={"executed": 2, "replayed": 1},
    )
    return Progress(**{**base, **fields})


def interrupted_progress(*interrupts: dict[str, Any]) -> Progress:
    return progress(status="interrupted", interrupts=list(interrupts))


def no_action(d: Decision) -> bool:
    return d.create_attempt is None and d.delete_pod is None and not d.request_stop and "phase" not in d.status


def later(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)
