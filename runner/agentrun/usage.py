"""Model usage of a turn: tokens by kind, requests and their wall time by status, per model; checkpointed.

A runner pod often ends before Prometheus scrapes it, so its own
``agentrun_model_*`` metrics are lower bounds. The model adapters therefore
also add every request to the running turn's ``ModelUsage``, which the engine
checkpoints with each step in meta ``model_usage``; the operator mirrors it
into ``status.modelUsage`` and counts its growth in
``agentrun_operator_model_*`` (aggregated by namespace and model), the same
path the tool-call counts take. The adapters record through
``agentrun.models.metering`` (the runner's metric and the turn, in one call).

Shape of meta ``model_usage`` (written only once a model was called, so
older readers and checkpoints stay as they were)::

    {"<model>": {"tokens": {"prompt": int, "completion": int},
                 "requests": {"ok": int, "error": int},
                 "seconds": {"ok": float, "error": float}}}

A request is one HTTP attempt of the OpenAI-compatible adapter (each retry is
its own request) or one call of a LangChain model (whose retries are the
provider's); ``ok`` means it answered with a usable completion, ``error``
anything else (an HTTP error status, a timeout, no connection, a body that
is not a completion). ``seconds`` is the requests' summed wall time.

LIMITS: the counts are per turn (a new turn on the thread starts at zero, as
the tool counts do) and cumulative across the turn's pods (a resume or a
reschedule continues them). Requests made by a step that never checkpointed
(its pod died mid-node) are lost with that step; the step runs again and its
new requests are counted, so a crashed run's totals are lower bounds. At
most ``MODELS_MAX`` model names are kept per turn; later ones count as
``other``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import TypedDict

META_KEY = "model_usage"
KINDS = ("prompt", "completion")
STATUSES = ("ok", "error")
MODELS_MAX = 16
OTHER_MODEL = "other"
MODEL_NAME_LIMIT = 128


class ModelCounts(TypedDict):
    """One model's usage: tokens by kind, requests by status, seconds by status."""

    tokens: dict[str, int]  # prompt, completion
    requests: dict[str, int]  # ok, error
    seconds: dict[str, float]  # ok, error


def _empty() -> ModelCounts:
    return {
        "tokens": dict.fromkeys(KINDS, 0),
        "requests": dict.fromkeys(STATUSES, 0),
        "seconds": dict.fromkeys(STATUSES, 0.0),
    }


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value < 0:
        return 0
    return value


@dataclass
class ModelUsage:
    """A turn's model usage, by model (see the module docstring); ``bool(usage)`` is whether any was recorded."""

    models: dict[str, ModelCounts] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.models)

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> ModelUsage:
        """From a checkpoint's meta; anything malformed reads as zero, never as an error."""
        usage = cls()
        raw = meta.get(META_KEY)
        if not isinstance(raw, Mapping):
            return usage
        for model, counts in raw.items():
            if not isinstance(counts, Mapping):
                continue
            entry = usage._entry(str(model))
            for group, keys in (("tokens", KINDS), ("requests", STATUSES), ("seconds", STATUSES)):
                values = counts.get(group)
                if isinstance(values, Mapping):
                    for key in keys:
                        entry[group][key] += _number(values.get(key))  # type: ignore[literal-required]
        return usage

    def as_dict(self) -> dict[str, Any]:
        """The meta ``model_usage`` value (JSON-ready; seconds rounded to microseconds)."""
        return {
            model: {
                "tokens": {k: int(counts["tokens"][k]) for k in KINDS},
                "requests": {s: int(counts["requests"][s]) for s in STATUSES},
                "seconds": {s: round(float(counts["seconds"][s]), 6) for s in STATUSES},
            }
            for model, counts in sorted(self.models.items())
        }

    def add_tokens(self, model: str, kind: str, count: int) -> None:
        """Count ``count`` tokens of ``kind`` (prompt, completion) for ``model``; other kinds are ignored."""
        if kind in KINDS and count > 0:
            self._entry(model)["tokens"][kind] += count

    def add_request(self, model: str, status: str, seconds: float) -> None:
        """Count one request to ``model`` and how long it took, by status (anything else than ok is an error)."""
        if status not in STATUSES:
            status = "error"
        entry = self._entry(model)
        entry["requests"][status] += 1
        entry["seconds"][status] += max(0.0, seconds)

    def _entry(self, model: str) -> ModelCounts:
        model = model[:MODEL_NAME_LIMIT] or "unknown"
        if model not in self.models and len(self.models) >= MODELS_MAX:
            model = OTHER_MODEL
        return self.models.setdefault(model, _empty())
