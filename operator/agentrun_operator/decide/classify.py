"""Pod classification (pure): a pod's manifest in, one ``Outcome`` out (DESIGN.md section 3).

- exit 0/3/4/5 -> completed / interrupted / stopped / failed; exit 7 of the current pod -> superseded;
- a disruption (eviction or the ``DisruptionTarget`` condition, exit 6) -> disrupted, once the pod ended;
- exit 8 -> store unavailable (a disruption with backoff); StartError (exit 128) -> start error;
- a pod on a lost node (phase Unknown) -> lost; a pod being deleted -> terminating;
- any other ending (exit 1, 137, OOMKilled, an unknown code) -> crashed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentrun.contract import ExitCode

from .reasons import CONFIG_ERRORS
from .status import parse_time


class Outcome(enum.Enum):
    """What a runner pod's state means for its run."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"
    FAILED = "failed"
    DISRUPTED = "disrupted"
    CRASHED = "crashed"
    LOST = "lost"
    SUPERSEDED = "superseded"  # exit 7: another AgentRun claimed the thread
    CONFIG_ERROR = "config-error"
    START_ERROR = "start-error"  # the kubelet could not start the process (StartError, exit 128)
    STORE_UNAVAILABLE = "store-unavailable"  # exit 8: the store stayed down past the runner's retries
    TERMINATING = "terminating"
    GONE = "gone"


# Terminated reasons of a container whose process could not be started (the runtime's exec failed).
START_ERRORS = frozenset({"StartError", "ContainerCannotRun"})

# Outcomes of a pod that may still run (or whose end the kubelet has not confirmed).
LIVE = frozenset({Outcome.PENDING, Outcome.RUNNING, Outcome.TERMINATING, Outcome.LOST, Outcome.CONFIG_ERROR})


@dataclass(frozen=True)
class PodView:
    """What the operator needs of a pod, read from its manifest."""

    name: str
    phase: str
    exit_code: int | None = None
    terminated_reason: str | None = None
    termination_message: str | None = None
    waiting_reason: str | None = None
    waiting_message: str | None = None
    disruption: str | None = None  # why the cluster disrupted it (EvictionByEvictionAPI, PreemptionByScheduler, ...)
    deleting: bool = False
    # When the pod's graceful deletion ends at the latest (deletionTimestamp is set to now + grace).
    deletion_deadline: datetime | None = None
    created: datetime | None = None  # metadata.creationTimestamp (the image pull timeout counts from it)
    finished_at: datetime | None = None  # the runner container's terminated.finishedAt
    unschedulable: bool = False  # the scheduler found no node for it (condition PodScheduled False)
    owner_uid: str | None = None  # the uid of the AgentRun that controls it

    @classmethod
    def from_manifest(cls, pod: dict[str, Any]) -> PodView:
        """The facts the decisions read of a pod manifest (phase, the runner container's state, exit code, reasons)."""
        status = pod.get("status") or {}
        container: dict[str, Any] = {}
        for item in status.get("containerStatuses") or []:
            if item.get("name") == "runner" or not container:
                container = item
        state = container.get("state") or {}
        terminated = state.get("terminated") or {}
        waiting = state.get("waiting") or {}
        disruption = None
        unschedulable = False
        for condition in status.get("conditions") or []:
            if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
                disruption = condition.get("reason") or "DisruptionTarget"
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                unschedulable = True
        if status.get("reason") == "Evicted":
            disruption = disruption or "Evicted"
        return cls(
            name=pod["metadata"]["name"],
            phase=status.get("phase") or "Pending",
            exit_code=terminated.get("exitCode") if terminated else None,
            terminated_reason=terminated.get("reason"),
            termination_message=terminated.get("message"),
            waiting_reason=waiting.get("reason"),
            waiting_message=waiting.get("message"),
            disruption=disruption,
            deleting=bool(pod["metadata"].get("deletionTimestamp")),
            deletion_deadline=parse_time(pod["metadata"].get("deletionTimestamp")),
            created=parse_time(pod["metadata"].get("creationTimestamp")),
            finished_at=parse_time(terminated.get("finishedAt")),
            unschedulable=unschedulable,
            owner_uid=next(
                (
                    str(o.get("uid"))
                    for o in pod["metadata"].get("ownerReferences") or []
                    if o.get("kind") == "AgentRun" and o.get("controller")
                ),
                None,
            ),
        )

    def last_line(self) -> str:
        """The runner's reason: the last line of the termination message.

        The runner writes one line to its termination log; with FallbackToLogsOnError the kubelet may hand
        us the tail of the log instead, whose last line is the runner's "exit N: <reason>" line.
        """
        lines = [line for line in (self.termination_message or "").splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""


# A runner that reached a final outcome (completed, interrupted, stopped, failed, fenced).
_FINAL: dict[int, Outcome] = {
    ExitCode.COMPLETED: Outcome.COMPLETED,
    ExitCode.INTERRUPTED: Outcome.INTERRUPTED,
    ExitCode.STOPPED: Outcome.STOPPED,
    ExitCode.FAILED: Outcome.FAILED,
    ExitCode.FENCED: Outcome.SUPERSEDED,
}


def classify(pod: PodView | None) -> Outcome:
    """The outcome of the run's current pod (``GONE`` when there is none)."""
    if pod is None:
        return Outcome.GONE
    ended = pod.exit_code is not None or pod.phase in ("Succeeded", "Failed")
    # A final outcome wins over a disruption that arrived meanwhile: re-running it would retry a
    # permanent failure.
    if pod.disruption and ended and pod.exit_code in _FINAL:
        return _FINAL[pod.exit_code]
    if pod.disruption and ended:
        return Outcome.DISRUPTED
    if pod.phase == "Unknown":
        # Before the disruption check: a pod on a lost node may also be marked for disruption (the
        # taint manager's DeletionByTaintManager), but its kubelet never confirms the ending, so
        # waiting for it would wait forever; the lost-node timeout force-deletes and reschedules.
        return Outcome.LOST
    if pod.disruption:
        return Outcome.TERMINATING
    if ended:
        if pod.exit_code is None:
            return Outcome.CRASHED  # Failed without a container state (e.g. the node rejected it)
        if pod.exit_code == ExitCode.PREEMPTED:
            return Outcome.DISRUPTED
        if pod.exit_code == ExitCode.STORE_UNAVAILABLE:
            return Outcome.STORE_UNAVAILABLE
        if pod.terminated_reason in START_ERRORS:
            return Outcome.START_ERROR  # exit 128: the process never ran, so it is no crash of the runner
        return _FINAL.get(pod.exit_code, Outcome.CRASHED)
    if pod.deleting:
        return Outcome.TERMINATING
    if pod.waiting_reason in CONFIG_ERRORS:
        return Outcome.CONFIG_ERROR
    if pod.phase == "Running":
        return Outcome.RUNNING
    return Outcome.PENDING
