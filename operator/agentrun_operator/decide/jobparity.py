"""What a Kubernetes Job offers, for AgentRuns (pure): a deadline, a time to live, and retry without re-creating.

- ``spec.activeDeadlineSeconds``: the whole run, across attempts, counted
  from ``status.startTime`` (the first pod). Past it the current pod is
  deleted (gracefully: the runner checkpoints on SIGTERM) and the run is
  Failed ``DeadlineExceeded``. A pod that already ended with a final outcome
  (completed, failed, stopped, fenced) keeps it: the deadline ends runs that
  are still going, including one waiting in Interrupted for an answer, or in
  backoff for its next attempt. A run being stopped (``spec.stop``) ends
  Stopped as asked. Checked on every reconcile; the operator wakes the run
  at the deadline itself (``wake.next_wake`` schedules it), so no polling.
- ``spec.ttlSecondsAfterFinished``: a run that reached Succeeded, Failed or
  Stopped is deleted ``ttl`` seconds after ``status.completionTime`` (0: at
  once). Deleting an AgentRun removes its pods and keeps its thread data.
- ``spec.retry``: a counter the user bumps (``kubectl patch ar NAME --type
  merge -p '{"spec":{"retry":1}}'``, like Argo's retry). A Failed run whose
  ``spec.retry`` is above ``status.observedRetry`` is re-opened: restarts
  reset to 0, and the next attempt resumes the same turn (same request key),
  so completed tool calls replay from the ledger. Only Failed runs re-open;
  a Succeeded or Stopped run keeps its outcome (create a new run, with a new
  request, for a new turn).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from .classify import Outcome
from .reasons import TERMINAL, Phase
from .spec import AgentRunSpec
from .status import AgentRunStatus

# Outcomes a pod reached by itself: the deadline does not overrule them.
_ENDED = frozenset({Outcome.COMPLETED, Outcome.FAILED, Outcome.STOPPED, Outcome.SUPERSEDED, Outcome.INTERRUPTED})


def retry_requested(retry: int, status: AgentRunStatus) -> bool:
    """A Failed run whose ``spec.retry`` was bumped past the retry it last acted on."""
    return status.phase == Phase.FAILED and retry > status.observed_retry


RETRY_LIMIT = 1000  # the CRD's maximum of spec.retry
NEW_RUN = "apply a new AgentRun with the same threadId to continue the thread"


def next_retry(raw_spec: object, status: AgentRunStatus) -> int:
    """The ``spec.retry`` that re-opens a Failed run: one above both the spec's and the one acted on."""
    return max(retry_of(raw_spec), status.observed_retry) + 1


def retry_refusal(name: str, raw_spec: object, status: AgentRunStatus) -> str | None:
    """Why a retry (``kubectl agentrun retry``, the run page's Retry) cannot re-open the run, or None.

    Only a Failed run re-opens. A stop is one-way (the CRD refuses a retry of a run whose ``spec.stop`` is
    set), and a Succeeded run keeps its outcome: a new turn is a new AgentRun. A Failed run whose retry is
    already requested is not refused here: asking again is a no-op the caller reports as such."""
    phase = status.phase or Phase.PENDING
    stopped = isinstance(raw_spec, dict) and raw_spec.get("stop") is True
    if phase == Phase.STOPPED or (phase == Phase.FAILED and stopped):
        return (
            f"agentrun {name} was stopped (spec.stop is one-way): a retry cannot re-open it; {NEW_RUN}"
            if phase == Phase.STOPPED
            else f"agentrun {name} failed after a stop was requested (spec.stop is one-way): a retry cannot "
            f"re-open it; {NEW_RUN}"
        )
    if phase == Phase.SUCCEEDED:
        return f"agentrun {name} succeeded: there is nothing to retry (a new turn is a new AgentRun)"
    if phase != Phase.FAILED:
        return f"agentrun {name} has not failed (phase {phase}): only a Failed run can be retried"
    if not retry_requested(retry_of(raw_spec), status) and next_retry(raw_spec, status) > RETRY_LIMIT:
        return f"agentrun {name} was retried {RETRY_LIMIT} times (spec.retry's maximum); {NEW_RUN}"
    return None


def deadline(spec: AgentRunSpec, status: AgentRunStatus) -> datetime | None:
    """When ``spec.activeDeadlineSeconds`` runs out, or None (no deadline, or the run has not started)."""
    if spec.activeDeadlineSeconds is None or status.start_time is None:
        return None
    return status.start_time + timedelta(seconds=spec.activeDeadlineSeconds)


def deadline_exceeded(spec: AgentRunSpec, status: AgentRunStatus, outcome: Outcome, *, now: datetime) -> str | None:
    """The Failed message when the deadline ends the run now, else None."""
    due = deadline(spec, status)
    if due is None or now < due:
        return None
    if outcome in _ENDED and status.phase != Phase.INTERRUPTED:
        return None  # the pod's own outcome stands; the next reconcile records it
    started = status.start_time.strftime("%Y-%m-%dT%H:%M:%SZ") if status.start_time else "-"
    return (
        f"the run exceeded spec.activeDeadlineSeconds ({spec.activeDeadlineSeconds}s since {started}, "
        f"attempt {status.attempt})"
    )


def expires_at(ttl: int | None, status: AgentRunStatus) -> datetime | None:
    """When a finished run is deleted (``spec.ttlSecondsAfterFinished``), or None."""
    if ttl is None or status.phase not in TERMINAL or status.completion_time is None:
        return None
    return status.completion_time + timedelta(seconds=ttl)


def expired(ttl: int | None, status: AgentRunStatus, *, now: datetime) -> bool:
    """Whether the finished run's ``ttlSecondsAfterFinished`` has run out at ``now``."""
    due = expires_at(ttl, status)
    return due is not None and now >= due


def retry_of(raw_spec: object) -> int:
    """``spec.retry`` of a raw (unvalidated) spec: 0 unless it is a non-negative integer."""
    value = raw_spec.get("retry") if isinstance(raw_spec, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def ttl_of(raw_spec: object) -> int | None:
    """``spec.ttlSecondsAfterFinished`` of a raw spec (None when unset or not a non-negative integer)."""
    value = raw_spec.get("ttlSecondsAfterFinished") if isinstance(raw_spec, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
