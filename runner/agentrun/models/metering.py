"""What a model adapter reports about each request: the runner's ``agentrun_model_*`` metrics and the turn's usage.

One call per fact, so the pod's own metrics and the checkpointed
``ModelUsage`` (``agentrun.usage``) that the operator exports never disagree.
Outside a run (a model called from plain code) only the metrics count.
"""

from __future__ import annotations

from typing import Any

from ..context import current_run
from ..metrics import MODEL_REQUEST_SECONDS, MODEL_TOKENS
from ..usage import KINDS, ModelUsage


def _current() -> ModelUsage | None:
    ctx = current_run.get()
    return ctx.usage if ctx is not None else None


def record_tokens(model: str, kind: str, count: Any) -> None:
    """Count ``count`` tokens of ``kind`` (prompt, completion) for ``model``: the runner's metric and the turn.

    A count that is not a positive integer (some servers send none, or nonsense) counts nothing.
    """
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0 or kind not in KINDS:
        return
    MODEL_TOKENS.labels(model, kind).inc(count)
    if (usage := _current()) is not None:
        usage.add_tokens(model, kind, count)


def record_request(model: str, status: str, seconds: float) -> None:
    """One model request of ``model`` that ended ``status`` (ok, error) after ``seconds``: metric and turn."""
    MODEL_REQUEST_SECONDS.observe(seconds)
    if (usage := _current()) is not None:
        usage.add_request(model, status, seconds)
