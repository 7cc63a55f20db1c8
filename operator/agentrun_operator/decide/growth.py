"""What a written status adds to the operator's counters (pure): the baseline rule.

A run's ``status.toolCalls`` and ``status.modelUsage`` are its runner's running totals for the turn.
The operator counts in ``agentrun_operator_tool_calls_total`` and ``agentrun_operator_model_*`` only
how much they grew between the status before a write and the status written: the status is the
baseline, so a status written again, an operator that restarts or a new leader count nothing twice,
and a value that went down (it cannot, within one turn) counts nothing. ``io/metrics.py`` adds these
to its series once the status is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The counter's outcome label and the status.toolCalls key it counts.
TOOL_CALL_KEYS = (
    ("executed", "executed"),
    ("replayed", "replayed"),
    ("failed", "failed"),
    ("in_doubt", "inDoubt"),
    ("unrecorded", "unrecorded"),
)
TOOL_OUTCOMES = tuple(outcome for outcome, _ in TOOL_CALL_KEYS)
MODEL_TOKEN_KEYS = (("prompt", "promptTokens"), ("completion", "completionTokens"))
MODEL_STATUSES = ("ok", "error")


def tool_call_growth(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, int]:
    """How much each outcome of ``status.toolCalls`` (camelCase keys) grew, by outcome label; only growth."""
    grown = {outcome: int(after.get(key, 0) or 0) - int(before.get(key, 0) or 0) for outcome, key in TOOL_CALL_KEYS}
    return {outcome: count for outcome, count in grown.items() if count > 0}


@dataclass(frozen=True)
class ModelGrowth:
    """How much one model's usage grew: tokens by kind, requests and their seconds by status (each >= 0)."""

    model: str
    tokens: Mapping[str, float]
    requests: Mapping[str, float]
    seconds: Mapping[str, float]


def number(value: Any) -> float:
    """A usage figure as a count: malformed, negative or infinite values read 0."""
    try:
        found = float(value or 0)
    except (TypeError, ValueError):
        return 0.0
    return found if found > 0 and found != float("inf") else 0.0


def _grown(new: Any, old: Any) -> float:
    return max(0.0, number(new) - number(old))


def model_usage_growth(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> list[ModelGrowth]:
    """One ``ModelGrowth`` per model of ``after`` (``status.modelUsage`` items), against the same model before.

    Every model of ``after`` is listed, grown or not, so its series can be shown at 0 from the start.
    """
    seen = {str(item.get("model")): item for item in before}
    out: list[ModelGrowth] = []
    for item in after:
        old = seen.get(str(item.get("model")), {})
        requests, seconds = item.get("requests") or {}, item.get("requestSeconds") or {}
        old_requests, old_seconds = old.get("requests") or {}, old.get("requestSeconds") or {}
        out.append(
            ModelGrowth(
                model=str(item.get("model") or "unknown"),
                tokens={kind: _grown(item.get(key), old.get(key)) for kind, key in MODEL_TOKEN_KEYS},
                requests={s: _grown(requests.get(s), old_requests.get(s)) for s in MODEL_STATUSES},
                seconds={s: _grown(seconds.get(s), old_seconds.get(s)) for s in MODEL_STATUSES},
            )
        )
    return out
