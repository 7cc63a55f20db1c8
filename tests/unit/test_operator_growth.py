"""The baseline rule (decide.growth), pure: the operator's counters take only what a run's status grew by.

Guarantees: a status written again, or read back by a restarted operator, adds nothing; a figure that went
down adds nothing (never a negative increment); malformed figures read 0; every model of the new status is
listed so its series exist at 0.
"""

from __future__ import annotations

import pytest

from agentrun_operator.decide.growth import ModelGrowth, model_usage_growth, tool_call_growth


@pytest.mark.parametrize(
    ("before", "after", "grown"),
    [
        ({}, {"executed": 2, "replayed": 1}, {"executed": 2, "replayed": 1}),
        ({"executed": 2, "replayed": 1}, {"executed": 2, "replayed": 1}, {}),
        (
            {"executed": 2},
            {"executed": 3, "inDoubt": 1, "unrecorded": 1},
            {"executed": 1, "in_doubt": 1, "unrecorded": 1},
        ),
        ({"executed": 5, "failed": 1}, {"executed": 1, "failed": 2}, {"failed": 1}),
        ({"executed": None}, {"executed": 0, "failed": None}, {}),
    ],
)
def test_tool_calls_count_only_what_the_status_grew_by(
    before: dict[str, int | None], after: dict[str, int | None], grown: dict[str, int]
) -> None:
    assert tool_call_growth(before, after) == grown


def _usage(model: str, prompt: object, ok: object, seconds: object) -> dict[str, object]:
    return {
        "model": model,
        "promptTokens": prompt,
        "completionTokens": 1,
        "requests": {"ok": ok, "error": 0},
        "requestSeconds": {"ok": seconds, "error": 0.0},
    }


def test_model_usage_counts_growth_per_model_never_less_than_nothing() -> None:
    before = [_usage("a", 10, 1, 0.5), _usage("b", 7, 3, 2.0)]
    after = [_usage("a", 25, 2, 0.75), _usage("b", 4, 3, 2.0), _usage("new", "x", -1, float("inf"))]
    grown = {g.model: g for g in model_usage_growth(before, after)}
    assert grown["a"] == ModelGrowth(
        "a", {"prompt": 15, "completion": 0}, {"ok": 1, "error": 0}, {"ok": 0.25, "error": 0}
    )
    assert set(grown["b"].tokens.values()) == {0} and set(grown["b"].requests.values()) == {0}, "b went down"
    assert grown["new"] == ModelGrowth(
        "new", {"prompt": 0, "completion": 1}, {"ok": 0, "error": 0}, {"ok": 0, "error": 0}
    )
    again = model_usage_growth(after, after)
    assert [g.model for g in again] == ["a", "b", "new"], "every model of the status is listed, grown or not"
    assert all(v == 0 for g in again for part in (g.tokens, g.requests, g.seconds) for v in part.values())
