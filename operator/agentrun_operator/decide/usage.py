"""``status.modelUsage`` from the store's progress (pure): a run's model usage, by model, as its runner checkpointed it.

The runner keeps a turn's usage in meta ``model_usage`` (``agentrun.usage``:
tokens by kind, requests and their wall time by status, per model, summed
over every pod of the turn). The operator mirrors it here, and once the
status is written counts its growth in ``agentrun_operator_model_*``
(``decide.growth``, added by ``io.metrics``), exactly as ``status.toolCalls`` feeds
``agentrun_operator_tool_calls_total``: the status is the baseline, so an
operator that restarts (or a new leader) counts only what grew after the
last written status, never a run's whole usage again.

Only the run's own turn is mirrored (``identity.mirror_turn``): between a
pod's creation and its first checkpoint the thread's latest turn is the
previous run's, whose usage is not this run's. Nor is a recorded outcome
(``AlreadyCompleted``) given the earlier run's usage: that run's operator
counted it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from typing_extensions import TypedDict

KINDS = ("prompt", "completion")
STATUSES = ("ok", "error")
MODELS_MAX = 17  # the runner keeps 16 names per turn, then "other" (agentrun.usage.MODELS_MAX)
MODEL_NAME_LIMIT = 128


class ByStatus(TypedDict):
    """A value per request status: ok and error."""

    ok: Any
    error: Any


class ModelUsage(TypedDict):
    """One item of ``status.modelUsage``."""

    model: str
    promptTokens: int
    completionTokens: int
    requests: ByStatus  # int counts
    requestSeconds: ByStatus  # summed wall time, rounded to milliseconds


def _count(values: Any, key: str) -> int:
    try:
        return max(0, int(values.get(key) or 0)) if isinstance(values, Mapping) else 0
    except (TypeError, ValueError):
        return 0


def _seconds(values: Any, key: str) -> float:
    try:
        value = float(values.get(key) or 0.0) if isinstance(values, Mapping) else 0.0
    except (TypeError, ValueError):
        return 0.0
    return round(value, 3) if value > 0 and value != float("inf") else 0.0


def model_usage(usage: Mapping[str, Any] | None) -> list[ModelUsage]:
    """``status.modelUsage`` from meta ``model_usage``: one item per model, sorted by name; malformed parts read 0."""
    out: list[ModelUsage] = []
    for model, counts in sorted((usage or {}).items())[:MODELS_MAX]:
        if not isinstance(counts, Mapping):
            continue
        tokens, requests, seconds = counts.get("tokens"), counts.get("requests"), counts.get("seconds")
        out.append(
            {
                "model": str(model)[:MODEL_NAME_LIMIT],
                "promptTokens": _count(tokens, "prompt"),
                "completionTokens": _count(tokens, "completion"),
                "requests": {"ok": _count(requests, "ok"), "error": _count(requests, "error")},
                "requestSeconds": {"ok": _seconds(seconds, "ok"), "error": _seconds(seconds, "error")},
            }
        )
    return out
