"""Model usage outlives a short pod (issue 9): the store's usage -> status.modelUsage -> operator counters by delta.

The status is the baseline, as for the tool counts: a re-written status, or
an operator that restarts and reads it back, counts nothing twice.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agentrun.checkpoint.base import Progress
from agentrun.usage import ModelUsage as RunnerUsage
from agentrun_operator.decide.conditions import status_patch
from agentrun_operator.decide.decision import Decision
from agentrun_operator.decide.identity import mirror_turn
from agentrun_operator.decide.status import AgentRunStatus
from agentrun_operator.decide.usage import model_usage
from agentrun_operator.io import metrics

NOW = datetime(2026, 12, 4, 8, 0, tzinfo=UTC)


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def runner_meta(*requests: tuple[str, str, float], tokens: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    """Meta ``model_usage`` as the runner writes it (agentrun.usage), for model ``m``."""
    usage = RunnerUsage()
    for model, status, seconds in requests:
        usage.add_request(model, status, seconds)
    usage.add_tokens("m", "prompt", tokens[0])
    usage.add_tokens("m", "completion", tokens[1])
    return usage.as_dict()


def progress(usage: dict[str, Any], request_key: str = "ns/run/abc") -> Progress:
    return Progress(
        thread_id="ns/t",
        version=3,
        current_node="model",
        step=1,
        status="running",
        updated_at=NOW.timestamp(),
        request_key=request_key,
        model_usage=usage,
    )


def test_the_runner_s_usage_becomes_status_model_usage_for_this_run_s_turn_only() -> None:
    usage = runner_meta(("m", "ok", 1.23456), ("m", "error", 0.5), tokens=(100, 20))
    d = Decision()
    mirror_turn(d, status=AgentRunStatus(), progress=progress(usage), request_key="ns/run/abc")
    assert d.status["modelUsage"] == [
        {
            "model": "m",
            "promptTokens": 100,
            "completionTokens": 20,
            "requests": {"ok": 1, "error": 1},
            "requestSeconds": {"ok": 1.235, "error": 0.5},
        }
    ]
    other = Decision()
    mirror_turn(other, status=AgentRunStatus(), progress=progress(usage, "ns/earlier/def"), request_key="ns/run/abc")
    assert "modelUsage" not in other.status, "the previous run's usage on the thread is not this run's"
    none = Decision()
    mirror_turn(none, status=AgentRunStatus(), progress=progress({}), request_key="ns/run/abc")
    assert "modelUsage" not in none.status, "a run that called no model shows no modelUsage"


def test_malformed_usage_reads_as_zero_and_the_list_is_bounded() -> None:
    items = model_usage({"a": "junk", "b": {"tokens": {"prompt": "x", "completion": -4}, "seconds": {"ok": "nan?"}}})
    assert items == [
        {
            "model": "b",
            "promptTokens": 0,
            "completionTokens": 0,
            "requests": {"ok": 0, "error": 0},
            "requestSeconds": {"ok": 0.0, "error": 0.0},
        }
    ]
    many = {f"model-{i:02}": {"requests": {"ok": 1}} for i in range(40)}
    assert len(model_usage(many)) == 17


def test_an_unchanged_usage_is_not_written_again() -> None:
    items = model_usage(runner_meta(("m", "ok", 0.25), tokens=(5, 1)))
    current = AgentRunStatus.parse({"modelUsage": items})
    patch = status_patch(current, {"modelUsage": items}, now=NOW, generation=1)
    assert "modelUsage" not in patch, "the same usage must not cost a status write per reconcile"
    assert current.wire()["modelUsage"] == items


def test_operator_counters_grow_by_the_delta_of_status_model_usage_and_never_twice() -> None:
    ns = "usage-ns-a"
    first = model_usage(runner_meta(("m", "ok", 1.0), ("m", "error", 0.25), tokens=(100, 20)))
    later = model_usage(runner_meta(("m", "ok", 1.0), ("m", "error", 0.25), ("m", "ok", 2.0), tokens=(250, 45)))
    metrics.model_usage_seen(ns, [], first)
    metrics.model_usage_seen(ns, first, later)
    metrics.model_usage_seen(ns, later, later)  # re-written status, or a restarted operator reading it back
    assert sample("agentrun_operator_model_tokens_total", namespace=ns, model="m", kind="prompt") == 250
    assert sample("agentrun_operator_model_tokens_total", namespace=ns, model="m", kind="completion") == 45
    assert sample("agentrun_operator_model_requests_total", namespace=ns, model="m", status="ok") == 2
    assert sample("agentrun_operator_model_requests_total", namespace=ns, model="m", status="error") == 1
    assert sample("agentrun_operator_model_request_seconds_total", namespace=ns, model="m", status="ok") == 3.0
    assert sample("agentrun_operator_model_request_seconds_total", namespace=ns, model="m", status="error") == 0.25


def test_a_model_s_series_exist_at_zero_once_it_is_seen_and_a_shrinking_value_counts_nothing() -> None:
    ns = "usage-ns-b"
    only_errors = model_usage(runner_meta(("m", "error", 0.5)))
    metrics.model_usage_seen(ns, [], only_errors)
    assert sample("agentrun_operator_model_tokens_total", namespace=ns, model="m", kind="prompt") == 0
    assert sample("agentrun_operator_model_requests_total", namespace=ns, model="m", status="ok") == 0
    assert sample("agentrun_operator_model_request_seconds_total", namespace=ns, model="m", status="ok") == 0
    metrics.model_usage_seen(ns, only_errors, model_usage({}))  # cannot happen in one turn; never negative
    metrics.model_usage_seen(ns, model_usage(runner_meta(("m", "error", 9.0))), only_errors)
    assert sample("agentrun_operator_model_requests_total", namespace=ns, model="m", status="error") == 1


def test_model_labels_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics.model_usage_seen("usage-ns-c", [], model_usage(runner_meta(("known", "ok", 0.1))))
    monkeypatch.setattr(metrics, "MODEL_LABELS_MAX", len(metrics._model_labels))
    metrics.model_usage_seen("usage-ns-c", [], model_usage(runner_meta(("one-too-many", "ok", 0.1))))
    assert sample("agentrun_operator_model_requests_total", namespace="usage-ns-c", model="other", status="ok") == 1
    assert (
        sample("agentrun_operator_model_requests_total", namespace="usage-ns-c", model="one-too-many", status="ok")
        is None
    )
    metrics.model_usage_seen("usage-ns-c", [], model_usage(runner_meta(("known", "ok", 0.1))))
    assert sample("agentrun_operator_model_requests_total", namespace="usage-ns-c", model="known", status="ok") == 2
