"""Tool failures made visible (pure): counters, the ``ToolErrors`` condition, a Warning Event, the metric's input.

A tool that raises (or times out) becomes a tool error message for the model,
as in LangGraph's ToolNode, so the run itself may still succeed; these keep
that from going unnoticed (issue 14):

- ``status.toolCalls.failed`` and ``inDoubt`` from the store's counters
  (written only when non-zero, like a Job's counters);
- condition ``ToolErrors`` True with the last failed call's tool, error code
  and message (the store bounds the message; never the call's arguments, so
  no secret an argument carried reaches status);
- one Warning Event ``ToolError`` per reconcile in which ``failed`` grew (not
  one per call: a run with a thousand failing calls posts at most one Event
  per status mirror);
- ``Decision.tool_failures``: the failures newly seen, by tool, for the
  operator's counter. The store keeps only the LAST error, so when several
  calls failed between two reconciles all of them count for the last one's
  tool (the total is exact, the split by tool is approximate).

``spec.config.failOnToolError`` makes the runner fail the run instead (exit 5,
``TOOL_ERROR_001``), which ``messages.REASON_BY_CODE`` turns into reason ``ToolError``.

Where people look (issue 32: "failed tools look like success"): ``status.toolSummary`` (``summary``),
the ``Tools`` column of ``kubectl get ar``, reads "3 failed" where the counts alone sat unseen in
``describe``; ``kubectl agentrun watch``, the history list and the run page say a Succeeded run with
failed calls as "Succeeded with 3 failed tool calls" (``phase_words``), a warning, not a failure: the
phase stays Succeeded (the model got each error and finished; ``failOnToolError`` is the way to fail).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .decision import Decision
from .reasons import Reason
from .status import AgentRunStatus, ToolCalls

CONDITION = "ToolErrors"
MESSAGE_LIMIT = 512
UNKNOWN_TOOL = "unknown"


def tool_call_counts(counts: Mapping[str, Any]) -> ToolCalls:
    """``status.toolCalls`` from the store's counters (keys executed, replayed, failed, in_doubt)."""
    out: ToolCalls = {"executed": _count(counts, "executed"), "replayed": _count(counts, "replayed")}
    if failed := _count(counts, "failed"):
        out["failed"] = failed
    if in_doubt := _count(counts, "in_doubt"):
        out["inDoubt"] = in_doubt
    if unrecorded := _count(counts, "unrecorded"):
        out["unrecorded"] = unrecorded
    return out


def _count(counts: Mapping[str, Any], key: str) -> int:
    try:
        return max(0, int(counts.get(key) or 0))
    except (TypeError, ValueError):
        return 0


def describe(error: Mapping[str, Any] | None) -> tuple[str, str]:
    """(tool, "tool CODE: message") of a recorded tool error, bounded and on one line."""
    if not error:
        return UNKNOWN_TOOL, ""
    tool = str(error.get("tool") or UNKNOWN_TOOL)
    code = str(error.get("code") or "").strip()
    message = " ".join(str(error.get("message") or "").split())
    text = f"{tool} {code}: {message}" if code else f"{tool}: {message}"
    return tool, text[:MESSAGE_LIMIT]


def observe(
    d: Decision, *, status: AgentRunStatus, counts: Mapping[str, Any], last_error: Mapping[str, Any] | None
) -> None:
    """Set the condition, the Event and the metric input of ``d`` from the store's tool counters."""
    failed = _count(counts, "failed")
    if failed <= 0:
        return
    seen = status.tool_calls.get("failed", 0) if status.tool_calls else 0
    tool, last = describe(last_error)
    calls = "call" if failed == 1 else "calls"
    summary = f"{failed} tool {calls} failed" + (f"; last: {last}" if last else "")
    d.condition(CONDITION, True, Reason.TOOL_ERROR, summary)
    if failed > seen:
        d.tool_failures[tool] = failed - seen
        d.event(Reason.TOOL_ERROR, f"{failed - seen} more failed (in all: {summary})", warning=True)


def summary(calls: Mapping[str, Any] | None) -> str:
    """``status.toolSummary``, the ``Tools`` column: "2 run, 1 replayed, 3 failed" (only the non-zero
    outcomes, failures never left out; "none" before any call). The parts are disjoint, as the counters are:
    a failed call is not counted as run."""
    calls = calls or {}
    parts = [
        f"{n} {word}"
        for key, word in (
            ("executed", "run"),
            ("replayed", "replayed"),
            ("failed", "failed"),
            ("inDoubt", "in doubt"),
            ("unrecorded", "unrecorded"),
        )
        if (n := _count(calls, key))
    ]
    return ", ".join(parts) or "none"


def failure_words(calls: Mapping[str, Any] | None) -> str:
    """ "3 failed tool calls" ("1 failed tool call"), or "" when none failed."""
    failed = _count(calls or {}, "failed")
    return f"{failed} failed tool call{'s' if failed != 1 else ''}" if failed else ""


def phase_words(phase: str | None, calls: Mapping[str, Any] | None) -> str:
    """The phase as people read it: "Succeeded with 3 failed tool calls" when calls failed, else the phase."""
    phase = phase or "Pending"
    failures = failure_words(calls)
    return f"{phase} with {failures}" if failures else phase
