"""``status.attempts``: a bounded history of a run's pods (pure), so ``kubectl agentrun describe`` needs no store.

Like Argo's ``status.nodes`` or a Job's pod history, kept in the object itself:
one entry per attempt (the newest ``KEPT`` only), with its pod, when it
started and ended, and how it ended (``outcome``, the exit code, the
kubelet's or the cluster's reason and the runner's one-line message).

An entry is opened when the operator creates the attempt's pod (``opened``;
named from the run's name when ``decide`` knows it, else at the next reconcile),
follows the pod while it runs and is closed once, when the pod ends, is
deleted, or the run ends while the pod still runs (a forced stop, a
deadline): a closed entry is never rewritten, so a pod that disappears later
does not change how its attempt ended.

HAZARD: the history is only as complete as the operator's reconciles. A pod
that started and ended between two of them is seen ended, never running; an
operator that was down while an attempt came and went cannot know it; and an
attempt's start is when its pod was created, not when its process started.
"""

from __future__ import annotations

import signal
from datetime import datetime
from typing import cast

from .classify import LIVE, Outcome, PodView
from .decision import Decision
from .messages import human
from .podspec import pod_name
from .reasons import TERMINAL
from .status import AgentRunStatus, AttemptRecord, iso

KEPT = 20
MESSAGE_LIMIT = 256

# How an attempt ended (or where it is), as ``status.attempts[].outcome`` says it.
OUTCOME_WORDS: dict[Outcome, str] = {
    Outcome.PENDING: "Pending",
    Outcome.RUNNING: "Running",
    Outcome.COMPLETED: "Completed",
    Outcome.INTERRUPTED: "Interrupted",
    Outcome.STOPPED: "Stopped",
    Outcome.FAILED: "Failed",
    Outcome.DISRUPTED: "Disrupted",
    Outcome.CRASHED: "Crashed",
    Outcome.LOST: "NodeLost",
    Outcome.SUPERSEDED: "Superseded",
    Outcome.CONFIG_ERROR: "ConfigError",
    Outcome.START_ERROR: "StartError",
    Outcome.STORE_UNAVAILABLE: "StoreUnavailable",
    Outcome.TERMINATING: "Terminating",
    Outcome.GONE: "Deleted",
}
# The words of an attempt that is not over; any other outcome closes the entry for good.
OPEN = frozenset(OUTCOME_WORDS[o] for o in (*LIVE, Outcome.RUNNING))

# The kubelet's words for any exit: "Error" for every non-zero code (a run waiting for spec.resume, a
# stop on request, a crash alike), "Completed" for 0. They say nothing of what happened, so an attempt's
# reason names it instead; a specific word (OOMKilled, StartError, the cluster's eviction reason) is kept.
KUBELET_GENERIC = frozenset({"Error", "Completed"})
REASON_WORDS: dict[Outcome, str] = {
    Outcome.COMPLETED: "Completed",
    Outcome.INTERRUPTED: "WaitingForResume",
    Outcome.STOPPED: "Stopped",
    Outcome.FAILED: "RunFailed",
    Outcome.DISRUPTED: "Preempted",  # exit 6 without the cluster's reason: SIGTERM, checkpointed
    Outcome.CRASHED: "Crashed",
    Outcome.SUPERSEDED: "Superseded",
    Outcome.STORE_UNAVAILABLE: "StoreUnavailable",
}


def is_open(entry: AttemptRecord) -> bool:
    """Whether the attempt is still going (no outcome that ends it, no ``endTime``)."""
    return entry.get("outcome", "Pending") in OPEN and "endTime" not in entry


def opened(attempt: int, *, pod: str | None, now: datetime) -> AttemptRecord:
    """The entry of an attempt whose pod is being created."""
    entry = AttemptRecord(attempt=attempt, startTime=iso(now), outcome="Pending")
    if pod:
        entry["podName"] = pod
    return entry


