"""Pure decisions: an AgentRun's status, its current pod and the store's progress in; actions out.

Nothing here does I/O or reads a clock; ``reconcile`` gathers the inputs and
applies the ``Decision``. The rules (DESIGN.md sections 3 and 4):

- exit 0/3/4/5 -> Succeeded / Interrupted / Stopped / Failed;
- a disruption (eviction or the ``DisruptionTarget`` condition, exit 6, the
  pod deleted by someone else, a node lost past a timeout) reschedules at
  once and counts in ``disruptions`` (capped, so nothing loops forever);
- any other ending (exit 1, 137, OOMKilled) is a crash: rescheduled with
  exponential backoff until ``restartPolicy.maxRestarts``, then Failed with
  ``BackoffLimitExceeded``;
- ``spec.stop`` asks the runner through the store (phase Stopping); a runner
  that has not exited after the stop grace has its pod deleted (``ForcedStop``);
- ``spec.resume`` answers an interrupt by starting the next attempt once per
  distinct answer.

A rescheduled attempt never overlaps its predecessor by design (it starts
only once the old pod ended or is gone), and the store fences off an older
attempt's writes anyway, so a zombie pod on a lost node cannot corrupt the run.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from agentrun.checkpoint.base import Progress
from agentrun.contract import ExitCode

from .spec import AgentRunSpec

PENDING, RUNNING, INTERRUPTED, STOPPING = "Pending", "Running", "Interrupted", "Stopping"
STOPPED, SUCCEEDED, FAILED = "Stopped", "Succeeded", "Failed"
TERMINAL = frozenset({STOPPED, SUCCEEDED, FAILED})

PAYLOAD_LIMIT = 1024
# A kubelet reports these when the container cannot even be created: retrying will not help.
CONFIG_ERRORS = frozenset({"CreateContainerConfigError", "CreateContainerError", "InvalidImageName"})


class Outcome(enum.Enum):
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
    TERMINATING = "terminating"
    GONE = "gone"


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

    @classmethod
    def from_manifest(cls, pod: dict[str, Any]) -> PodView:
        status = pod.get("status") or {}
        container: dict[str, Any] = {}
        for item in status.get("containerStatuses") or []:
            if item.get("name") == "runner" or not container:
                container = item
        state = container.get("state") or {}
        terminated = state.get("terminated") or {}
        waiting = state.get("waiting") or {}
        disruption = None
        for condition in status.get("conditions") or []:
            if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
                disruption = condition.get("reason") or "DisruptionTarget"
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
        )


def classify(pod: PodView | None) -> Outcome:
    if pod is None:
        return Outcome.GONE
    ended = pod.exit_code is not None or pod.phase in ("Succeeded", "Failed")
    # A runner that reached a final outcome (completed, interrupted, stopped, failed) wins over a
    # disruption that arrived meanwhile: re-running it would retry a permanent failure.
    final: dict[int, Outcome] = {
        ExitCode.COMPLETED: Outcome.COMPLETED,
        ExitCode.INTERRUPTED: Outcome.INTERRUPTED,
        ExitCode.STOPPED: Outcome.STOPPED,
        ExitCode.FAILED: Outcome.FAILED,
        ExitCode.FENCED: Outcome.SUPERSEDED,
    }
    if pod.disruption and ended and pod.exit_code in final:
        return final[pod.exit_code]
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
        return final.get(pod.exit_code, Outcome.CRASHED)
    if pod.deleting:
        return Outcome.TERMINATING
    if pod.waiting_reason in CONFIG_ERRORS:
        return Outcome.CONFIG_ERROR
    if pod.phase == "Running":
        return Outcome.RUNNING
    return Outcome.PENDING


@dataclass(frozen=True)
class Limits:
    stop_grace: float = 30.0
    lost_node_timeout: float = 60.0
    max_disruptions: int = 50
    max_backoff: float = 300.0


@dataclass
class Decision:
    status: dict[str, Any] = field(default_factory=dict)
    create_attempt: int | None = None
    resume: dict[str, Any] | None = None
    delete_pod: str | None = None
    delete_grace: int | None = None
    request_stop: bool = False
    events: list[tuple[str, str, str]] = field(default_factory=list)

    def phase(self, phase: str, reason: str, message: str, *, warning: bool = False) -> Decision:
        self.status.update(phase=phase, reason=reason, message=message)
        self.events.append(("Warning" if warning else "Normal", reason, message))
        return self


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    """Kubernetes timestamps (``2026-12-02T15:04:05Z``, with or without fractional seconds); None if unset."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def backoff(restarts: int, base: float, cap: float) -> float:
    """Exponential: base, 2*base, 4*base, ... capped; ``restarts`` counts from 1."""
    return float(min(cap, base * (2 ** max(0, restarts - 1))))


