"""A turn has an identity: the request key, and what an AgentRun does whose request was already answered (pure).

The request key names one turn on a thread (issue 14; Stripe's idempotency
keys, Temporal's workflow id reuse policy):

- ``spec.requestId`` when set, used as is;
- else ``<namespace>/<name>/`` + the first 16 hex digits of the SHA-256 of
  ``spec.input`` as canonical JSON (keys sorted, no whitespace, UTF-8).

So ``kubectl delete`` then ``kubectl apply`` of the same manifest (what a
GitOps re-sync or a person "retrying" does) is the same request; a new turn
needs a new ``requestId``, a new input or a new AgentRun name.

Before the FIRST pod of a run the operator reads the key's turn
(``ControlStore.aget_turn``):

- completed: phase Succeeded, reason ``AlreadyCompleted``, ``status.result``,
  ``stateVersion`` and ``toolCalls`` from the turn (shown, not counted again
  in the metrics: the earlier run's operator did), an Event naming the
  earlier run and when it completed; no pod;
- failed or stopped: the recorded outcome (Failed with the recorded error's
  reason and message, or Stopped); no pod. ``spec.retry`` re-opens it, and
  a re-opened run skips this check: its pod resumes the failed turn;
- running or interrupted, or no turn: the thread rule (``decide.thread``),
  then the first pod; the runner resumes an unfinished turn of the key.

A turn the same AgentRun (same uid) recorded is its own work, never an
"earlier run": an operator that restarted after creating the first pod but
before writing status adopts that pod as usual.

LIMIT: this check reads the store once, before the first pod. The runner
applies the same rule when it starts (a completed key is not run again), so
a run that raced past the check (two AgentRuns with one key created at the
same instant) still does not repeat the side effects.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agentrun.checkpoint.base import Progress

from . import toolerrors
from .decision import Decision
from .messages import reason_for
from .reasons import Phase, Reason
from .status import AgentRunStatus, ResultInfo, iso
from .toolerrors import CONDITION as TOOL_ERRORS
from .toolerrors import tool_call_counts
from .usage import model_usage

DIGEST_CHARS = 16


def request_key(*, namespace: str, name: str, request_id: str | None, input: Mapping[str, Any] | None) -> str:
    """The request key of an AgentRun (the rule in the module docstring)."""
    if request_id:
        return request_id
    canonical = json.dumps(input, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return f"{namespace}/{name}/{hashlib.sha256(canonical.encode('utf-8', 'surrogatepass')).hexdigest()[:DIGEST_CHARS]}"


@dataclass(frozen=True)
class RecordedTurn:
    """What the decision needs of the store's ``Turn`` (``agentrun.checkpoint.base.Turn`` has these fields)."""

    request_key: str
    status: str  # running, interrupted, completed, stopped, failed
    version: int
    run_uid: str | None = None
    updated_at: float = 0.0
    error: Mapping[str, Any] | None = None
    result: Mapping[str, Any] | None = None
    tool_calls: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, turn: Any) -> RecordedTurn:
        """From a store ``Turn`` (duck-typed, so this module depends on no store code)."""
        return cls(
            request_key=str(turn.request_key),
            status=str(turn.status),
            version=int(turn.version),
            run_uid=turn.run_uid,
            updated_at=float(turn.updated_at or 0.0),
            error=turn.error,
            result=turn.result,
            tool_calls=dict(turn.tool_calls or {}),
        )


def result_status(result: Mapping[str, Any] | None) -> ResultInfo | None:
    """``status.result`` from a turn's result (``agentrun.result``: the last assistant message, else the final
    state's values as JSON), cut by the runner, with its digest and kind."""
    if not result:
        return None
    out: ResultInfo = {"message": str(result.get("message") or "")[:1024], "digest": str(result.get("digest") or "")}
    if result.get("truncated"):
        out["truncated"] = True
    if result.get("kind") in ("message", "state"):  # agentrun.result's rule; absent from older runners' results
        out["kind"] = result["kind"]
    return out


def _when(turn: RecordedTurn) -> str:
    return iso(datetime.fromtimestamp(turn.updated_at, UTC)) if turn.updated_at else "an earlier time"


def recorded_outcome(turn: RecordedTurn | None, *, run_uid: str, retried: bool, now: datetime) -> Decision | None:
    """The decision for a run whose request already has an outcome in the store, or None to go on as usual.

    ``retried``: the run was re-opened with ``spec.retry`` (a recorded failure is then resumed, not repeated).
    """
    if turn is None or turn.run_uid == run_uid or turn.status in ("running", "interrupted"):
        return None
    if turn.status == "failed" and retried:
        return None
    earlier = f"AgentRun uid {turn.run_uid or 'unknown'}"
    d = Decision()
    d.status["stateVersion"] = turn.version
    d.status["toolCalls"] = tool_call_counts(turn.tool_calls)
    d.status["toolSummary"] = toolerrors.summary(d.status["toolCalls"])
    d.recorded_counts = True
    d.status["completionTime"] = iso(now)
    if failed := d.status["toolCalls"].get("failed"):
        # The earlier run's failures: shown, not counted again (its own Events and metric did that).
        d.condition(TOOL_ERRORS, True, Reason.TOOL_ERROR, f"{failed} tool calls failed in the recorded turn")
    if turn.status == "completed":
        d.status["result"] = result_status(turn.result)
        message = (
            f"request {turn.request_key} already completed by {earlier} at {_when(turn)} "
            f"(state version {turn.version}); not run again: a new turn needs a new spec.requestId or input"
        )
        return d.phase(Phase.SUCCEEDED, Reason.ALREADY_COMPLETED, message)
    if turn.status == "failed":
        error = turn.error or {}
        code, text = error.get("code"), error.get("message") or "the turn failed"
        recorded = f"{code}: {text}" if code else str(text)
        message = (
            f"{recorded} (request {turn.request_key} failed in {earlier} at {_when(turn)}; "
            "not run again: bump spec.retry to resume it)"
        )
        return d.phase(Phase.FAILED, reason_for(recorded), message[:1024], warning=True)
    message = f"request {turn.request_key} was stopped in {earlier} at {_when(turn)}; not run again"
    return d.phase(Phase.STOPPED, Reason.STOPPED, message)


def mirror_turn(d: Decision, *, status: AgentRunStatus, progress: Progress | None, request_key: str) -> None:
    """Tool counters, model usage, tool errors and the result of this run's turn from the store's progress.

    Only when the progress is this run's turn: between a pod's creation and its first checkpoint the
    thread's latest turn is the previous one, whose failures and answer are not this run's.
    """
    if progress is None or (progress.request_key and request_key and progress.request_key != request_key):
        return
    d.status["toolCalls"] = tool_call_counts(progress.tool_calls)
    d.status["toolSummary"] = toolerrors.summary(d.status["toolCalls"])
    if usage := model_usage(progress.model_usage):
        d.status["modelUsage"] = usage
    if progress.status == "completed" and (result := result_status(progress.result)):
        d.status["result"] = result
    toolerrors.observe(d, status=status, counts=progress.tool_calls, last_error=progress.last_tool_error)