def _observed(
    entry: AttemptRecord, pod: PodView | None, outcome: Outcome, *, now: datetime, crash_message: str | None = None
) -> AttemptRecord:
    """``entry`` as the current pod shows it: still open, or closed with how it ended (``crash_message``:
    why an exit 0 was a crash)."""
    out = AttemptRecord(**entry)
    if pod is not None and not out.get("podName"):
        out["podName"] = pod.name
    word = OUTCOME_WORDS[outcome]
    if outcome is Outcome.GONE and entry.get("outcome") == OUTCOME_WORDS[Outcome.TERMINATING] and entry.get("reason"):
        # Seen ending by a disruption (an eviction, a drain), then gone before its last status was seen: the
        # operator counted a disruption, so the history says so too, not a plain deletion (a real node, CI).
        word = OUTCOME_WORDS[Outcome.DISRUPTED]
    out["outcome"] = word
    if word in OPEN:
        if pod is not None and pod.disruption:  # remembered for the case above
            out["reason"] = pod.disruption
        return out
    out["endTime"] = iso(pod.finished_at if pod is not None and pod.finished_at is not None else now)
    if pod is not None:
        if pod.exit_code is not None:
            out["exitCode"] = pod.exit_code
        reason = pod.disruption or _ended_reason(pod.terminated_reason, outcome) or pod.waiting_reason
        if reason:
            out["reason"] = reason
        message = human(pod.termination_message) or (pod.waiting_message or "")
        if outcome is Outcome.CRASHED and pod.exit_code is not None and pod.exit_code > 128:
            # Killed by a signal: the runner wrote no line, and a log tail (FallbackToLogsOnError) is no reason.
            message = f"killed by {_signal_name(pod.exit_code - 128)}"
        if outcome is Outcome.CRASHED and crash_message:
            # An exit 0 before the turn completed: the kubelet's "Completed" beside outcome Crashed would
            # contradict it; the operator's reason (what the store holds) says why it is a crash.
            out.pop("reason", None)
            message = crash_message
        if message:
            out["message"] = message[:MESSAGE_LIMIT]
    return out


def _ended_reason(kubelet: str | None, outcome: Outcome) -> str | None:
    """Why an attempt ended: the kubelet's word when it says something (OOMKilled), else what happened."""
    if kubelet and kubelet not in KUBELET_GENERIC:
        return kubelet
    return REASON_WORDS.get(outcome, kubelet)


def _signal_name(number: int) -> str:
    try:
        return f"{signal.Signals(number).name} (signal {number})"
    except ValueError:
        return f"signal {number}"


def _replaced(entry: AttemptRecord, decision: Decision, *, now: datetime) -> AttemptRecord:
    """An open entry whose attempt the operator gave up for a new one while its pod was not seen ending (a
    pod Terminating or on a lost node past the lost-node timeout): disrupted, closed now, never left open."""
    out = AttemptRecord(**entry)
    out["endTime"] = iso(now)
    was = out.get("outcome")
    out["outcome"] = OUTCOME_WORDS[Outcome.DISRUPTED]
    out["reason"] = str(decision.reschedule_reason or was or "Replaced")
    out["message"] = f"given up while {was or 'pending'}; attempt {decision.create_attempt} replaces it"[:MESSAGE_LIMIT]
    return out


def _closed_by_run(entry: AttemptRecord, decision: Decision, *, now: datetime) -> AttemptRecord:
    """An open entry of a run that ended while its pod still ran (a forced stop, a deadline, a spec error)."""
    out = AttemptRecord(**entry)
    out["endTime"] = iso(now)
    out["outcome"] = str(decision.status.get("phase") or "Ended")
    if reason := decision.status.get("reason"):
        out["reason"] = str(reason)
    if message := decision.status.get("message"):
        out["message"] = str(message)[:MESSAGE_LIMIT]
    return out


def track(
    decision: Decision,
    *,
    status: AgentRunStatus,
    pod: PodView | None,
    outcome: Outcome,
    now: datetime,
    run_name: str | None = None,
    crash_message: str | None = None,
) -> None:
    """Write ``status.attempts`` into ``decision`` when the history changes (the current attempt's pod moved,
    the run ended, or a new attempt starts); ``outcome`` is the current attempt's (``classify(pod)``, CRASHED
    for an exit 0 before the turn completed, with ``crash_message`` saying so) and ``run_name`` names the pod
    of a new attempt (``podspec.pod_name``)."""
    history: list[AttemptRecord] = [cast(AttemptRecord, dict(e)) for e in status.attempts]
    current = status.attempt
    if current and not any(e.get("attempt") == current for e in history):
        # Not seen created (an operator from before status.attempts, or a write that was lost): from its pod.
        history.append(AttemptRecord(attempt=current, outcome="Pending"))
        if status.pod_name:
            history[-1]["podName"] = status.pod_name
    for i, entry in enumerate(history):
        if entry.get("attempt") != current or not is_open(entry):
            continue
        if not entry.get("podName") and status.pod_name:  # written with the attempt, by the reconciler
            entry["podName"] = status.pod_name
        entry = _observed(entry, pod, outcome, now=now, crash_message=crash_message)
        ends_run = decision.status.get("phase") in TERMINAL and decision.create_attempt is None
        if is_open(entry) and ends_run:
            entry = _closed_by_run(entry, decision, now=now)
        elif is_open(entry) and decision.create_attempt is not None:
            entry = _replaced(entry, decision, now=now)
        history[i] = entry
    if decision.create_attempt is not None:
        history = [e for e in history if e.get("attempt") != decision.create_attempt]
        pod_of = pod_name(run_name, decision.create_attempt) if run_name else None
        history.append(opened(decision.create_attempt, pod=pod_of, now=now))
    history = history[-KEPT:]
    if history != status.attempts:
        decision.status["attempts"] = history