def truncate_payload(payload: Any) -> Any:
    text = json.dumps(payload, default=str)
    if len(text) <= PAYLOAD_LIMIT:
        return payload
    return text[:PAYLOAD_LIMIT] + "…(truncated)"


def mirror(progress: Progress | None) -> dict[str, Any]:
    """Status fields copied from the store."""
    if progress is None:
        return {}
    return {
        "stateVersion": progress.version,
        "currentNode": progress.current_node,
        "step": progress.step,
        "toolCalls": {
            "executed": int(progress.tool_calls.get("executed", 0)),
            "replayed": int(progress.tool_calls.get("replayed", 0)),
        },
        "lastCheckpointTime": iso(datetime.fromtimestamp(progress.updated_at, UTC)),
    }


def _interrupt_status(progress: Progress | None) -> dict[str, Any] | None:
    if progress is None or not progress.interrupts:
        return None
    first = progress.interrupts[0]
    return {
        "id": first.get("id"),
        "message": first.get("message") or "",
        "payload": truncate_payload(first.get("payload")),
        "ids": [i.get("id") for i in progress.interrupts],
    }


def decide(
    spec: AgentRunSpec,
    status: dict[str, Any],
    pod: PodView | None,
    progress: Progress | None,
    now: datetime,
    limits: Limits,
) -> Decision:
    """The next step for one AgentRun. ``status`` is the current ``.status`` (possibly empty)."""
    d = Decision(status=mirror(progress))
    phase = status.get("phase")
    attempt = int(status.get("attempt") or 0)
    if phase in TERMINAL:
        return Decision()
    outcome = classify(pod) if attempt else Outcome.GONE

    if spec.stop:
        return _decide_stop(d, status, pod, outcome, progress, now, limits)

    if not phase or attempt == 0:
        return _start(d, 1, now, first=True)

    if phase == INTERRUPTED:
        return _decide_resume(d, spec, status, progress, attempt, now)

    next_at = parse_time(status.get("nextAttemptTime"))
    if next_at is not None and outcome in (Outcome.GONE, Outcome.CRASHED):
        if now >= next_at:
            d.status["nextAttemptTime"] = None
            return _start(d, attempt + 1, now)
        return d

    return _decide_pod(d, spec, status, pod, outcome, progress, now, limits, attempt)


def _start(
    d: Decision, attempt: int, now: datetime, *, first: bool = False, resume: dict[str, Any] | None = None
) -> Decision:
    d.create_attempt = attempt
    d.resume = resume
    d.status.update(attempt=attempt, lostSince=None)
    if first:
        d.status.update(startTime=iso(now), restarts=0, disruptions=0)
    return d.phase(PENDING, "PodCreated", f"attempt {attempt}: runner pod created")


def _decide_resume(
    d: Decision, spec: AgentRunSpec, status: dict[str, Any], progress: Progress | None, attempt: int, now: datetime
) -> Decision:
    interrupt = status.get("interrupt")
    if not interrupt and (interrupt := _interrupt_status(progress)):
        # The store could not be read when the pod exited 3: fill the interrupt in now, or it would
        # stay missing from status for good and a resume by interrupt id could never match.
        d.status["interrupt"] = interrupt
    resume = spec.resume
    if resume is None or resume.digest() == status.get("resumeDigest"):
        return d
    pending = list((interrupt or {}).get("ids") or [])
    if resume.values is not None:
        unknown = sorted(set(resume.values) - set(pending))
        if unknown:
            d.status.update(message=f"spec.resume.values names unknown interrupt ids {unknown}; pending: {pending}")
            return d
        answer: dict[str, Any] = {"values": resume.values}
    else:
        if len(pending) > 1:
            d.status.update(
                message=f"{len(pending)} interrupts are pending ({', '.join(pending)}): "
                "answer each in spec.resume.values"
            )
            return d
        answer = {"values": {pending[0]: resume.value}} if pending else {"value": resume.value}
    d.status["resumeDigest"] = resume.digest()
    d.status["interrupt"] = None
    return _start(d, attempt + 1, now, resume=answer)


def _decide_stop(
    d: Decision,
    status: dict[str, Any],
    pod: PodView | None,
    outcome: Outcome,
    progress: Progress | None,
    now: datetime,
    limits: Limits,
) -> Decision:
    phase = status.get("phase")
    live = outcome in (Outcome.PENDING, Outcome.RUNNING, Outcome.TERMINATING, Outcome.LOST, Outcome.CONFIG_ERROR)
    if not live:
        if outcome is Outcome.COMPLETED:
            return _finish(d, SUCCEEDED, "Completed", "the run completed before it saw the stop request", now)
        if outcome is Outcome.FAILED:
            return _failed(d, pod, progress, now)
        if outcome is Outcome.SUPERSEDED:
            return _superseded(d, pod, now)
        reason = "StoppedBeforeStart" if not phase or not status.get("attempt") else "Stopped"
        return _finish(d, STOPPED, reason, "stopped by spec.stop", now)
    requested = parse_time(status.get("stopRequestedTime"))
    if requested is None:
        d.request_stop = True
        d.status["stopRequestedTime"] = iso(now)
        return d.phase(STOPPING, "StopRequested", "spec.stop is true; asked the runner to stop")
    if (now - requested).total_seconds() >= limits.stop_grace:
        assert pod is not None
        d.delete_pod, d.delete_grace = pod.name, 0
        return _finish(
            d,
            STOPPED,
            "ForcedStop",
            f"the runner did not stop within {limits.stop_grace:g}s; its pod was deleted",
            now,
            warning=True,
        )
    return d


def _decide_pod(
    d: Decision,
    spec: AgentRunSpec,
    status: dict[str, Any],
    pod: PodView | None,
    outcome: Outcome,
    progress: Progress | None,
    now: datetime,
    limits: Limits,
    attempt: int,
) -> Decision:
    phase = status.get("phase")
    if outcome is Outcome.PENDING:
        if pod is not None and pod.waiting_reason and status.get("message") != pod.waiting_message:
            d.status["message"] = f"{pod.waiting_reason}: {pod.waiting_message or ''}".strip()
        return d
    if outcome is Outcome.RUNNING:
        d.status["lostSince"] = None
        if phase != RUNNING:
            d.phase(RUNNING, "Running", f"attempt {attempt} is running")
        return d
    if outcome is Outcome.TERMINATING:
        # Wait until the old pod is gone before the next attempt starts, but not forever: a pod whose
        # node died keeps "terminating" with no kubelet to confirm it (real clusters leave it phase
        # Running); past its deadline plus the lost-node timeout it is force-deleted and replaced.
        assert pod is not None
        deadline = pod.deletion_deadline
        if deadline is None or (now - deadline).total_seconds() < limits.lost_node_timeout:
            return d
        d.delete_pod, d.delete_grace = pod.name, 0
        return _disrupted(
            d,
            status,
            "NodeLost",
            f"pod {pod.name} did not finish terminating {limits.lost_node_timeout:g}s after its grace period",
            attempt,
            now,
            limits,
        )
    if outcome is Outcome.COMPLETED:
        return _finish(d, SUCCEEDED, "Completed", "the run completed", now)
    if outcome is Outcome.INTERRUPTED:
        d.status["interrupt"] = _interrupt_status(progress)
        message = (d.status["interrupt"] or {}).get("message") or "waiting for spec.resume"
        return d.phase(INTERRUPTED, "Interrupted", message)
    if outcome is Outcome.STOPPED:
        return _finish(d, STOPPED, "Stopped", "the runner stopped on a stop request", now)
    if outcome is Outcome.FAILED:
        return _failed(d, pod, progress, now)
    if outcome is Outcome.SUPERSEDED:
        return _superseded(d, pod, now)
    if outcome is Outcome.CONFIG_ERROR:
        assert pod is not None
        d.delete_pod = pod.name
        return _finish(
            d,
            FAILED,
            pod.waiting_reason or "CreateContainerConfigError",
            pod.waiting_message or "the runner container could not be created",
            now,
            warning=True,
        )
    if outcome is Outcome.LOST:
        lost = parse_time(status.get("lostSince"))
        if lost is None:
            d.status["lostSince"] = iso(now)
            return d
        if (now - lost).total_seconds() < limits.lost_node_timeout:
            return d
        assert pod is not None
        d.delete_pod, d.delete_grace = pod.name, 0
        return _disrupted(
            d,
            status,
            "NodeLost",
            f"pod {pod.name} was unreachable for {limits.lost_node_timeout:g}s",
            attempt,
            now,
            limits,
        )
    if outcome is Outcome.DISRUPTED:
        assert pod is not None
        why = pod.disruption or "Preempted"
        return _disrupted(d, status, why, f"pod {pod.name} was disrupted ({why})", attempt, now, limits)
    if outcome is Outcome.GONE:
        return _disrupted(d, status, "PodDeleted", f"pod of attempt {attempt} was deleted", attempt, now, limits)
    # A crash.
    assert pod is not None
    restarts = int(status.get("restarts") or 0) + 1
    why = f"exit {pod.exit_code}" + (f" ({pod.terminated_reason})" if pod.terminated_reason else "")
    if restarts > spec.restartPolicy.maxRestarts:
        return _finish(
            d,
            FAILED,
            "BackoffLimitExceeded",
            f"attempt {attempt} crashed ({why}); {spec.restartPolicy.maxRestarts} restarts allowed",
            now,
            warning=True,
        )
    d.status["restarts"] = restarts  # counts restarts made, so it never exceeds maxRestarts
    delay = backoff(restarts, spec.restartPolicy.backoffSeconds, limits.max_backoff)
    if delay <= 0:
        d.events.append(("Warning", "BackOff", f"attempt {attempt} crashed ({why}); restarting now"))
        return _start(d, attempt + 1, now)
    d.status["nextAttemptTime"] = iso(now + timedelta(seconds=delay))
    return d.phase(PENDING, "BackOff", f"attempt {attempt} crashed ({why}); restarting in {delay:g}s", warning=True)


def _disrupted(
    d: Decision, status: dict[str, Any], reason: str, message: str, attempt: int, now: datetime, limits: Limits
) -> Decision:
    disruptions = int(status.get("disruptions") or 0) + 1
    d.status["disruptions"] = disruptions
    if disruptions > limits.max_disruptions:
        return _finish(
            d,
            FAILED,
            "DisruptionLimitExceeded",
            f"{message}; {limits.max_disruptions} disruptions allowed",
            now,
            warning=True,
        )
    d.events.append(("Warning", reason, f"{message}; rescheduling as attempt {attempt + 1}"))
    return _start(d, attempt + 1, now)


def _failed(d: Decision, pod: PodView | None, progress: Progress | None, now: datetime) -> Decision:
    # The runner writes one line to its termination log; with FallbackToLogsOnError the kubelet may hand
    # us the tail of the log instead, whose last line is the runner's "exit 5: <reason>" line.
    lines = [line for line in ((pod.termination_message if pod else None) or "").splitlines() if line.strip()]
    message = lines[-1].strip() if lines else ""
    if not message and progress is not None and progress.error:
        message = f"{progress.error.get('code')}: {progress.error.get('message')}"
    return _finish(d, FAILED, "RunFailed", message or "the runner failed permanently (exit 5)", now, warning=True)


def _superseded(d: Decision, pod: PodView | None, now: datetime) -> Decision:
    # The current attempt is this run's newest, so a fence means another AgentRun registered on the
    # thread after this one: retrying would be fenced again. The runner's line names the other run.
    lines = [line for line in ((pod.termination_message if pod else None) or "").splitlines() if line.strip()]
    message = lines[-1].strip() if lines else "another AgentRun owns this run's thread"
    return _finish(d, FAILED, "Superseded", message, now, warning=True)


def _finish(d: Decision, phase: str, reason: str, message: str, now: datetime, *, warning: bool = False) -> Decision:
    d.status.update(completionTime=iso(now), nextAttemptTime=None, lostSince=None)
    return d.phase(phase, reason, message, warning=warning)
